#!/bin/bash
# Ran at commit 7e1865b; the probe (mmvq_xs.cu / .py, bench/xs_probe.py, tests/cuda/test_mmvq_xs.py) lost and went after it.
# Session 43: the x-stationary probe (tests, then timed against mmvq at the 7B's shapes), then the
# register ring's A/B on the mat-vecs alone (ring_ab.sh, no decode), within one call.
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.devcarry/cupy_cache
x=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
timeout 150 python3 -m pytest $x -q tests/cuda/test_mmvq_xs.py 2>&1 | tail -15 | tee "$OUT/xs-test.log"
timeout 200 python3 bench/xs_probe.py --types Q4_K,Q6_K --models 7b 2>&1 | grep -v Warn | tee "$OUT/xs-probe.log"
[ $SECONDS -lt 330 ] && DECODE= VARIANTS="base ring base ring" timeout $((560 - SECONDS)) bash bench/results/s43/ring_ab.sh \
  > "$OUT/ring-ab.out" 2>&1
tail -30 "$OUT/ring-matvec.log" 2>/dev/null
tar -C "$CUPY_CACHE_DIR" -czf "$OUT/cupy_cache.tgz" . ; ls -la "$OUT"
