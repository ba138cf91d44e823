#!/bin/bash
# For a later session (not run in 44): Q4_0's leads after its walk landed. (1) every n = 1 variant of
# Q4_0 at the 7B's and 0.5B's shapes, now that the KW = 1 ones walk x in stored order (a walking
# (4, 1, 2, 1) may beat the K-split (4, 2, 2, 1) the mid and wide classes take); (2) the 2-column
# bucket walking too (q40walk_nc2.patch, applied and reverted in turns: nc2 / head / nc2 / head).
# One call, ~4 min on a warm cache (carry .whl and .devcarry).
cd "$(dirname "$0")/../../.."
. bench/device_env.sh
timeout 200 python3 bench/kernels.py --types Q4_0 --models 7b,0.5b --ns 1 --no-dequant --sweep 2>&1 | grep -v Warn \
  | tee "$OUT/q40-sweep.log" | tail -20
for v in nc2 head nc2 head; do
  [ $v = nc2 ] && git apply bench/results/s44/q40walk_nc2.patch
  echo "# $v" >> "$OUT/q40-nc2.log"
  timeout 100 python3 bench/kernels.py --types Q4_0 --models 7b,0.5b --ns 2 --no-dequant 2>&1 | grep -v Warn \
    | grep -A4 "GB/s (% of copy" >> "$OUT/q40-nc2.log"
  [ $v = nc2 ] && git apply -R bench/results/s44/q40walk_nc2.patch
done
cat "$OUT/q40-nc2.log"
tar -C "$CUPY_CACHE_DIR" -czf "$OUT/cupy_cache.tgz" . 2>/dev/null
