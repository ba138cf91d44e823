#!/bin/bash
# Session 45, after call 2 (loads-only graph 1.900 ms against 2.010: the load pattern, not the
# arithmetic, is most of what separates mmvq from the stream reader's 1.509): which mmvq geometry
# streams best with no arithmetic? Base (default configs, arithmetic on), then every SWEEP config
# under mmvq_loads_only.patch, at the 7B's Q4_K / Q6_K shapes (bench/kernels.py, n = 1).
cd "$(dirname "$0")/../../.."
. bench/device_env.sh
timeout 100 python3 bench/kernels.py --types Q4_K,Q6_K --models 7b --ns 1 --no-dequant 2>&1 | grep -v Warn \
  > "$OUT/base-matvec.log"
git apply bench/results/s45/mmvq_loads_only.patch
timeout 200 python3 bench/kernels.py --types Q4_K,Q6_K --models 7b --ns 1 --no-dequant --sweep 2>&1 | grep -v Warn \
  > "$OUT/loads-sweep.log"
git apply -R bench/results/s45/mmvq_loads_only.patch
tail -30 "$OUT/base-matvec.log"; tail -40 "$OUT/loads-sweep.log"
