#!/bin/bash
# Session 45, after call 1's floor rows (read wait 1.509 ms against the mat-vec graph's 1.978): is
# what mmvq_rows loses to a plain reader its load pattern or its arithmetic? mmvq_loads_only.patch
# keeps every weight load of mmvq_rows (same grid, units, headers, trips) and folds the loaded
# words into the sum instead of decoding them and reading x. chain_probe --graph-only times the 7B's
# decode mat-vec graph with and without it, in turns (base / loads / base / loads).
cd "$(dirname "$0")/../../.."
. bench/device_env.sh
for v in base loads base loads; do
  [ $v = loads ] && git apply bench/results/s45/mmvq_loads_only.patch
  echo "# $v" >> "$OUT/loads-only.log"
  timeout 120 python3 bench/chain_probe.py --graph-only --rounds 3 2>&1 | grep -v Warn | grep -E "^graph" >> "$OUT/loads-only.log"
  [ $v = loads ] && git apply -R bench/results/s45/mmvq_loads_only.patch
done
cat "$OUT/loads-only.log"
tar -C "$CUPY_CACHE_DIR" -czf "$OUT/cupy_cache.tgz" . 2>/dev/null
