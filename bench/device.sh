#!/usr/bin/env bash
# One call on the GPU machine: install the carried wheels, run tests/cuda, synthesize the
# Qwen2.5-7B-shaped Q4_K_M file (llama.cpp's type mix, random blocks) and bench it. Logs to $OUT.
#   [TESTS="tests/cuda/test_x.py ..."] bench/device.sh [tests|bench|profile|all] [extra bench.py args]
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/minferd-out}; mkdir -p "$OUT"
stage=${1:-all}; shift || true
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
if [ "$stage" = tests ] || [ "$stage" = all ]; then
  python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/cuda} 2>&1 | tee "$OUT/cuda.log" | tail -40
fi
if [ "$stage" = bench ] || [ "$stage" = all ]; then
  python3 -m minferd.cli synth --arch qwen2 --preset 7b --quant q4_k_m --random-blocks /tmp/q7b.gguf
  python3 bench/bench.py /tmp/q7b.gguf --device cuda --paths w16,mmq,fused_b -p 512,2048 -n 128 -r 3 \
    --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log"
fi
if [ "$stage" = profile ] || [ "$stage" = all ]; then
  [ -f /tmp/q7b.gguf ] || python3 -m minferd.cli synth --arch qwen2 --preset 7b --quant q4_k_m --random-blocks /tmp/q7b.gguf
  python3 bench/profile_ops.py /tmp/q7b.gguf --path w16 --tokens ${PROFILE_TOKENS:-1,512,2048} --json "$OUT/profile-w16.json" 2>&1 | tee "$OUT/profile.log"
fi
