#!/usr/bin/env bash
# The README's main-job command: install mixgemm and run the demo (quantize a Llama-3-8B layer in several formats:
# bytes, compression, error; on a CUDA GPU the kernels run against the reference and are timed beside fp16 cuBLAS,
# on a CPU the CPU fallback runs and is timed). Extra arguments go to `mixgemm demo` (e.g. --shape 4096x4096 -m 16).
# Python and torch: scripts/env.sh (an installed torch is never replaced).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh  # $PY: the venv's Python; $PIN: the installed torch version, for pip -c
# with a CUDA GPU, the kernels' extras (NVRTC, cuda-bindings, triton); on a CPU, the package alone
EXTRAS=$("$PY" -c "import torch; print('[gpu]' if torch.cuda.is_available() else '')")
"$PY" -m pip install -q -c "$PIN" -e ".$EXTRAS"
"$PY" -m mixgemm demo "$@"
