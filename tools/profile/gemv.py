"""Launch one GEMV case a few times so that Nsight Compute can profile it (tools/profile/gemv.sh).

Usage: PYTHONPATH=src python -m tools.profile.gemv K N M BITS GROUP KERNEL [CFG_JSON]
KERNEL: simt | mma (the registry entries cuda_gemv / cuda_gemv_mma, forced through mixgemm.kernel_options);
CFG_JSON: optional tile config for that kernel ({"R":4,"U":2,"KS":2} or {"U":2,"KS":8,"DEFER":1}).
Weight mode: zero point for int4 and sym for int8 unless GEMV_PROFILE_MODE names one (sym, zero_point, offset).
GEMV_PROFILE_COMPACT=1: the weights keep only their wgmma_v1 layout (what quantize_ leaves a model with), so "mma"
runs on wgmma_v1 (the CUDA-core tile at M = 1 where the dispatcher would pick it); GEMV_PROFILE_COMPACT=rows_v1: the
int8 weights keep only rows_v1 (QuantLinear.compact_("rows_v1")), both kernels read it.
"""

from __future__ import annotations

import json
import math
import os
import sys

import torch

import mixgemm
from mixgemm.formats.weight import compact_placeholder, quantize_weight
from mixgemm.kernels.cuda import gemv_direct
from mixgemm.ops.custom_ops import compact_weight
from tools.bench.kernel_choice import gemv_options


def main():
    k, n, m, bits, group = (int(v) for v in sys.argv[1:6])
    kind = sys.argv[6]
    cfg = json.loads(sys.argv[7]) if len(sys.argv) > 7 else None
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    mode = os.environ.get("GEMV_PROFILE_MODE") or ("zero_point" if bits == 4 else "sym")
    qws = [quantize_weight(w, bits=bits, group_size=group, mode=mode) for _ in range(3)]
    compact = os.environ.get("GEMV_PROFILE_COMPACT", "0")
    layout = {"0": None, "1": "wgmma_v1"}.get(compact, compact)  # the layout the weights keep (None: plain)
    if layout:
        qws = [compact_weight(q, compact_placeholder(q.qweight), layout) for q in qws]
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    with gemv_options(kind, cfg):
        for i in range(6):  # ncu --launch-skip 3 --launch-count 1 picks one launch on a cold-ish weight copy
            if layout:  # through the dispatcher, which hands a compacted weight its config on that layout
                mixgemm.matmul(x, qws[i % 3])
            else:
                gemv_direct.gemv(x, qws[i % 3], None, -math.inf, math.inf)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
