#!/bin/bash
# Session 45, after call 2 (loads-only graph 1.900 ms against 2.010: the load pattern, not the
# arithmetic, is most of what separates mmvq from the stream reader's 1.509). (1) The 7B's mat-vec
# graph in turns: base / loads (mmvq_loads_only.patch) / nohdr (the same, and Q4_K units skip their
# 16-byte header load: mmvq_loads_nohdr.patch; in SASS the (4, 2, 2, 1) loop's weight loads 12 -> 6,
# its trips unrolled 3 deep in both) / contig (a Q4_K row read as its 9 16-byte words a block,
# headers among them, a warp's lanes on 512 consecutive bytes as the stream reader's: every byte
# of the row once, the same bytes as base and loads; mmvq_loads_contig.patch). (2) Which mmvq geometry streams best with no arithmetic:
# base (default configs, arithmetic on), then every SWEEP config under the loads-only patch, at
# the 7B's Q4_K / Q6_K shapes (bench/kernels.py, n = 1). ~3 min on the carried cache.
cd "$(dirname "$0")/../../.."
. bench/device_env.sh
for v in base loads nohdr contig base loads nohdr contig; do
  case $v in loads) git apply bench/results/s45/mmvq_loads_only.patch ;; nohdr) git apply bench/results/s45/mmvq_loads_nohdr.patch ;;
    contig) git apply bench/results/s45/mmvq_loads_contig.patch ;; esac
  echo "# $v" >> "$OUT/loads-graph.log"
  timeout 90 python3 bench/chain_probe.py --graph-only --rounds 3 2>&1 | grep -E "^graph" >> "$OUT/loads-graph.log"
  git checkout -q minferd/kernels
done
cat "$OUT/loads-graph.log"
timeout 100 python3 bench/kernels.py --types Q4_K,Q6_K --models 7b --ns 1 --no-dequant 2>&1 | grep -v Warn \
  > "$OUT/base-matvec.log"
git apply bench/results/s45/mmvq_loads_only.patch
timeout 200 python3 bench/kernels.py --types Q4_K,Q6_K --models 7b --ns 1 --no-dequant --sweep 2>&1 | grep -v Warn \
  > "$OUT/loads-sweep.log"
git checkout -q minferd/kernels
tail -30 "$OUT/base-matvec.log"; tail -40 "$OUT/loads-sweep.log"
tar -C "$CUPY_CACHE_DIR" -czf "$OUT/cupy_cache.tgz" . 2>/dev/null
