#!/bin/bash
# Runs on a tree with bench/results/s46/q4k_words.patch applied (the path went after this call).
# Session 46, after call 1 (the word walk lost: 7B decode 2.512 / 2.516 -> 2.690 / 2.696 ms a token).
# (1) Is it the header shuffles? words_hdrload.patch: every lane loads its block's header (the unit
# walk's header pattern) beside its contiguous word, no shuffle. The Q4_K kernels at the 7B's
# shapes, both walks (kernels.py --wide), with and without it, and the graph with it.
# (2) s45's loads-only probes on the unit walk (main's mmvq.cu: its patches apply there): the
# mat-vec graph in turns base / loads / nohdr / contig, twice.
cd "$(dirname "$0")/../../.."
. bench/device_env.sh
for v in shfl hdrload; do
  [ $v = hdrload ] && git apply bench/results/s46/words_hdrload.patch
  echo "# words $v" >> "$OUT/words2.log"
  timeout 60 python3 bench/kernels.py --types Q4_K --models 7b --ns 1 --no-dequant --wide 2>&1 | grep -E "^mmvq|^  wide" >> "$OUT/words2.log"
  MINFERD_PENDING=q4k_words timeout 60 python3 bench/chain_probe.py --graph-only --rounds 3 2>&1 | grep -E "^graph" >> "$OUT/words2.log"
  [ $v = hdrload ] && git apply -R bench/results/s46/words_hdrload.patch
done
cat "$OUT/words2.log"
cp minferd/kernels/mmvq.cu /tmp/mmvq.cu.now
for v in base loads nohdr contig base loads nohdr contig; do
  git show f553b7f:minferd/kernels/mmvq.cu > minferd/kernels/mmvq.cu
  case $v in loads) git apply bench/results/s45/mmvq_loads_only.patch ;; nohdr) git apply bench/results/s45/mmvq_loads_nohdr.patch ;;
    contig) git apply bench/results/s45/mmvq_loads_contig.patch ;; esac
  echo "# $v" >> "$OUT/loads-graph.log"
  timeout 60 python3 bench/chain_probe.py --graph-only --rounds 3 2>&1 | grep -E "^graph" >> "$OUT/loads-graph.log"
done
cp /tmp/mmvq.cu.now minferd/kernels/mmvq.cu
cat "$OUT/loads-graph.log"
tar -C "$CUPY_CACHE_DIR" -czf "$OUT/cupy_cache.tgz" . 2>/dev/null
