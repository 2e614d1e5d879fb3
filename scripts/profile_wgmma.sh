#!/usr/bin/env bash
# Nsight Compute profile of the wgmma GEMM (one launch per case), summaries to OUTDIR.
#   bash scripts/profile_wgmma.sh OUTDIR
set -uo pipefail
OUT=${1:?usage: bash scripts/profile_wgmma.sh OUTDIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats --section WarpStateStats --section LaunchStats --section SourceCounters"
run() {  # name, launch spec
  timeout 150 "$NCU" --clock-control none -k regex:mixgemm_gemm --launch-skip 2 --launch-count 1 $SECTIONS \
    --print-details all python scripts/bench_wgmma.py --launch "$2" > "$OUT/ncu_wgmma_$1.txt" 2>&1
  echo "== $1 (rc $?)"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|L2 Hit|Issue Slots Busy|Achieved Occupancy|Registers Per|No Eligible|Warp Cycles Per Issued|Stall [A-Z][a-z]+ .*[0-9]|Executed Instructions  |Shared Memory Configuration Size|Block Limit" "$OUT/ncu_wgmma_$1.txt" | head -40
  grep -B2 -A12 "Warp Stall Sampling (All Samples)" "$OUT/ncu_wgmma_$1.txt" | head -40
}
run m32 '32,8192,28672,{"BM":32,"NWG":2,"STAGES":8,"SPLIT":1,"GROUP_M":1}'
run m4096 '4096,8192,28672,{"BM":256,"NWG":2,"STAGES":4,"SPLIT":1,"GROUP_M":8}'
