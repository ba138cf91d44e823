#!/bin/bash
# Next session's first call (session 42's plan): what the x layout (xlayout.cuh) gives a decode
# step, end to end: bench/decode_gap.py back to back (depth 100, medians of 3 rounds of 200 steps)
# on the 7B (W16 plan) and the 0.5B (MMQ plan), with the layout and without it
# (xlayout_revert.patch: the kernels as at 89665cc^), in turns on one machine.
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
  [ $v = order ] && git apply -R bench/results/s42/xlayout_revert.patch
done
