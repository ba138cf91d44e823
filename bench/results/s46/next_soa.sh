#!/bin/bash
# For a later session (not run in 46): would Q4_K rows stored as their headers first, then their
# quant runs (a row-local repack at upload, the same bytes and row size) let the unit walk keep its
# block-aligned arithmetic and still load like the stream reader? q4k_soa_probe.patch addresses a
# row that way (unit u of block b: header at 16 b, quants at 16 nb + 128 b + 16 u): a warp's quant
# load is then 512 consecutive bytes and its header load one 64-byte run, where today's are four
# 128-byte runs 144 apart and four headers on four lines. The bench's weights are random bytes, so
# the sums are garbage and the timing is real. Graph (chain_probe --graph-only) and the Q4_K kernels
# at the 7B's shapes, in turns base / soa / base / soa. ~2 min on the carried cache (T=240: a fresh machine compiles, each step may take that long).
cd "$(dirname "$0")/../../.."
git apply --check bench/results/s46/q4k_soa_probe.patch || exit 1
. bench/device_env.sh
for v in base soa base soa; do
  [ $v = soa ] && git apply bench/results/s46/q4k_soa_probe.patch
  echo "# $v" >> "$OUT/soa.log"
  timeout ${T:-60} python3 bench/chain_probe.py --graph-only --rounds 3 2>&1 | grep -E "^graph" >> "$OUT/soa.log"
  timeout ${T:-60} python3 bench/kernels.py --types Q4_K --models 7b --ns 1 --no-dequant 2>&1 | grep -E "^mmvq" >> "$OUT/soa.log"
  [ $v = soa ] && git apply -R bench/results/s46/q4k_soa_probe.patch
done
cat "$OUT/soa.log"
tar -C "$CUPY_CACHE_DIR" -czf "$OUT/cupy_cache.tgz" . 2>/dev/null
