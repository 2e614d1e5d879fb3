#!/usr/bin/env bash
# Nsight Compute profile of the GEMV kernels on the protocol's big shape (one launch each), summaries to OUTDIR.
#   bash tools/profile/gemv.sh OUTDIR
# Needs ncu (Firecracker machines: hardware counters readable; clocks left alone with --clock-control none).
set -uo pipefail
OUT=${1:?usage: bash tools/profile/gemv.sh OUTDIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
SECTIONS="--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,dram__bytes_read.sum,lts__t_bytes.sum,l1tex__t_bytes.sum --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats --section WarpStateStats --section LaunchStats --section InstructionStats"
run() {  # name, args...
  local name=$1; shift
  timeout 120 "$NCU" --clock-control none --target-processes all -k regex:mixgemm --launch-skip 3 --launch-count 1 \
    $SECTIONS --print-details all python -m tools.profile.gemv "$@" > "$OUT/ncu_$name.txt" 2>&1
  echo "== $name (rc $?)"
  grep -E "Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Issue Slots Busy|Issued Ipc|Achieved Occupancy|Registers Per|No Eligible|Eligible Warps|Warp Cycles Per Issued|Stall Long|Stall LG|Stall Wait|Stall Math|Stall MIO|Stall Short|Stall Barrier|Stall Not Selected|Stall Dispatch|Stall Selected|Executed Instructions   |L2 Compression|Mem Busy|Max Bandwidth|Mem Pipes|stalled_.*ratio +[^ ]+ +[0-9.]*[1-9]|bytes_read.sum|t_bytes.sum" "$OUT/ncu_$name.txt" | head -60
}
run simt_w4_m1 8192 28672 1 4 128 simt
run mma_w4_m1 8192 28672 1 4 128 mma '{"U":2,"KS":8,"DEFER":1}'
run simt_w8_m1 8192 28672 1 8 -1 simt
run mma_w4_m16 8192 28672 16 4 128 mma '{"U":2,"KS":8,"DEFER":1}'
