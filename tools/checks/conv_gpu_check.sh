#!/usr/bin/env bash
# The conv path in ONE device call: conv GPU tests, ResNet-50 (quantize_, W8A16 / W4A16) vs dequantized float,
# conv layer timing (ResNet-50 stages + ConvNeXt 7x7 dw, batch 1 and 32) vs cuDNN fp16 channels_last + tile sweep.
#   OUT=/tmp/x bash tools/checks/conv_gpu_check.sh        (logs, bench.json, resnet.json, conv_table_<gpu>.json in $OUT)
# Phase A (parallel, GPU shared, nothing timed): pytest groups of tests/kernels/test_conv.py (+ test_conv_int8.py if present)
#   and compile warm-up workers (fill Triton's cache so the timed process does not compile serially).
# Phase B (alone on the GPU): ResNet-50. Phase C (alone): conv timing. Stage limits: A_T, R_T, B_T (s).
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=src
OUT=${OUT:-/tmp/conv_out}; mkdir -p "$OUT"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
A_T=${A_T:-110}; R_T=${R_T:-45}; B_T=${B_T:-120}; NW=${NW:-10}

# ---- phase A
TESTS="tests/kernels/test_conv.py"; [ -f tests/kernels/test_conv_int8.py ] && TESTS="$TESTS tests/kernels/test_conv_int8.py"
i=0; PIDS=""
for K in "gpu_layers" "geometries" "formats" "not gpu_layers and not geometries and not formats and not end_to_end"; do
  timeout "$A_T" python -m pytest -q -p no:cacheprovider $TESTS -k "$K" > "$OUT/pytest_$i.log" 2>&1 &
  PIDS="$PIDS $!"; i=$((i+1))
done
WP=""
for w in $(seq 0 $((NW-1))); do
  timeout $((A_T-10)) python -m tools.checks.conv_gpu_check warm --worker "$w" --workers "$NW" > "$OUT/warm_$w.log" 2>&1 &
  WP="$WP $!"
done
timeout $((A_T-10)) python -m tools.checks.conv_gpu_check warm-resnet > "$OUT/warm_resnet.log" 2>&1 &
WP="$WP $!"
for p in $PIDS $WP; do wait "$p"; done
echo "# phase A done at $(el)s"
for i in 0 1 2 3; do echo "pytest group $i: $(tail -1 "$OUT/pytest_$i.log")"; done
grep -h "FAILED\|Error" "$OUT"/pytest_*.log | cut -c1-300 | head -20
grep -h "warm FAIL" "$OUT"/warm_*.log | cut -c1-200 | head -10
grep -h "warm worker\|warm resnet" "$OUT"/warm_*.log | tr '\n' ' '; echo

# ---- phase B
timeout "$R_T" python -m tools.checks.conv_gpu_check resnet --out "$OUT" > "$OUT/resnet.log" 2>&1
grep -h "RESNET50\|Error" "$OUT/resnet.log" | cut -c1-600
echo "# phase B done at $(el)s"

# ---- phase C
LEFT=$(( 282 - $(el) )); [ "$LEFT" -gt "$B_T" ] || B_T=$LEFT
timeout "$B_T" python -m tools.checks.conv_gpu_check bench --out "$OUT" --budget-s $((B_T-25)) > "$OUT/bench.log" 2>&1
grep -v "^ROW" "$OUT/bench.log" | grep -v "^| " | tail -5 | cut -c1-300
[ -s "$OUT/bench.json" ] && python -m tools.checks.conv_gpu_check table --out "$OUT"
echo "# total $(el)s"
