#!/bin/bash
# Runs on a tree with bench/results/s46/q4k_words.patch applied (the path went after this call).
# Session 46: the pending path q4k_words (Q4_K's one-column mat-vec walked by 16-byte words,
# mmvq_words.cuh: a warp's load is 512 consecutive bytes, headers shuffled from the lane holding
# them) against the unit walk. Its tests first, then in turns default / q4k_words / default /
# q4k_words: the 7B's mat-vec graph (chain_probe --graph-only) and a decode step of the 7B and 0.5B
# files (decode_gap); the Q4_K kernels alone at the 7B's shapes, both walks (kernels.py --wide),
# twice; then every config of the word walk (--wide-sweep) and the chain probe's floor rows.
cd "$(dirname "$0")/../../.."
. bench/device_env.sh
t0=$SECONDS
MINFERD_PENDING=q4k_words timeout 200 python3 -m pytest $x -q tests/cuda/test_mmvq.py tests/cuda/test_engine_cuda.py -k wide 2>&1 \
  | grep -v "Warn\|warner" | tail -6 | tee "$OUT/words-tests.log"
for m in 7b:qwen2:7b 05b:qwen2:0.5b; do
  IFS=: read f arch preset <<< "$m"
  [ -f /tmp/q$f.gguf ] || python3 -m minferd.cli synth --arch $arch --preset $preset --quant q4_k_m --random-blocks /tmp/q$f.gguf
done
echo "tests+synth $((SECONDS - t0)) s" >> "$OUT/words-ab.log"
for v in "" q4k_words "" q4k_words; do
  export MINFERD_PENDING=$v
  echo "# ${v:-default}" >> "$OUT/words-ab.log"
  timeout 90 python3 bench/chain_probe.py --graph-only --rounds 3 2>&1 | grep -E "^graph" >> "$OUT/words-ab.log"
  for m in 7b:w16 05b:mmq; do
    timeout 90 python3 bench/decode_gap.py /tmp/q${m%:*}.gguf --path ${m#*:} --tokens 200 --rounds 3 2>&1 | grep -v Warn \
      | grep "back to back" | sed "s/^/q${m%:*} /" >> "$OUT/words-ab.log"
  done
done
unset MINFERD_PENDING
for i in 1 2; do
  timeout 60 python3 bench/kernels.py --types Q4_K --models 7b --ns 1 --no-dequant --wide 2>&1 | grep -E "^mmvq|^  wide" >> "$OUT/words-ab.log"
done
cat "$OUT/words-ab.log"
[ $((SECONDS - t0)) -lt ${SWEEP_BEFORE:-300} ] && timeout 120 python3 bench/kernels.py --types Q4_K --models 7b --ns 1 --no-dequant --wide-sweep 2>&1 \
  | grep -v Warn > "$OUT/words-sweep.log" && tail -30 "$OUT/words-sweep.log"
[ $((SECONDS - t0)) -lt ${CHAIN_BEFORE:-360} ] && MINFERD_PENDING=q4k_words timeout 90 python3 bench/chain_probe.py --rounds 3 2>&1 | grep -v Warn \
  | tee "$OUT/words-chain.log" | grep -E "^#|graph|read|free|bare"
tar -C "$CUPY_CACHE_DIR" -czf "$OUT/cupy_cache.tgz" . 2>/dev/null
