# Sourced by demo.sh and test.sh (from the repository root): picks the Python and pins torch.
#
# Python: the active virtual environment, else ./.venv (created on first use with the system's packages visible).
# torch is installed only when `import torch` fails: the CPU wheel torch 2.13.0 (from a local wheel folder,
# MIXGEMM_WHEELS, default /opt/wheels, when it holds one), else "torch>=2.4" from the package index. An installed
# torch -- e.g. a CUDA build -- is never replaced: $PIN constrains every later install to its exact version.
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
