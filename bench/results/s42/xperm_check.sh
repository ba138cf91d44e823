#!/bin/bash
# Session 42: the x block layout (xlayout.cuh) on the device: every kernel warmed, the tests of
# its writers and readers, then the 7B's decode mat-vecs timed as bench/results/s42/call5 did.
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WARM=1 TESTS='-n 8 tests/cuda/test_mmvq.py tests/cuda/test_fused_ops.py tests/cuda/test_attn_decode.py tests/cuda/test_moe_device.py tests/cuda/test_chain.py tests/cuda/test_mmvq_one_plane.py' \
  bench/device.sh tests > /dev/null 2>&1
cp "$OUT/cuda.log" "$OUT/cuda-kernels.log"; grep -E "passed|failed|FAILED|ERROR|warmup" "$OUT/cuda-kernels.log" "$OUT/warmup.log" | tail -15
export PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=$PWD/.devcarry/cupy_cache
timeout 100 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short tests/cuda/test_engine_cuda.py 2>&1 | tee "$OUT/cuda-engine.log" | tail -6
timeout 60 python3 bench/chain_probe.py --graph-only --rounds 3 2>&1 | grep -E "^#|^graph" | tee "$OUT/graph.log"
