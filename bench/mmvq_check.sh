#!/usr/bin/env bash
# A change to decode's mat-vec, checked in one call (session 20): llama.cpp builds (prep) while every
# kernel compiles (WARM) and the mat-vec's tests run; then the mat-vec alone (TYPES, SHAPES: kernels.py
# --models), ncu on Q6_K's ffn_down, and issue 15's table for MODELS beside llama-bench.
cd "$(dirname "$0")/.."
MODELS="${MODELS:-7b 8b}" bash bench/device.sh prep > "$OUT/prep.log" 2>&1
WARM=1 TESTS="-n 8 tests/cuda/test_mmvq.py tests/cuda/test_moe_device.py tests/cuda/test_fused_ops.py tests/cuda/test_attn_decode.py" \
  TEST_LIMIT=240 bash bench/device.sh tests 2>&1 | tail -4
MODELS=${SHAPES:-7b} TYPES=${TYPES:-Q4_K,Q6_K,Q8_0} bash bench/device.sh matvec 2>&1 | tail -8
timeout 120 ncu --clock-control none --kernel-name regex:mmvq --section SpeedOfLight --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats \
  python3 bench/mmvq_once.py --types Q6_K > "$OUT/ncu-mmvq-q6k.txt" 2>&1
grep -E "Duration|DRAM Through|L1/TEX Cache|Issued Warp|Executed Instructions  " "$OUT/ncu-mmvq-q6k.txt"
LENGTHS=1,16 MODELS="${MODELS:-7b 8b}" bash bench/device.sh latency 2>&1 | grep -v Warn | tail -16
