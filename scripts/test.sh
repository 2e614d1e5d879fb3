#!/usr/bin/env bash
# The README's test command: install mixgemm with its test extras on a fresh machine and run the suite.
# CPU machines run the references, the Triton kernels under the interpreter and NVRTC compile checks;
# GPU tests (marked `gpu`) run where CUDA is available.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "torch==2.13.0" || python -m pip install -q "torch>=2.4"
python -m pip install -q -e ".[test]"
ruff check src tests scripts
python -m pytest -q -p no:cacheprovider tests
