#!/usr/bin/env bash
# The README's main-job command: install mixgemm on a fresh machine and run the demo (quantize a Llama-3-8B
# layer in several formats: bytes, compression, error; on a CUDA GPU the kernels run against the reference and
# are timed beside fp16 cuBLAS, on a CPU the CPU fallback runs). Extra arguments go to `mixgemm demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0" || python -m pip install -q "torch>=2.4"
python -m pip install -q -e .
python -m mixgemm demo "$@"
