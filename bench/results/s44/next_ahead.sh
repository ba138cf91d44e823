#!/bin/bash
# Ran in session 45 (call 1, bench/results/s45/call1-*); norm_ahead.patch has landed since, so its git apply now fails.
# For a later session (not run in 44): norm.cu's norm_w_ahead meant its weights to be read before
# the programmatic wait, but its __ldg loads are non-coherent and ptxas puts the wait (ACQBULK)
# above them (pdl.cuh). norm_ahead.patch reads them coherently (ld_ahead: the 8 LDG.E above
# ACQBULK in rmsnorm_q's SASS). Tests with it, then the decode step with and without it in turns
# (ahead / head / ahead / head), 7B (W16) and 0.5B (MMQ); then the chain probe's floor rows.
# One call, ~5 min on a warm cache (carry .whl and .devcarry).
cd "$(dirname "$0")/../../.."
. bench/device_env.sh
git apply bench/results/s44/norm_ahead.patch
timeout 150 python3 -m pytest $x -q tests/cuda/test_fused_ops.py tests/cuda/test_chain.py 2>&1 | grep -v "Warn\|warner" \
  | tail -4 | tee "$OUT/ahead-tests.log"
git apply -R bench/results/s44/norm_ahead.patch
for m in 7b:qwen2:7b:w16 05b:qwen2:0.5b:mmq; do
  IFS=: read f arch preset path <<< "$m"
  [ -f /tmp/q$f.gguf ] || python3 -m minferd.cli synth --arch $arch --preset $preset --quant q4_k_m --random-blocks /tmp/q$f.gguf
done
for v in ahead head ahead head; do
  [ $v = ahead ] && git apply bench/results/s44/norm_ahead.patch
  for m in 7b:w16 05b:mmq; do
    echo "# $v q${m%:*} ${m#*:}" >> "$OUT/ahead-decode.log"
    timeout 100 python3 bench/decode_gap.py /tmp/q${m%:*}.gguf --path ${m#*:} --tokens 200 --rounds 3 2>&1 | grep -v Warn \
      | tail -2 >> "$OUT/ahead-decode.log"
  done
  [ $v = ahead ] && git apply -R bench/results/s44/norm_ahead.patch
done
cat "$OUT/ahead-decode.log"
timeout 200 python3 bench/chain_probe.py --rounds 3 2>&1 | grep -v Warn | tee "$OUT/chain.log" | grep -E "^#|graph|read|free|bare"
tar -C "$CUPY_CACHE_DIR" -czf "$OUT/cupy_cache.tgz" . 2>/dev/null
