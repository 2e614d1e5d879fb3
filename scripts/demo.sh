#!/usr/bin/env bash
# The README's main-job command: install mixgemm and run the demo (quantize a Llama-3-8B layer in several formats:
# bytes, compression, error; on a CUDA GPU the kernels run against the reference and are timed beside fp16 cuBLAS,
# on a CPU the CPU fallback runs and is timed). Extra arguments go to `mixgemm demo` (e.g. --shape 4096x4096 -m 16).
#
# Python: the active virtual environment, else ./.venv (created on first use with the system's packages visible).
# torch is installed only when `import torch` fails (as in scripts/test.sh); an installed torch is never replaced.
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
# with a CUDA GPU, the kernels' extras (NVRTC, cuda-bindings, triton); on a CPU, the package alone
EXTRAS=$("$PY" -c "import torch; print('[gpu]' if torch.cuda.is_available() else '')")
"$PY" -m pip install -q -c "$PIN" -e ".$EXTRAS"
"$PY" -m mixgemm demo "$@"
