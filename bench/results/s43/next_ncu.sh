#!/bin/bash
# For a later session (not run in 43): where Q4_K's one-column mat-vec loses against plain streaming
# of the same bytes. ncu's DRAM bytes and throughput, L2 and L1 sectors, L1 wavefronts, active warps
# and instructions for mmvq at the 7B's gate/up and down shapes, beside a copy and a sum of the same
# 38 MB (bench/mmvq_once.py --reads), one launch each.
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.devcarry/cupy_cache
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum
M=$M,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__data_pipe_lsu_wavefronts.sum
M=$M,l1tex__throughput.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
M=$M,smsp__inst_executed.sum,launch__grid_size,launch__registers_per_thread
for shape in 18944,3584 3584,18944; do
  echo "# Q4_K $shape" >> "$OUT/ncu-reads.txt"
  timeout 150 "$NCU" --clock-control none --kernel-name regex:"mmvq|cupy" --metrics "$M" \
    python3 bench/mmvq_once.py --types Q4_K,Q6_K --shape $shape --reads >> "$OUT/ncu-reads.txt" 2>&1
done
grep -E "mmvq|cupy|duration|dram__|lts__|l1tex__|warps_active|inst_executed|grid_size|registers" "$OUT/ncu-reads.txt" | head -150
