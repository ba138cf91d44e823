#!/bin/bash
# Session 42's A/B: the decode mat-vecs' x loads with x's 32-element blocks stored evens first in
# each super-block ([0 2 4 6 1 3 5 7]: xperm_probe.patch changes the readers only, so the products
# are garbage and only the times count), against today's, in turns, on one machine. The patch
# applies on fd50eb3, before the layout itself landed (xlayout.cuh).
cd "$(dirname "$0")/../../.."
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.devcarry/cupy_cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
for v in base perm base perm; do
  [ $v = perm ] && git apply bench/results/s42/xperm_probe.patch
  echo "# $v" | tee -a "$OUT/xperm.log"
  timeout 150 python3 bench/kernels.py --types Q4_K,Q6_K --models 7b,0.5b --ns 1 --no-dequant 2>&1 | grep -v Warn >> "$OUT/xperm.log"
  timeout 100 python3 bench/chain_probe.py --graph-only --rounds 3 2>&1 | grep -E "^graph" | tee -a "$OUT/xperm.log"
  [ $v = perm ] && git apply -R bench/results/s42/xperm_probe.patch
done
cat "$OUT/xperm.log"
