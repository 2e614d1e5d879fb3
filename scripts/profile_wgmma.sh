#!/usr/bin/env bash
# Nsight Compute profile of the wgmma GEMM (one launch per case), summaries + per-instruction SASS stalls to OUTDIR.
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
    --import-source no --export "$OUT/wg_$1" --force-overwrite \
    python scripts/bench_wgmma.py --launch "$2" > /dev/null 2>&1
  "$NCU" --import "$OUT/wg_$1.ncu-rep" --print-details all > "$OUT/ncu_wgmma_$1.txt" 2>&1
  "$NCU" --import "$OUT/wg_$1.ncu-rep" --page source --print-source sass --csv > "$OUT/sass_wgmma_$1.csv" 2>&1
  echo "== $1: $(grep -E ' Duration ' "$OUT/ncu_wgmma_$1.txt" | head -1)"
  rm -f "$OUT/wg_$1.ncu-rep"
}
run m32 '32,8192,28672,{"BM":32,"NWG":2,"STAGES":6,"INFLIGHT":2,"SPLIT":1,"GROUP_M":1}'
run m4096 '4096,8192,28672,{"BM":256,"NWG":2,"STAGES":5,"INFLIGHT":2,"SPLIT":1,"GROUP_M":8}'
