#!/usr/bin/env bash
# Nsight Compute profile of the wgmma GEMM (one launch per case), summaries + per-instruction SASS stalls to OUTDIR.
#   bash tools/profile/wgmma.sh OUTDIR
set -uo pipefail
OUT=${1:?usage: bash tools/profile/wgmma.sh OUTDIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats --section WarpStateStats --section LaunchStats --section SourceCounters"
run() {  # name, launch spec (cases named a8_*: the int8 GEMM, tools/bench/wgmma_a8.py)
  local script=tools.bench.wgmma
  [[ $1 == a8_* ]] && script=tools.bench.wgmma_a8
  timeout 150 "$NCU" --clock-control none -k regex:mixgemm_gemm --launch-skip 2 --launch-count 1 $SECTIONS \
    --import-source no --export "$OUT/wg_$1" --force-overwrite \
    python -m $script --launch "$2" > /dev/null 2>&1
  "$NCU" --import "$OUT/wg_$1.ncu-rep" --print-details all > "$OUT/ncu_wgmma_$1.txt" 2>&1
  "$NCU" --import "$OUT/wg_$1.ncu-rep" --page source --print-source sass --csv > "$OUT/sass_wgmma_$1.csv" 2>&1
  echo "== $1: $(grep -E ' Duration ' "$OUT/ncu_wgmma_$1.txt" | head -1)"
  rm -f "$OUT/wg_$1.ncu-rep"
}
# CASES (env): which of these to profile (default: all)
declare -A SPEC=(
  [m32]='32,8192,28672,{"BM":32,"NWG":2,"STAGES":6,"INFLIGHT":2,"SPLIT":1,"GROUP_M":1,"TMA":0}'
  [m32_kt4]='32,8192,28672,{"BM":32,"NWG":2,"STAGES":3,"KT":4,"SPLIT":1,"GROUP_M":1,"TMA":0}'
  [m64_kt4]='64,8192,28672,{"BM":64,"NWG":4,"STAGES":3,"KT":4,"SPLIT":1,"GROUP_M":1,"TMA":0}'
  [m4096]='4096,8192,28672,{"BM":256,"NWG":2,"STAGES":5,"INFLIGHT":2,"SPLIT":1,"GROUP_M":8}'
  [m16_tma]='16,8192,28672,{"BM":16,"NWG":2,"STAGES":4,"KT":4,"SPLIT":1,"GROUP_M":1,"TMA":1}'
  [m32_tma]='32,8192,28672,{"BM":32,"NWG":2,"STAGES":3,"KT":4,"SPLIT":1,"GROUP_M":1,"TMA":1}'
  [m32_sk]='32,8192,28672,{"BM":32,"NWG":2,"STAGES":3,"KT":4,"GROUP_M":1,"SK":1}'
  [m32_mid_tma]='32,4096,14336,{"BM":32,"NWG":2,"STAGES":4,"KT":4,"SPLIT":1,"GROUP_M":1,"TMA":1}'
  [m32_mid_sk]='32,4096,14336,{"BM":32,"NWG":2,"STAGES":3,"KT":4,"GROUP_M":1,"SK":1}'
  [m1024_mid]='1024,4096,14336,{"BM":256,"NWG":2,"STAGES":5,"INFLIGHT":2,"SPLIT":1,"GROUP_M":8}'
  [a8_np1]='4096,8192,28672,w4g128,{"BM":128,"NWG":2,"STAGES":4,"KT":2,"NP":1}'
  [a8_np2]='4096,8192,28672,w4g128,{"BM":128,"NWG":2,"STAGES":4,"KT":2,"NP":2}'
  [a8_ws]='4096,8192,28672,w4g128,{"BM":128,"NWG":2,"STAGES":4,"KT":2,"NP":1,"WS":1}'
  [a8_ws_t]='4096,8192,28672,w4g128t,{"BM":128,"NWG":2,"STAGES":4,"KT":2,"NP":1,"WS":1}'
  [a8_pc]='4096,8192,28672,w4pc,{"BM":128,"NWG":2,"STAGES":4,"KT":2,"NP":1}'
  [m32_mid_fold]='32,4096,14336,{"BM":32,"NWG":2,"STAGES":4,"KT":4,"SPLIT":1,"GROUP_M":1,"FOLD":1}'
)
for c in ${CASES:-m32 m32_kt4 m64_kt4 m4096}; do run "$c" "${SPEC[$c]}"; done
python -m tools.profile.sass_stalls "$OUT"/sass_wgmma_*.csv > "$OUT/sass_stalls.txt" 2>&1
