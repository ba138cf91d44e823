#!/bin/bash
# Session 43: 32-element types walk x in stored order (xq_block_at; walk.patch is that change). Tests
# first (test_mmvq with it, the run-ahead file with the counts fix), then the mat-vecs alone and the
# 0.5B's decode step with and without it, in turns (walk / head / walk / head).
cd "$(dirname "$0")/../../.."
. bench/device_env.sh
timeout 200 python3 -m pytest $x -q tests/cuda/test_mmvq.py tests/cuda/test_run_ahead_cuda.py tests/cuda/test_chain.py 2>&1 \
  | grep -v "Warn\|warner" | tail -6 | tee "$OUT/walk-tests.log"
[ -f /tmp/q05b.gguf ] || python3 -m minferd.cli synth --arch qwen2 --preset 0.5b --quant q4_k_m --random-blocks /tmp/q05b.gguf
for v in walk head walk head; do
  [ $v = head ] && git apply -R bench/results/s43/walk.patch
  echo "# $v matvec" >> "$OUT/walk-matvec.log"
  timeout 100 python3 bench/kernels.py --types Q8_0,Q5_0,Q4_0 --models 7b,0.5b --ns 1 --no-dequant 2>&1 \
    | grep -v Warn | grep -A4 "GB/s (% of copy" >> "$OUT/walk-matvec.log"
  echo "# $v q05b mmq" >> "$OUT/walk-decode.log"
  timeout 100 python3 bench/decode_gap.py /tmp/q05b.gguf --path mmq --tokens 200 --rounds 3 2>&1 | grep -v Warn \
    | tail -2 >> "$OUT/walk-decode.log"
  [ $v = head ] && git apply bench/results/s43/walk.patch
done
cat "$OUT/walk-matvec.log" "$OUT/walk-decode.log"
