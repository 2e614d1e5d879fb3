#!/usr/bin/env bash
# GPU check in one call: the GPU test suite + the quick benchmark, logs/JSON/plot left in OUTDIR.
#
#   bash tools/checks/gpu_check.sh OUTDIR
#
# For a GPU machine with torch + triton preinstalled and no network; runs mixgemm from this source tree
# (PYTHONPATH=src, nothing is installed from the network). Optional wheels in .whl/ (e.g. gemlite, a
# pure-Python peer: `pip wheel --no-deps --no-build-isolation -w .whl gemlite`) are installed offline into
# a private folder first. Output: env.txt, tests.log, bench.log and the quick benchmark's results/<gpu>/quick.{json,md,png}
# (the layout of benchmarks/results: copy results/<gpu> there and run
# `python -m mixgemm report --write --readme docs/benchmarking.md` to publish).
# Exit status: 0 when the tests pass and the benchmark found no wrong result.
# Time: the tests are capped at 600 s (16 processes sharing one on-disk cubin cache; a fresh H100 machine needs about
# 9-10 minutes for the whole GPU suite, most of it compiling) and the benchmark at 240 s; override with
# GPU_CHECK_TEST_S / GPU_CHECK_BENCH_S / GPU_CHECK_PROCS. tests.log lists each test's result as it lands, so a run
# cut short still says which tests passed. Most of the quick benchmark's time on a fresh machine is Triton
# compilation/autotuning of gemlite and mixgemm kernels.
set -uo pipefail
OUT=${1:?usage: bash tools/checks/gpu_check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
{
  echo "== gpu_check $(date -u +%FT%TZ) in $PWD"
  if compgen -G ".whl/*.whl" > /dev/null; then
    SITE=${TMPDIR:-/tmp}/mixgemm-whl-site
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl \
      && export PYTHONPATH="$PYTHONPATH:$SITE" && echo "installed offline: $(ls .whl)"
  else
    echo "no .whl/ folder: optional peers (gemlite) are skipped unless already installed"
  fi
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv 2>&1
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'gpu', torch.cuda.is_available() and torch.cuda.get_device_name())"
  "$PY" -c "import gemlite; print('gemlite', gemlite.__version__)" 2>&1 | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

t0=$(date +%s)
# the GPU tests in GPU_CHECK_PROCS processes (kernel compilation, NVRTC and Triton, is the slow part and
# single-threaded per process). With pytest-xdist, work stealing keeps every process busy to the end (the
# compile-heavy files no longer pile up at the tail of fixed chunks) and -v logs each result as it lands, so a run
# cut short still says which tests passed; without it, tools/checks/par_pytest.py splits the tests in fixed chunks.
export MIXGEMM_CUBIN_CACHE=${MIXGEMM_CUBIN_CACHE:-${TMPDIR:-/tmp}/mixgemm-cubin}
if "$PY" -c "import xdist" 2> /dev/null; then
  timeout -k 10 "${GPU_CHECK_TEST_S:-600}" "$PY" -m pytest -v -p no:cacheprovider -n "${GPU_CHECK_PROCS:-16}" \
    --dist worksteal -m gpu tests > "$OUT/tests.log" 2>&1
  rc_tests=$?
else
  timeout -k 10 "${GPU_CHECK_TEST_S:-600}" "$PY" -m tools.checks.par_pytest "${GPU_CHECK_PROCS:-16}" --logs "$OUT/tests" \
    -m gpu tests > "$OUT/tests.log" 2>&1
  rc_tests=$?
  tar czf "$OUT/tests-logs.tgz" -C "$OUT" tests && rm -rf "$OUT/tests"  # one file instead of one per process
fi
[ "$rc_tests" -eq 5 ] && { echo "(no gpu-marked tests collected)" >> "$OUT/tests.log"; rc_tests=0; }
t1=$(date +%s)
echo "== tests: rc=$rc_tests in $((t1 - t0)) s ($OUT/tests.log); last lines:"
tail -n 15 "$OUT/tests.log"

timeout -k 10 "${GPU_CHECK_BENCH_S:-240}" "$PY" -m mixgemm bench --quick --plot --no-progress --out "$OUT/results" > "$OUT/bench.log" 2>&1
rc_bench=$?
t2=$(date +%s)
echo "== bench --quick: rc=$rc_bench in $((t2 - t1)) s ($OUT/bench.log); the table:"
MD=$(ls "$OUT"/results/*/quick.md 2>/dev/null | head -n 1)
if [ -n "$MD" ]; then
  sed -n '/^| K x N | M | W4 floor/,/^$/p' "$MD"
  sed -n '/ratios within/,$p' "$MD" | head -n 8
else
  tail -n 40 "$OUT/bench.log"
fi
grep -E "WRONG|ERROR|not run" "$OUT/bench.log" | cut -c1-220 | head -n 20
echo "== gpu_check done: tests rc=$rc_tests, bench rc=$rc_bench, $((t2 - t0)) s; files: $(ls "$OUT" | tr '\n' ' ')"
[ "$rc_tests" -eq 0 ] && [ "$rc_bench" -eq 0 ]
