#!/usr/bin/env bash
# Superseded by scripts/conv_gpu_check.sh (one call: tests + ResNet-50 + layer sweep + measured table, ~140 s).
# One GPU session for issue 8 (conv): ResNet-50 end-to-end check, conv benchmark (+ tile sweep), GPU tests.
# Env knobs: OUT (log dir), BENCH_ARGS, BUDGET (s for the bench loop), TEST_K (pytest -k), TEST_T (s).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=src
OUT=${OUT:-/tmp/conv_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
T0=$(date +%s)
timeout "${RESNET_T:-80}" python - > "$OUT/resnet.log" 2>&1 <<'PY'
import sys
sys.path.insert(0, "scripts")
import bench_conv as b
for bits in (8, 4):
    try:
        print("RESNET50", b.resnet50_check(bits=bits, batch=2, time_it=True), flush=True)
    except Exception as e:
        import traceback; traceback.print_exc()
        print("RESNET50 FAILED", bits, type(e).__name__, e, flush=True)
PY
grep -h "RESNET50\|Error" "$OUT/resnet.log" | cut -c1-400
echo "# resnet stage $(( $(date +%s) - T0 ))s"
timeout "${BENCH_T:-200}" python scripts/bench_conv.py ${BENCH_ARGS:---sweep} --budget-s "${BUDGET:-150}" \
    --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
grep -v "^    " "$OUT/bench.log" | cut -c1-220
echo "# bench stage $(( $(date +%s) - T0 ))s"
if [ -n "${TEST_K:-}" ]; then
  timeout "${TEST_T:-60}" python -m pytest -x -q -p no:cacheprovider tests/test_conv.py -k "$TEST_K" \
      > "$OUT/pytest.log" 2>&1
  tail -15 "$OUT/pytest.log"
fi
echo "# total $(( $(date +%s) - T0 ))s"
