#!/bin/bash
# Session 43, call 1: session 42's planned A/B of the x layout (decode end to end, mat-vecs alone),
# then the cache comes back for the next call.
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/gpu.txt"
export CUPY_CACHE_DIR=$PWD/.devcarry/cupy_cache
timeout 560 bash bench/results/s42/xlayout_decode_ab.sh
git diff --stat | tail -1
tar -C "$CUPY_CACHE_DIR" -czf "$OUT/cupy_cache.tgz" . ; ls -la "$OUT"
