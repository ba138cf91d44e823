#!/bin/bash
# Session 43: mmvq_ring.patch (a two-trip register ring in mmvq_rows) against today's loop, in turns
# on one machine: the mat-vecs alone at the 7B's and 0.5B's shapes, then decode_gap on the 7B (w16)
# and the 0.5B (mmq); RING_SWEEP=1 adds the config sweep of Q4_K / Q6_K under the ring.
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.devcarry/cupy_cache}
DECODE=${DECODE-q7b:w16 q05b:mmq}  # DECODE="": the mat-vecs alone
[ -z "$DECODE" ] || [ -f /tmp/q7b.gguf ] || python3 -m minferd.cli synth --arch qwen2 --preset 7b --quant q4_k_m --random-blocks /tmp/q7b.gguf
[ -z "$DECODE" ] || [ -f /tmp/q05b.gguf ] || python3 -m minferd.cli synth --arch qwen2 --preset 0.5b --quant q4_k_m --random-blocks /tmp/q05b.gguf
for v in ${VARIANTS:-base ring base ring}; do
  [ $v = ring ] && git apply bench/results/s43/mmvq_ring.patch
  echo "# $v matvec" >> "$OUT/ring-matvec.log"
  timeout 150 python3 bench/kernels.py --types Q4_K,Q6_K,Q8_0,Q5_0 --models 7b,0.5b --ns 1 --no-dequant 2>&1 \
    | grep -v Warn | grep -A7 "GB/s (% of copy" >> "$OUT/ring-matvec.log"
  for m in $DECODE; do
    set -- ${m%:*} ${m#*:}
    echo "# $v $1 $2" | tee -a "$OUT/ring-decode.log"
    timeout 150 python3 bench/decode_gap.py /tmp/$1.gguf --path $2 --tokens 200 --rounds 3 2>&1 \
      | grep -v Warn | tee -a "$OUT/ring-decode.log" | tail -2
  done
  [ $v = ring ] && git apply -R bench/results/s43/mmvq_ring.patch
done
if [ -n "${RING_SWEEP:-}" ]; then
  git apply bench/results/s43/mmvq_ring.patch
  timeout 200 python3 bench/kernels.py --types Q4_K,Q6_K --models 7b --ns 1 --no-dequant --sweep 2>&1 | grep -v Warn > "$OUT/ring-sweep.log"
  git apply -R bench/results/s43/mmvq_ring.patch
fi
if [ -n "${RING_TEST:-}" ]; then  # the ring's products against the reference (test_mmvq), one time
  git apply bench/results/s43/mmvq_ring.patch
  x=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
  timeout ${RING_TEST} python3 -m pytest $x -q -x tests/cuda/test_mmvq.py 2>&1 | tail -5 | tee "$OUT/ring-test.log"
  git apply -R bench/results/s43/mmvq_ring.patch
fi
tail -40 "$OUT/ring-matvec.log"; tail -30 "$OUT/ring-decode.log"
