#!/usr/bin/env bash
# Nsight Compute, one call per case: cuDNN's kernels (their names give its tile / cluster choice) beside mixgemm's
# conv on the same layer; summaries to OUTDIR/ncu_conv.txt. DEEP=1 adds warp-state and per-instruction stall
# sampling of mixgemm's kernel (OUTDIR/sass_conv_*.csv.gz, summarized in OUTDIR/sass_stalls.txt).
#   bash tools/profile/conv.sh OUTDIR     (LAYERS, BATCH, MODES, DEEP in the environment override the defaults;
#                                            a mode is "cudnn BITS", "auto BITS" or '{"BM": 128, ...} BITS')
set -uo pipefail
OUT=${1:?usage: bash tools/profile/conv.sh OUTDIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
SECTIONS="--section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis"
[[ ${DEEP:-0} == 1 ]] && SECTIONS="$SECTIONS --section WarpStateStats --section SchedulerStats --section SourceCounters"
METRICS=lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum
BATCH=${BATCH:-32}
IFS=';' read -ra LAYERS <<< "${LAYERS:-s3 1x1 256-1024;s2 1x1 128-512;s3 1x1 1024-256;s4 1x1 2048-512;s4 3x3 512-512 @7}"
IFS=';' read -ra MODES <<< "${MODES:-cudnn 8;auto 8;auto 4}"
n=0
for layer in "${LAYERS[@]}"; do
  for m in "${MODES[@]}"; do
    mode=${m% *} bits=${m##* } n=$((n + 1))
    echo "######## $layer b$BATCH w$bits $mode" >> "$OUT/ncu_conv.txt"
    timeout 180 "$NCU" --clock-control none --profile-from-start off $SECTIONS --metrics $METRICS --import-source no \
      --export "$OUT/case$n" --force-overwrite \
      python -m tools.profile.conv "$layer" "$BATCH" "$bits" "$mode" > /dev/null 2>&1
    "$NCU" --import "$OUT/case$n.ncu-rep" --print-details all >> "$OUT/ncu_conv.txt" 2>&1
    if [[ ${DEEP:-0} == 1 && $mode != cudnn ]]; then
      "$NCU" --import "$OUT/case$n.ncu-rep" --page source --print-source sass --csv -k regex:mixgemm \
        > "$OUT/sass_conv_$n.csv" 2>&1
      echo "== case $n: $layer w$bits $mode" >> "$OUT/sass_stalls.txt"
      python -m tools.profile.sass_stalls "$OUT/sass_conv_$n.csv" >> "$OUT/sass_stalls.txt" 2>&1
      gzip -f "$OUT/sass_conv_$n.csv"
    fi
    rm -f "$OUT/case$n.ncu-rep"
    echo "== $layer w$bits $mode: $(grep -E '^  [a-zA-Z_].*\(|Duration' "$OUT/ncu_conv.txt" | tail -2 | tr -s ' ' | tr '\n' '|')"
  done
done
