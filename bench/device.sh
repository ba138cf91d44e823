#!/usr/bin/env bash
# One call on the GPU machine: install the carried wheels, then the stages asked for. Logs to $OUT.
#   [TESTS='tests/cuda/test_x.py -k "a or b" ...'] bench/device.sh [tests|bench|profile|kernels|all] [extra bench.py args]
#   tests    tests/cuda (or $TESTS)
#   bench    the synthetic Qwen2.5-7B-shaped Q4_K_M file (llama.cpp's type mix, random blocks),
#            every prefill path side by side, and each no-copy kernel alone (bench/bench.py)
#   profile  per-kernel time of a decode token and a 2048-token prefill (bench/profile_ops.py)
#   kernels  the kernel benches (MMQ, FUSED_B) and the prefill gate table (bench/crossover.py --table)
#   prep     for the next call on the warm machine: llama.cpp built in a process that outlives the call,
#            MODELS / MOE_MODELS synthesized into /tmp
#   pending  the tests of backend/pending.py's waiting paths (kernels written without a GPU)
#   matvec   the decode mat-vec's GB/s and % of the copy ceiling at the 7B's and 0.5B's shapes (bench/kernels.py)
#   chain    tests/cuda/test_chain.py, then bench/chain_probe.py: the 7B's decode mat-vecs as a graph of launches
#            against one persistent launch (kernels/chain.cu), in turns
#   xplanes  the same with MINFERD_X_PLANES=1 (one int8 plane of x) beside the default two
#   mmq      one look at the MMQ kernel: its tests, every tile config timed, the whole model on it
#   probe    the MMQ kernel with parts left out (bench/mmq_probe.py), and ncu's stall reasons
#   verify   tests/cuda, then the bench (w16, mmq) beside llama-bench on the same file (carry .llama)
#   batch    tests/cuda, then where a decode step of 1-64 sequences goes (bench/profile_ops.py --batch)
#            and every kernel at 1-64 columns on the 7B shapes (bench/crossover.py)
#   small    mmq_small's and tcgemv's tests, then each timed in graphs beside cuBLAS (bench/mmq_small.py);
#            NCU=1 adds ncu's stall reasons for tcgemv (bench/tc_once.py); CLIENTS=16,64 serve.py's
#            rounds, once per TC_CONFIGS="base cl" (MINFERD_TCGEMV_CONFIG)
#   tc       tcgemv alone: its tests, every K split of the 7B's shapes timed (bench/tc_splits.py; TYPES, NS,
#            MODELS), and ncu's stall ratios on the 7B's gate matrix at 16 and 8 tokens
#   gates    the gate table's 8-64-token rows re-timed (bench/crossover.py --merge), and ncu on decode's Q4_K / Q6_K mat-vec;
#            MODELS=0.5b TYPES=Q4_K,Q6_K,Q5_0,Q8_0 NS=1,2,4,8,16,32,64,128,256,512,1024,2048 adds the 0.5B's shapes (every n:
#            a shape's own rows decide all its batches)
#   cold     issue 15's cold start: minferd warmup into an empty kernel cache, then the 7B's first token
#            from that cache, and the first token without warmup (an empty cache again), each timed
#   latency  issue 15's table: bench/latency.py (TTFT by prompt length, single-stream decode through a
#            real daemon) on the 0.5B, 7B and 8B files (MODELS="05b 7b 8b") beside llama-bench built in the
#            same call (carry .llama); TESTS first while it builds (TESTS=all: tests/cuda); AB="MINFERD_PDL=0 MINFERD_PDL=1"
#            repeats each model once per setting (VAR=value, several joined by +, or taskset=CPUS: client and daemon pinned); TTFT_TOKENS=16: a chat stream's TTFT;
#            REPS=25: prompts a length (default 5; an A/B of the host's share needs many: s26 call 4);
#            HOPS=1: bench/rpc_hops.py first (a thread wake, and grpc's sync and aio servers' hand-offs);
#            HOST_LOAD=16: that many busy loops on the host through the timed runs (llama.cpp's columns too);
#            GATES=Q6_K: on an H200, those types' gate rows re-timed first and the table run on them ($OUT/gates.txt);
#            END=420: no model started past that many seconds (a one-call plan inside the tool's limit)
#   (PENDING=1: the pending stage's tests first in the latency and moe stages, while llama.cpp builds)
#   turns    a pending path's decode in turns against it off (bench/decode_gap.py, the 7B W16 and the 0.5B MMQ;
#            TURNS="off qkv_rope off qkv_rope"; TESTS first where given)
#   moe      issue 17's bench: the synthetic qwen3moe 30b-a3b (Q4_K_M; MOE_MODELS="30b 20b" adds gpt-oss 20b)
#            pp2048 / tg128 per plan (bench.py)
#            beside llama-bench on the same file (carry .llama), and `minferd plan` at a budget
#            that holds the dense class's f16 copy and one that does not (BUDGETS; 80 and 23 GiB for the 30b, 80 and 16 for the 20b);
#            AB="MINFERD_DEVICE_MOE=0 MINFERD_DEVICE_MOE=1" benches once per setting; LLAMA=0 skips llama.cpp;
#            WHILE_BUILD="cmd" runs cmd while llama.cpp builds (its output in moe-plan.log)
#   serve    tests/cuda, decode at depth and N concurrent clients through a real daemon (bench/serve.py),
#            beside llama-bench -d and llama-batched-bench on the same file (carry .llama); AB: serve.py per setting
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/minferd-out}; mkdir -p "$OUT"
# CuPy's compiled kernels (keyed by source, options and NVRTC): a fresh machine spends minutes
# compiling them. Carry .devcarry/cupy_cache (untar $OUT/cupy_cache.tgz there; gzip keeps it under the 16 MiB a file may come back as) to skip that.
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.devcarry/cupy_cache}
# CUPY_CACHE_DIR=/tmp/cupy-fresh (empty on a fresh machine): what comes back then holds only today's
# kernels, the way to prune the carried cache, which only grows. WARM=1: `minferd warmup` first,
# every kernel part compiled 8 at a time (~33 s cold), where the stages would compile them in turn.
mkdir -p "$CUPY_CACHE_DIR"
# At most 8 files come back: the cupy cache, llama.cpp's binary parts (bench/llama_bin.sh) and the
# call's own run.log travel as they are; past 8 in all, every other file travels in one logs.tgz.
pack() {
  tar -C "$CUPY_CACHE_DIR" -czf "$OUT/cupy_cache.tgz" . 2>/dev/null; ls -la "$OUT/cupy_cache.tgz"
  local rest; rest=$(cd "$OUT" && ls | grep -v -e '^cupy_cache\.tgz$' -e '^llama-bin\.' -e '^run\.log$' -e '^logs\.tgz$')
  if [ "$(ls "$OUT" | wc -l)" -gt 8 ] && [ -n "$rest" ]; then
    tar -C "$OUT" -czf "$OUT/logs.tgz" $rest && (cd "$OUT" && rm -f $rest)
  fi
}
trap pack EXIT
[ -n "${WARM:-}" ] && { /usr/bin/time -f "warmup %e s wall" python3 -m minferd.cli warmup --device cuda 2>&1 | tail -3 | tee "$OUT/warmup.log"; }
stage=${1:-all}; shift || true
want() { [ "$stage" = "$1" ] || [ "$stage" = all ]; }
# llama.cpp in the background (carry .llama), its pid in $build: a warm machine keeps /tmp, so a second
# call has it; else the binaries a build of an earlier call packed into .llama (bench/llama_bin.sh:
# seconds, not the 4-6 minutes of a build); else built, and packed into $OUT for the next call
# (`bash bench/llama_bin.sh fetch FILES_AT` here). LLAMA=0: none (the stages then leave llama.cpp's
# columns out).
llama_bg() {
  if [ "${LLAMA:-1}" = 0 ]; then (exit 1) &
  elif [ -x /tmp/llama/build/bin/llama-bench ]; then (exit 0) &
  elif bash bench/llama_bin.sh unpack 2>&1 | tee "$OUT/llama-build.log"; [ "${PIPESTATUS[0]}" = 0 ]; then (exit 0) &
  elif [ -f /tmp/llama-build.started ]; then  # the prep stage's build: wait for its exit status
    (for _ in $(seq 400); do [ -f /tmp/llama-build.rc ] && break; sleep 2; done; [ -x /tmp/llama/build/bin/llama-bench ]) &
  else (bash .llama/llama_cpp.sh build >> "$OUT/llama-build.log" 2>&1 \
          && bash bench/llama_bin.sh pack "$OUT" >> "$OUT/llama-build.log" 2>&1; [ -x /tmp/llama/build/bin/llama-bench ]) &
  fi; build=$!
}
synth() { [ -f /tmp/q$1.gguf ] || python3 -m minferd.cli synth --arch $2 --preset $3 --quant q4_k_m --random-blocks /tmp/q$1.gguf; }
# The gate table's 8-64-token rows ($NS) of types $1 at models $2's shapes re-timed in graphs and merged
# into a copy of the committed table at $3 (copy it back where its picks win); more args go to
# crossover.py; LIMIT: seconds it may take.
regate() {
  local types=$1 models=$2 table=$3; shift 3
  cp minferd/backend/prefill_gates_h200.json "$table"
  timeout ${LIMIT:-100000} python3 bench/crossover.py --graph --types "$types" --models "$models" --ns ${NS:-8,16,32,64} \
    --reps 10 --merge "$table" "$@"
}
q7b() { synth 7b qwen2 7b; }
q05b() { synth 05b qwen2 0.5b; }
q8b() { synth 8b llama 8b; }
# MOE_MODELS: 30b (qwen3moe 30b-a3b, Q4_K_M) and / or 20b (gpt-oss 20b, MXFP4 experts).
synth_moe() {
  case $1 in
    30b) [ -f /tmp/q30b.gguf ] || python3 -m minferd.cli synth --arch qwen3moe --preset 30b-a3b --quant q4_k_m --random-blocks /tmp/q30b.gguf;;
    20b) [ -f /tmp/q20b.gguf ] || python3 -m minferd.cli synth --arch gpt-oss --preset 20b --quant q8_0 --random-blocks /tmp/q20b.gguf;;
  esac
}
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
# tests/cuda (or $TESTS) within $1 seconds in all: the kernel tests in 8 processes where pytest-xdist came
# in .whl, then, alone on the GPU, those that read its free memory or run whole engines.
SERIAL="tests/cuda/test_engine_cuda.py tests/cuda/test_foreign_memory.py tests/cuda/test_pool_scenario.py"
cuda_tests() {
  local args="-q -p no:cacheprovider --durations=8 -rfE --tb=short"
  if [ -n "${TESTS:-}" ]; then
    # Shell words, quotes kept: TESTS='tests/cuda/test_x.py -k "a or b"' (s34: split on spaces, the
    # -k ran nothing)
    local targs; eval "targs=($TESTS)"
    timeout -s INT "$1" python3 -m pytest $args "${targs[@]}" 2>&1 | tee "$OUT/cuda.log" | tail -25; return
  fi
  local par=() xd=""
  for f in tests/cuda/test_*.py; do case " $SERIAL " in *" $f "*) ;; *) par+=("$f");; esac; done
  python3 -c "import xdist" 2>/dev/null && xd="-n 8"
  # -v: each result on its own line, so a run cut short by its timeout still names its failures
  # (s11: xdist's INTERNALERROR on the interrupt printed no summary).
  { timeout -s INT $(($1 * 2 / 3)) python3 -m pytest $args ${xd:+-v} $xd "${par[@]}"
    timeout -s INT $(($1 / 3)) python3 -m pytest $args $SERIAL; } \
    2>&1 | tee "$OUT/cuda.log" | grep -E "passed|failed|error|FAILED|ERROR" | tail -25
}
# backend/pending.py's waiting paths: their own tests (each path's list in pending.PATHS), within $1
# seconds. A pass lets the next commit take the names out of pending.PATHS. PENDING=1 runs them in the
# latency and moe stages too, while llama.cpp builds.
pending_tests() {
  local files names
  files=$(python3 -c "from minferd.backend import pending; print(' '.join(pending.tests()[0]))")
  names=$(python3 -c "from minferd.backend import pending; print(' or '.join(pending.tests()[1]))")
  [ -n "$files" ] || { echo "no pending paths" | tee "$OUT/pending.log"; return; }
  timeout -s INT "$1" python3 -m pytest -q -p no:cacheprovider -rfE --tb=short --durations=5 $files -k "$names" \
    2>&1 | tee "$OUT/pending.log" | tail -15
}
if want tests; then
  cuda_tests ${TEST_LIMIT:-540}
fi
if want bench; then
  q7b
  python3 bench/bench.py /tmp/q7b.gguf --device cuda --paths w16,mmq,mmq@mmq,mmq@fused_b,mmq@tiles -p 512,2048 -n 128 -r 3 \
    --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log"
fi
if want profile; then
  q7b
  python3 bench/profile_ops.py /tmp/q7b.gguf --path w16 --tokens ${PROFILE_TOKENS:-1,512,2048} --json "$OUT/profile-w16.json" 2>&1 | tee "$OUT/profile.log"
  for p in mmq fused_b; do
    python3 bench/profile_ops.py /tmp/q7b.gguf --path $p --tokens 2048 --top 15 --json "$OUT/profile-$p.json" 2>&1 | tee -a "$OUT/profile.log"
  done
fi
if [ "$stage" = mmq ]; then
  timeout -s INT 200 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short tests/cuda/test_mmq.py 2>&1 | tee "$OUT/mmq-tests.log" | tail -15
  python3 bench/mmq.py --configs --types Q4_K,Q6_K --json "$OUT/mmq.json" 2>&1 | tee "$OUT/mmq.log"
  q7b
  python3 bench/bench.py /tmp/q7b.gguf --device cuda --paths mmq@mmq,mmq -p 2048 -n 0 -r 3 --json "$OUT/bench-mmq.json" 2>&1 | tee "$OUT/bench-mmq.log"
fi
if [ "$stage" = probe ]; then
  python3 bench/mmq_probe.py --type Q4_K 2>&1 | tee "$OUT/probe.log"
  python3 bench/mmq_probe.py --type Q6_K --shape 2048,3584,18944 2>&1 | tee -a "$OUT/probe.log"
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -n "$NCU" ] && timeout 240 "$NCU" --clock-control none --kernel-name regex:mmq_gemm --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section LaunchStats \
    python3 bench/mmq_probe.py --type Q4_K --once --ablate 0 --configs big,wide2,tall2 > "$OUT/ncu.txt" 2>&1
  tail -5 "$OUT/ncu.txt"
fi
if want kernels; then
  python3 bench/crossover.py --table "$OUT/prefill_gates_h200.json" 2>&1 | tee "$OUT/kernels.log"
  python3 bench/mmq.py --json "$OUT/mmq.json" 2>&1 | tee -a "$OUT/kernels.log"
  python3 bench/gemm_f16.py --json "$OUT/gemm_f16.json" 2>&1 | tee -a "$OUT/kernels.log"
fi
if [ "$stage" = prep ]; then
  # For the next call on this (warm) machine: llama.cpp built by a process that outlives this call
  # (setsid), and the model files synthesized (MODELS="05b 7b 8b" dense, MOE_MODELS="30b 20b").
  [ -x /tmp/llama/build/bin/llama-bench ] || bash bench/llama_bin.sh unpack || [ -f /tmp/llama-build.started ] || { touch /tmp/llama-build.started
    setsid bash -c 'bash .llama/llama_cpp.sh build > /tmp/llama-build.log 2>&1; echo $? > /tmp/llama-build.rc' < /dev/null & }
  for m in ${MODELS:-}; do q$m; done
  for m in ${MOE_MODELS:-}; do synth_moe $m; done
fi
if [ "$stage" = pending ]; then
  pending_tests ${TEST_LIMIT:-240}
fi
if [ "$stage" = matvec ]; then
  # Issue 15's mat-vec bar: % of the copy ceiling at the 7B's and the 0.5B's widths, decode (n = 1).
  # MODELS=30b,20b: the MoE presets' dense shapes; SWEEP=1 times every kernel shape too; WIDE=1 the wide units
  # beside (mmvq.WIDE_UNITS: Q6_K's 16 positions; with SWEEP or WIDE_SWEEP=1,
  # every kernel shape of them).
  # NS=1,2: the column counts timed (and swept: mmvq.sweep_configs).
  python3 bench/kernels.py --types ${TYPES:-Q4_K,Q6_K,Q8_0,Q5_0} --models ${MODELS:-7b,0.5b} --ns ${NS:-1} --no-dequant ${SWEEP:+--sweep} ${WIDE:+--wide} ${WIDE_SWEEP:+--wide-sweep} \
    --json "$OUT/matvec.json" 2>&1 | tee "$OUT/matvec.log" | tail -8
fi
if [ "$stage" = chain ]; then
  [ "${TEST_LIMIT:-120}" = 0 ] || TESTS="tests/cuda/test_chain.py" cuda_tests ${TEST_LIMIT:-120}
  timeout ${CHAIN_LIMIT:-240} python3 bench/chain_probe.py --rounds ${ROUNDS:-3} 2>&1 | tee "$OUT/chain.log"
fi
if [ "$stage" = xplanes ]; then
  # MINFERD_X_PLANES=1 (the decode mat-vecs read one int8 plane of x) against the default two: the
  # mat-vec alone at the 7B's and the 0.5B's shapes, each setting's kernels compiled first (SWEEP=1:
  # every kernel shape under each setting too).
  MINFERD_X_PLANES=1 python3 -m minferd.cli warmup --device cuda 2>&1 | tail -2 | tee "$OUT/warm-x1.log"
  for v in 2 1; do
    MINFERD_X_PLANES=$v python3 bench/kernels.py --types ${TYPES:-Q4_K,Q6_K,Q8_0,Q5_0} --models ${MODELS:-7b,0.5b} --ns ${NS:-1} \
      --no-dequant ${SWEEP:+--sweep} --json "$OUT/matvec-x$v.json" 2>&1 | tee "$OUT/matvec-x$v.log" | tail -14
  done
fi
if [ "$stage" = verify ]; then
  # A session's whole check in one call: llama.cpp builds in the background (carry .llama, made by
  # ../shared/device/llama_cpp.sh prep) while tests/cuda runs, then both time the same file.
  llama_bg
  cuda_tests ${TEST_LIMIT:-420}
  q7b
  python3 bench/bench.py /tmp/q7b.gguf --device cuda --paths ${PATHS:-w16,mmq} -p 512,2048 -n 128 -r 3 \
    --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log" | tail -12
  wait $build && /tmp/llama/build/bin/llama-bench -m /tmp/q7b.gguf -ngl 99 -fa 1 -p 512,2048 -n 128 -r 3 \
    2>&1 | tee "$OUT/llama-bench.log" | tail -8
fi
if [ "$stage" = batch ]; then
  # At most 8 files come back: logs only, and one JSON.
  cuda_tests ${TEST_LIMIT:-300}
  q7b
  for p in ${PATHS:-w16 mmq}; do
    python3 bench/profile_ops.py /tmp/q7b.gguf --path $p --batch ${BATCHES:-1,4,16,64} --top 14 \
      2>&1 | tee -a "$OUT/profile.log" | grep '^#'
  done
  # The same batches with every matmul of 9-64 rows on tcgemv (the gate table has no rows of it yet).
  echo "# MINFERD_PREFILL_KERNEL=tc" >> "$OUT/profile.log"
  MINFERD_PREFILL_KERNEL=tc python3 bench/profile_ops.py /tmp/q7b.gguf --path w16 --batch 16,64 --top 14 \
    2>&1 | tee -a "$OUT/profile.log" | grep '^#'
  # The gate table with these graph-timed rows merged in (copy it back if the kernels it picks win).
  cp minferd/backend/prefill_gates_h200.json "$OUT/gates.json"
  python3 bench/crossover.py --graph --types Q4_K,Q6_K --ns ${NS:-1,2,4,8,16,32,64} --reps 10 --json "$OUT/crossover.json" \
    --merge "$OUT/gates.json" 2>&1 | tee "$OUT/crossover.log" | tail -3
fi
if [ "$stage" = small ]; then
  # mmq_small's configs: their tests, then each timed in graphs beside cuBLAS (bench/mmq_small.py);
  # then (CLIENTS set) serve.py's rounds alone.
  TESTS=${TESTS:-tests/cuda/test_mmq_small.py tests/cuda/test_tcgemv.py} cuda_tests ${TEST_LIMIT:-150}
  python3 bench/mmq_small.py --ns ${NS:-16,32,64} --kernels ${KERNELS:-small,tc} --json "$OUT/mmq_small.json" 2>&1 | tee "$OUT/mmq_small.log"
  # NCU=1: where tcgemv's warps stall, on the 7B's gate matrix at 16 rows (it works on this machine)
  if [ -n "${NCU:-}" ]; then
    timeout 150 ncu --clock-control none --kernel-name regex:tcgemv --section SpeedOfLight --section WarpStateStats \
      --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis python3 bench/tc_once.py > "$OUT/ncu.txt" 2>&1
    grep -E "Duration|DRAM Through|Issued Warp|Eligible Warps|stalled waiting" "$OUT/ncu.txt" | head -20
  fi
  # TC_CONFIGS="base cl": the rounds once per tcgemv config (MINFERD_TCGEMV_CONFIG), side by side.
  if [ -n "${CLIENTS:-}" ]; then
    q7b
    for c in ${TC_CONFIGS:-default}; do
      echo "# tcgemv config $c" | tee -a "$OUT/serve.log"
      [ "$c" = default ] && c=""
      MINFERD_TCGEMV_CONFIG=$c timeout 200 python3 bench/serve.py /tmp/q7b.gguf --device cuda --clients $CLIENTS \
        --prompt-tokens 512 --gen-tokens 128 --json "$OUT/serve${c:+-$c}.json" 2>&1 | tee -a "$OUT/serve.log" | tail -8
    done
  fi
fi
if [ "$stage" = tc ]; then
  # In eight workers where pytest-xdist came: one process spent its 120 s compiling (s20 call 1).
  TESTS=${TESTS:-$(python3 -c "import xdist" 2>/dev/null && echo "-n 8") tests/cuda/test_tcgemv.py} cuda_tests ${TEST_LIMIT:-120}
  python3 bench/tc_splits.py --types ${TYPES:-Q4_K,Q6_K,Q8_0} --models ${MODELS:-7b} --ns ${NS:-16,32} --configs auto \
    --json "$OUT/tc_splits.json" 2>&1 | cut -c1-160 | tee "$OUT/tc_splits.log"
  # Where the warps wait (session 19: long-scoreboard first, 3.05 of ~8.5 cycles an instruction).
  M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,dram__throughput.avg.pct_of_peak_sustained_elapsed'
  M="$M,lts__t_sector_hit_rate.pct,smsp__issue_active.avg.per_cycle_active,smsp__inst_executed.sum"
  M="$M,sm__warps_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum"
  for m in 16 8; do
    timeout 100 ncu --clock-control none --kernel-name regex:tcgemv --metrics "$M" python3 bench/tc_once.py --m $m \
      --configs auto > "$OUT/ncu-m$m.txt" 2>&1
    echo "# $m tokens"; grep -E "stalled|dram|lts|issue_active|inst_exec|warps_active|duration" "$OUT/ncu-m$m.txt" | awk '$NF+0 > 0.05'
  done
fi
if [ "$stage" = gates ]; then
  # The gate table's rows of 8-64 tokens re-timed with today's kernels (merged into a copy of the
  # committed table: copy $OUT/gates.json back where its picks win), then where decode's mat-vec
  # waits, Q4_K beside Q6_K on the 7B's ffn_down (ncu's sections, full text in $OUT/ncu-mmvq.txt).
  regate ${TYPES:-Q4_K,Q6_K} ${MODELS:-7b} "$OUT/gates.json" --json "$OUT/crossover.json" 2>&1 | tee "$OUT/crossover.log" | tail -3
  [ "${NCU:-1}" = 0 ] && exit 0  # NCU=0: the table alone
  timeout 150 ncu --clock-control none --kernel-name regex:mmvq --section SpeedOfLight --section WarpStateStats \
    --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats \
    python3 bench/mmvq_once.py --types Q4_K,Q6_K > "$OUT/ncu-mmvq.txt" 2>&1
  grep -E "mmvq<|Duration|DRAM Through|Issued Warp|Eligible Warps|Achieved Occ|L1/TEX Hit|Mem Busy|Max Bandwidth" "$OUT/ncu-mmvq.txt" | head -40
fi
if [ "$stage" = cold ]; then
  q7b
  first() { /usr/bin/time -f "%e s wall" python3 -m minferd.cli run /tmp/q7b.gguf --device cuda --prompt-ids 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 --max-tokens 1 --json; }
  rm -rf /tmp/cold-a /tmp/cold-b
  { echo "# warmup into an empty cache"; CUPY_CACHE_DIR=/tmp/cold-a /usr/bin/time -f "%e s wall" python3 -m minferd.cli warmup --device cuda
    echo "# the 7B's first token after it"; CUPY_CACHE_DIR=/tmp/cold-a first
    [ -n "${COLD_BARE:-}" ] && { echo "# the 7B's first token with an empty cache"; CUPY_CACHE_DIR=/tmp/cold-b first; }; } \
    2>&1 | tee "$OUT/cold.log"
  cp -rn /tmp/cold-a/. "$CUPY_CACHE_DIR"/  # what warmup compiled comes back with the cache
fi
if [ "$stage" = latency ]; then
  # LLAMA=0: no llama.cpp columns (an A/B of our own settings needs no build).
  llama_bg
  [ -n "${PENDING:-}" ] && pending_tests ${PENDING_LIMIT:-200}
  for m in ${MODELS:-05b 7b 8b}; do q$m; done
  # GATES=Q6_K (an H200 only: the table is the H200's): those types' 8-64-row gate rows re-timed at the
  # 7B's and 0.5B's shapes into a copy of the table, which the timed runs then read (MINFERD_GATE_TABLE);
  # $OUT/gates.txt goes back to minferd/backend/prefill_gates_h200.json where its rows changed.
  if [ -n "${GATES:-}" ] && grep -q H200 "$OUT/gpu.txt"; then
    LIMIT=${GATES_LIMIT:-150} regate "$GATES" 7b,0.5b "$OUT/gates.txt" > "$OUT/crossover.log" 2>&1 \
      && export MINFERD_GATE_TABLE="$OUT/gates.txt"
    tail -3 "$OUT/crossover.log"
  fi
  if [ -n "${TESTS:-}" ]; then [ "$TESTS" = all ] && TESTS=""; cuda_tests ${TEST_LIMIT:-240}; fi
  wait $build && lb="--llama-bench /tmp/llama/build/bin/llama-bench"
  # HOPS=1: what a thread wake and each gRPC server's hand-offs cost on this machine (after the build:
  # never time the host while it compiles)
  [ -n "${HOPS:-}" ] && timeout 120 python3 bench/rpc_hops.py --reps 2000 --json "$OUT/hops.json" 2>&1 \
    | grep -v "^[IEW][0-9]" | tee "$OUT/hops.log"
  # HOST_LOAD=N: N busy loops on the host's cores through the timed runs (a build, a test suite's
  # workers beside the daemon): what a client waits for when the engine's thread competes for a core.
  loaders=""; for _ in $(seq ${HOST_LOAD:-0}); do sh -c 'while :; do :; done' & loaders="$loaders $!"; done
  for m in ${MODELS:-05b 7b 8b}; do
    # END=S: no model starts past S seconds of this call (one call that must end inside the tool's limit)
    [ $SECONDS -lt ${END:-100000} ] || { echo "# q$m.gguf skipped: $SECONDS s, past END" | tee -a "$OUT/latency.log"; continue; }
    with=${lb:-}
    for v in ${AB:-default}; do
      echo "# q$m.gguf, $v" | tee -a "$OUT/latency.log"
      set_=""; tag=""; [ "$v" = default ] || { set_=${v//+/ }; tag="-${v//[=\/,+]/}"; }
      pin=""; case $v in taskset=*) pin="taskset -c ${v#taskset=}"; set_="";; esac  # client and daemon on these cores
      env $set_ $pin timeout 240 python3 bench/latency.py /tmp/q$m.gguf --device cuda $with \
        --lengths ${LENGTHS:-1,16,128,512,1024,2048} --ttft-max-tokens ${TTFT_TOKENS:-1} --reps ${REPS:-5} \
        --json "$OUT/latency-$m$tag.json" 2>&1 | tee -a "$OUT/latency.log" | tail -9
      with=""  # llama.cpp's columns once a model
    done
  done
  [ -n "$loaders" ] && kill $loaders
fi
if [ "$stage" = turns ]; then
  # A pending path's decode against the path off, in turns on one machine: bench/decode_gap.py back to
  # back (the device's own time a token) for each MINFERD_PENDING setting of TURNS ("off": none),
  # on the 7B (W16 plan) and the 0.5B (MMQ plan); TESTS first where given (the path's own tests).
  if [ -n "${TESTS:-}" ]; then cuda_tests ${TEST_LIMIT:-200}; fi
  q7b; q05b
  for t in ${TURNS:-off qkv_rope off qkv_rope}; do
    p=$t; [ "$t" = off ] && p=""
    for mp in 7b:w16 05b:mmq; do
      echo "# q${mp%%:*}.gguf --path ${mp#*:}, MINFERD_PENDING=$p" | tee -a "$OUT/turns.log"
      MINFERD_PENDING=$p timeout 200 python3 bench/decode_gap.py /tmp/q${mp%%:*}.gguf --path ${mp#*:} --tokens 200 \
        --rounds 3 2>&1 | tee -a "$OUT/turns.log" | tail -3
    done
  done
fi
if [ "$stage" = moe ]; then
  llama_bg
  [ -n "${PENDING:-}" ] && pending_tests ${PENDING_LIMIT:-200}
  if [ -n "${TESTS:-}" ]; then [ "$TESTS" = all ] && TESTS=""; cuda_tests ${TEST_LIMIT:-200}; fi
  for m in ${MOE_MODELS:-30b}; do
    synth_moe $m
    # A budget that holds the dense class's f16 copy, and one that holds the weights but not it.
    case $m in 30b) budgets="80GiB 23GiB";; *) budgets="80GiB 16GiB";; esac
    for b in ${BUDGETS:-$budgets}; do
      python3 -m minferd.cli plan /tmp/q$m.gguf --device cuda --budget $b 2>&1 | tee -a "$OUT/moe-plan.log"
    done
  done
  # WHILE_BUILD: a command run while llama.cpp builds (the GPU is idle then), output to moe-plan.log.
  [ -n "${WHILE_BUILD:-}" ] && { eval "$WHILE_BUILD"; } >> "$OUT/moe-plan.log" 2>&1
  wait $build; built=$?
  for m in ${MOE_MODELS:-30b}; do
    # AB="MINFERD_DEVICE_MOE=0 MINFERD_DEVICE_MOE=1": the bench once per setting (VAR=v+VAR2=w: both).
    for v in ${AB:-default}; do
      set_=""; tag=""; [ "$v" = default ] || { set_=${v//+/ }; tag="-${v//[=\/,+]/}"; }
      echo "# q$m.gguf, $v" | tee -a "$OUT/moe-bench.log"
      env $set_ timeout ${MOE_LIMIT:-300} python3 bench/bench.py /tmp/q$m.gguf --device cuda --paths ${PATHS:-w16,mmq} \
        -p 512,2048 -n 128 -r ${REPS:-3} --json "$OUT/moe-bench-$m$tag.json" 2>&1 | tee -a "$OUT/moe-bench.log" | tail -12
    done
    [ $built = 0 ] && /tmp/llama/build/bin/llama-bench -m /tmp/q$m.gguf -ngl 99 -fa 1 -p 512,2048 -n 128 -r 3 \
      2>&1 | tee -a "$OUT/llama-bench.log" | tail -8
  done
fi
if [ "$stage" = serve ]; then
  # The build runs while the tests do; the benches wait for it (the daemon's compute threads run
  # niced: sixteen compiler jobs beside them starved its engine).
  # The single-stream bench waits for the build too: s8's ran beside it and lost ~6%.
  # LLAMA=0 skips llama.cpp's columns, TESTS=none the tests (a re-run of our own figures).
  llama_bg
  [ "${TESTS:-}" = none ] || cuda_tests ${TEST_LIMIT:-300}
  q7b
  wait $build; built=$?
  python3 bench/bench.py /tmp/q7b.gguf --device cuda --paths ${PATHS:-w16,mmq} -p 512 -n 128 -d 0,4096,16384 -r 3 \
    --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -8
  # AB="MINFERD_RUN_AHEAD=0 default": serve.py once per setting (VAR=v+VAR2=w: both)
  for v in ${AB:-default}; do
    set_=""; tag=""; [ "$v" = default ] || { set_=${v//+/ }; tag="-${v//[=\/,+]/}"; }
    echo "# $v" | tee -a "$OUT/serve.log"
    env $set_ timeout 300 python3 bench/serve.py /tmp/q7b.gguf --device cuda --clients ${CLIENTS:-1,4,16,64} --prompt-tokens 512 \
      --gen-tokens 128 --shared-prefix 2000 --json "$OUT/serve$tag.json" 2>&1 | tee -a "$OUT/serve.log" | tail -20
  done
  if [ $built = 0 ]; then
    L=/tmp/llama/build/bin
    $L/llama-bench -m /tmp/q7b.gguf -ngl 99 -fa 1 -p 0 -n 128 -d 0,4096,16384 -r 3 2>&1 | tee "$OUT/llama-bench.log" | tail -6
    $L/llama-batched-bench -m /tmp/q7b.gguf -ngl 99 -fa on -c 50000 -b 2048 -ub 512 -npp 512 -ntg 128 \
      -npl 1,4,16,64 2>&1 | tee "$OUT/llama-batched.log" | tail -8
  fi
fi
