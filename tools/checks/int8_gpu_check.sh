#!/usr/bin/env bash
# The int8 path on a GPU in one call: its GPU tests, a same-run GEMM-only A/B of int8 wgmma tiles, and the
# acceptance rows (activation quantization included), logs under OUTDIR.
#
#   bash tools/checks/int8_gpu_check.sh OUTDIR [STEPS]
#   STEPS: any of tests,ab,accept,acceptqs,nopdl,acceptall,acceptw8,power (default: all)
#
# tests: tests/kernels/test_gemm_wgmma_a8.py, tests/kernels/test_int8.py and the quantizer / PDL cases of tests/kernels/test_gemv_a8.py
# (-m gpu, 8 processes, INT8_TEST_S seconds, 240); ab: tools/bench/wgmma_a8.py --repeat 3 on the acceptance shapes,
# GEMM only, configs in INT8_AB_CFGS (JSON list; default: the default tile with MC 1 and MC 2, PDL off);
# accept: tools.bench.int8 --accept --token --repeat R (W4A8 g128 per-token rows); acceptqs: the same rows with int4
# weights of integer group scales (--int-scales: formats/int_scales.py, the GEMM without the per-group fold); nopdl: the same with MIXGEMM_PDL=0;
# acceptall: tools.bench.int8 --accept --repeat R (W8A8 and per-group W4A8 rows); acceptw8: the W8A8 rows as dispatched
# and with int8 per-channel on the CUDA kernel at every M (--w8-cuda); power: tools/bench/power_probe.py (3 s
# sustained windows per method: clock, power, energy per call) on 28672x8192 M 2048 and 8192x28672 M 4096.
# INT8_REPEAT: the rounds R of the accept steps (3); INT8_REP_MS: each timing's window (ms, 100). nvidia-smi samples
# the SM clock, power and throttle reasons every 200 ms into int8_smi.csv throughout, int8_steps.txt the step starts
# (the acceptance rows run at the 700 W cap: the clock under load says how hard). Exit status: the tests' status.
set -uo pipefail
OUT=${1:?usage: bash tools/checks/int8_gpu_check.sh OUTDIR [tests,ab,accept,acceptqs,nopdl,acceptall,acceptw8,power]}
STEPS=${2:-tests,ab,accept,acceptqs,nopdl,acceptall,acceptw8,power}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  > "$OUT/int8_env.txt" 2>&1
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" \
  >> "$OUT/int8_env.txt" 2>&1
cat "$OUT/int8_env.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active \
  --format=csv -lms 200 > "$OUT/int8_smi.csv" 2>&1 &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT
step() { echo "$(date +%T.%N | cut -c1-12) $1" >> "$OUT/int8_steps.txt"; }  # to line the samples up with the steps
R=${INT8_REPEAT:-3}
RMS=${INT8_REP_MS:-100}
rc=0
has() { [[ ",$STEPS," == *",$1,"* ]]; }
if has tests; then
  step tests
  t0=$(date +%s)
  timeout -k 10 "${INT8_TEST_S:-240}" "$PY" -m tools.checks.par_pytest 8 -m gpu tests/kernels/test_gemm_wgmma_a8.py tests/kernels/test_int8.py \
    tests/kernels/test_gemv_a8.py -k "not test_gemv_a8.py or act_quant_rows or pdl" > "$OUT/int8_tests.log" 2>&1
  rc=$?
  echo "== tests rc=$rc in $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|error" "$OUT/int8_tests.log" | tail -n 12
fi
if has ab; then
  step ab
  CFGS=${INT8_AB_CFGS:-'[{"BM":128,"NWG":2,"STAGES":4,"KT":2,"NP":1,"MC":1,"PDL":0},{"BM":128,"NWG":2,"STAGES":4,"KT":2,"NP":1,"MC":2,"PDL":0}]'}
  timeout -k 10 "${INT8_AB_S:-300}" "$PY" -m tools.bench.wgmma_a8 --shapes 28672x8192,8192x28672 --ms 2048,4096 \
    --formats ${INT8_AB_FORMATS:-w4g128t,w4g128} --cfgs "$CFGS" --repeat 3 --no-triton --out "$OUT/int8_ab.json" > "$OUT/int8_ab.log" 2>&1
  echo "== ab rc=$?"; grep -E "cuda \{|FAILED" "$OUT/int8_ab.log" | sed 's/  */ /g' | cut -c1-200
fi
if has accept; then
  step accept
  timeout -k 10 "${INT8_ACCEPT_S:-300}" "$PY" -m tools.bench.int8 --accept --token --repeat "$R" --rep-ms "$RMS" > "$OUT/int8_accept_token.log" 2>&1
  echo "== accept --token rc=$?"; tail -n 10 "$OUT/int8_accept_token.log"
fi
if has acceptqs; then
  step acceptqs
  timeout -k 10 "${INT8_ACCEPT_S:-300}" "$PY" -m tools.bench.int8 --accept --token --int-scales --repeat "$R" \
    --rep-ms "$RMS" > "$OUT/int8_accept_token_qs.log" 2>&1
  echo "== accept --token --int-scales rc=$?"; tail -n 10 "$OUT/int8_accept_token_qs.log"
fi
if has nopdl; then
  step nopdl
  MIXGEMM_PDL=0 timeout -k 10 "${INT8_ACCEPT_S:-300}" "$PY" -m tools.bench.int8 --accept --token --repeat "$R" --rep-ms "$RMS" \
    > "$OUT/int8_accept_token_nopdl.log" 2>&1
  echo "== accept --token, MIXGEMM_PDL=0 rc=$?"; tail -n 9 "$OUT/int8_accept_token_nopdl.log"
fi
if has acceptall; then
  step acceptall
  timeout -k 10 "${INT8_ACCEPTALL_S:-420}" "$PY" -m tools.bench.int8 --accept --repeat "$R" --rep-ms "$RMS" > "$OUT/int8_accept.log" 2>&1
  echo "== accept rc=$?"; tail -n 20 "$OUT/int8_accept.log"
fi
if has acceptw8; then
  step acceptw8
  for v in triton cuda; do  # the W8A8 rows as dispatched today (Triton from M = 1024), then on the CUDA kernel
    flag=""; [[ $v == cuda ]] && flag="--w8-cuda"
    timeout -k 10 "${INT8_ACCEPT_S:-300}" "$PY" -m tools.bench.int8 --accept --w8-only $flag --repeat "$R" \
      --rep-ms "$RMS" > "$OUT/int8_accept_w8_$v.log" 2>&1
    echo "== accept W8A8 ($v) rc=$?"; tail -n 7 "$OUT/int8_accept_w8_$v.log"
  done
fi
if has power; then
  step power
  for shape in 28672x8192:2048 8192x28672:4096; do
    timeout -k 10 "${INT8_POWER_S:-200}" "$PY" -m tools.bench.power_probe --shape "${shape%%:*}" --m "${shape##*:}" \
      > "$OUT/int8_power_${shape%%:*}_m${shape##*:}.log" 2>&1
    echo "== power $shape rc=$?"; tail -n 11 "$OUT/int8_power_${shape%%:*}_m${shape##*:}.log"
  done
fi
exit $rc
