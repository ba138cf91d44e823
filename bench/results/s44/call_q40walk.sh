#!/bin/bash
# Session 44: Q4_0's one-column, one-warp-a-row shapes (KW = 1: tall, huge) walk x in stored order
# (bench/results/s44/q40walk.patch is that change, applied in the tree that travels). Its tests first, then
# the mat-vecs alone and a Q4_0 7B's and 0.5B's decode step with and without it, in turns.
cd "$(dirname "$0")/../../.."
. bench/device_env.sh
timeout 150 python3 -m pytest $x -q tests/cuda/test_mmvq.py -k "Q4_0" 2>&1 | grep -v "Warn\|warner" | tail -4 | tee "$OUT/walk-tests.log"
[ -f /tmp/q7b40.gguf ] || python3 -m minferd.cli synth --arch qwen2 --preset 7b --quant q4_0 --random-blocks /tmp/q7b40.gguf
[ -f /tmp/q05b40.gguf ] || python3 -m minferd.cli synth --arch qwen2 --preset 0.5b --quant q4_0 --random-blocks /tmp/q05b40.gguf
for v in walk head walk head; do
  [ $v = head ] && git apply -R bench/results/s44/q40walk.patch
  echo "# $v matvec" >> "$OUT/walk-matvec.log"
  timeout 100 python3 bench/kernels.py --types Q4_0 --models 7b,0.5b --ns 1 --no-dequant 2>&1 \
    | grep -v Warn | grep -A4 "GB/s (% of copy" >> "$OUT/walk-matvec.log"
  for m in 7b40:w16 05b40:mmq; do
    echo "# $v q${m%:*} ${m#*:}" >> "$OUT/walk-decode.log"
    timeout 100 python3 bench/decode_gap.py /tmp/q${m%:*}.gguf --path ${m#*:} --tokens 200 --rounds 3 2>&1 | grep -v Warn \
      | tail -2 >> "$OUT/walk-decode.log"
  done
  [ $v = head ] && git apply bench/results/s44/q40walk.patch
done
cat "$OUT/walk-matvec.log" "$OUT/walk-decode.log"
tar -C "$CUPY_CACHE_DIR" -czf "$OUT/cupy_cache.tgz" . 2>/dev/null
