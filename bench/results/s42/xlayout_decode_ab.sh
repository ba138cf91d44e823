#!/bin/bash
# Next session's first call (session 42's plan): what the x layout (xlayout.cuh) gives a decode
# step, end to end: bench/decode_gap.py back to back (depth 100, medians of 3 rounds of 200 steps)
# on the 7B (W16 plan) and the 0.5B (MMQ plan), with the layout and without it
# (xlayout_revert.patch: the kernels as at 89665cc^), in turns on one machine.
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODELS="7b 05b" bench/device.sh prep > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.devcarry/cupy_cache
for v in layout order layout order; do
  [ $v = order ] && git apply bench/results/s42/xlayout_revert.patch
  for m in "q7b w16" "q05b mmq"; do
    set -- $m
    echo "# $v $1 $2" | tee -a "$OUT/xlayout-decode.log"
    timeout 150 python3 bench/decode_gap.py /tmp/$1.gguf --path $2 --tokens 200 --rounds 3 2>&1 \
      | grep -v Warn | tee -a "$OUT/xlayout-decode.log" | tail -2
  done
  [ $v = order ] && git apply -R bench/results/s42/xlayout_revert.patch
done
