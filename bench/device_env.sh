# Sourced from the repository root by the one-off device scripts (bench/results/sNN/*.sh): $OUT, the
# GPU's name in it, the carried wheels installed, the carried kernel cache, and $x (pytest-xdist's
# "-n 8" where it came in .whl).
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.devcarry/cupy_cache
x=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
