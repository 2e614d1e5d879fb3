#!/usr/bin/env bash
# End-to-end decode benchmark on a GPU machine without network: installs the transformers wheels carried in
# .whl/hf into a private folder, then runs mixgemm.bench.e2e.run_e2e (Llama-3-8B shapes, random weights).
#   bash tools/bench/e2e_device.sh OUTDIR [BATCHES...]        (default batches: 1 4 16)
# Environment passes through (e.g. MIXGEMM_PDL=0 to time without programmatic dependent launch); E2E_DTYPE=bfloat16
# runs both models in bf16 (default float16).
set -uo pipefail
OUT=${1:?usage: bash tools/bench/e2e_device.sh OUTDIR [BATCHES...]}
shift
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
SITE=${TMPDIR:-/tmp}/mixgemm-hf-site
[ -d "$SITE" ] || python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/hf/*.whl
export PYTHONPATH="$PWD/src:$SITE"
python3 - "$OUT" "${@:-1 4 16}" <<'PY'
import json, os, sys
import torch
from mixgemm.bench.e2e import format_table, run_e2e
out, batches = sys.argv[1], [int(b) for a in sys.argv[2:] for b in a.split()]
dtype = getattr(torch, os.environ.get("E2E_DTYPE", "float16"))
rows = run_e2e("llama3-8b", batches=tuple(batches), log=lambda s: print(s, flush=True), dtype=dtype)
print(format_table(rows))
tag = ("pdl" if os.environ.get("MIXGEMM_PDL", "1") != "0" else "nopdl") + ("" if dtype == torch.float16 else "_bf16")
json.dump(rows, open(f"{out}/e2e_{tag}.json", "w"), indent=1)
PY
