#!/bin/bash
# Next session's first call (session 42's plan): what the x layout (xlayout.cuh) gives a decode
# step, end to end: bench/decode_gap.py back to back (depth 100, medians of 3 rounds of 200 steps)
# on the 7B (W16 plan) and the 0.5B (MMQ plan), with the layout and without it
# (xlayout_revert.patch: the kernels as at 89665cc^), in turns on one machine; and the mat-vecs
# of five types alone, the same way.
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.devcarry/cupy_cache
# the files device.sh's prep makes, without the llama.cpp build it starts beside (no build while timing)
[ -f /tmp/q7b.gguf ] || python3 -m minferd.cli synth --arch qwen2 --preset 7b --quant q4_k_m --random-blocks /tmp/q7b.gguf
[ -f /tmp/q05b.gguf ] || python3 -m minferd.cli synth --arch qwen2 --preset 0.5b --quant q4_k_m --random-blocks /tmp/q05b.gguf
for v in layout order layout order; do
  [ $v = order ] && git apply bench/results/s42/xlayout_revert.patch
  for m in "q7b w16" "q05b mmq"; do
    set -- $m
    echo "# $v $1 $2" | tee -a "$OUT/xlayout-decode.log"
    timeout 150 python3 bench/decode_gap.py /tmp/$1.gguf --path $2 --tokens 200 --rounds 3 2>&1 \
      | grep -v Warn | tee -a "$OUT/xlayout-decode.log" | tail -2
  done
  # the 32-element types gain nothing from the layout (their x loads never crossed a line) and
  # pay xq_block_pos a unit step (sass_diff: Q4_0 / Q5_0 +16-24 instructions, some instances +8
  # registers): timed alone, with and without it
  echo "# $v matvec" >> "$OUT/xlayout-matvec.log"
  timeout 150 python3 bench/kernels.py --types Q8_0,Q5_0,Q4_0,Q6_K,Q4_K --models 7b,0.5b --ns 1 --no-dequant 2>&1 \
    | grep -v Warn | grep -A7 "GB/s (% of copy" >> "$OUT/xlayout-matvec.log"
  [ $v = order ] && git apply -R bench/results/s42/xlayout_revert.patch
done
# Q6_K's 16-position units (mmvq.WIDE_UNITS, used at K <= 4096 only) beside the 8-position ones at
# every 7B shape, the layout on: does ffn_down (K = 18944) want them now that x is a line a block?
timeout 120 python3 bench/kernels.py --types Q6_K --models 7b --ns 1 --no-dequant --wide 2>&1 | grep -v Warn \
  > "$OUT/xlayout-q6k-wide.log"
tail -12 "$OUT/xlayout-decode.log" "$OUT/xlayout-matvec.log" "$OUT/xlayout-q6k-wide.log"
