"""Whole int8-activation calls at small M (activation quantization + the GEMM, as a layer runs them) on the CUDA int8
GEMM with candidate tiles, beside the Triton int8 kernel and what the dispatcher picks; benchmark protocol timing
(CUDA graph over C layer copies > 3x L2, median / C). Why whole calls and not the GEMM alone
(tools/bench/wgmma_a8.py): back to back, one GEMM's programmatic dependent launch starts the next while its last
wave drains, which hides a tile count just past the SMs; between the quantizer's launches it does not.

    PYTHONPATH=src python -m tools.bench.a8_small_m --shapes 3584x18944,8192x28672 --ms 5,16 \
        --formats w8pc,w4g,w4t,w4qt --cfgs '[{"BM": 64}, {"BM": 16, "NWG": 1}]'

Formats: w8pc (W8A8 per-channel), w4g (W4A8 g128, activation scales per block), w4t (W4A8 g128 per token), w4qt
(per token, integer group scales). A --cfgs entry is merged over the dispatcher's config for the case (so {"BM": 64}
keeps its SPLIT, STAGES and the rest; give SPLIT to override it). Columns: now (the dispatch as it is), triton (the
Triton kernel forced), cuda (the CUDA GEMM with the dispatcher's config), then each candidate; ratios to ``now``.
"""

from __future__ import annotations

import argparse
import json

import torch

from mixgemm.formats.int_scales import quantize_weight_int_scales
from mixgemm.formats.weight import quantize_weight
from mixgemm.kernels.cuda_wgmma_a8 import config as _wgmma_a8_config
from mixgemm.kernels.int8_activations import a8_problem
from tools.bench.gemv_a8_wg import time_a8_calls
from tools.bench.int8 import clone_qw, copies_for

ENTRY = "cuda_wgmma_a8"
# name: (bits, group, act_block, integer group scales)
FORMATS = {"w8pc": (8, -1, "group", False), "w4g": (4, 128, "group", False), "w4t": (4, 128, "token", False),
           "w4qt": (4, 128, "token", True)}


def _weights(k: int, n: int, bits: int, group: int, int_scales: bool):
    torch.manual_seed(k + n + bits)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    qw = (quantize_weight_int_scales(w, group_size=group) if int_scales
          else quantize_weight(w, bits=bits, group_size=group, mode="sym"))
    return [qw] + [clone_qw(qw) for _ in range(copies_for(n * k * bits // 8) - 1)]


def _time(x, qws, block: str, opts: dict) -> float:
    return time_a8_calls(x, qws, block, opts, rep=50)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="3584x18944,8192x28672,14336x4096,4096x14336,4096x4096")
    ap.add_argument("--ms", default="5,16")
    ap.add_argument("--formats", default="w8pc,w4g,w4t,w4qt")
    ap.add_argument("--cfgs", default='[{"BM": 64}]')
    args = ap.parse_args()
    cands = json.loads(args.cfgs)
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        for fmt in args.formats.split(","):
            bits, group, block, int_scales = FORMATS[fmt]
            qws = _weights(k, n, bits, group, int_scales)
            for m in (int(v) for v in args.ms.split(",")):
                x = torch.randn(m, k, device="cuda", dtype=torch.float16)
                p = a8_problem(m, qws[0], x.dtype, x.device, "sym", block == "token")
                rule = _wgmma_a8_config(p)
                t_now = _time(x, qws, block, {})
                t_tri = _time(x, qws, block, {"force": "triton_a8"})
                cols = [("triton", t_tri), ("cuda", _time(x, qws, block, {"force": ENTRY, "configs": {ENTRY: rule}}))]
                for c in cands:
                    cfg = {**rule, **c}
                    try:
                        cols.append((json.dumps(c, separators=(",", ":")),
                                     _time(x, qws, block, {"force": ENTRY, "configs": {ENTRY: cfg}})))
                    except Exception as e:  # noqa: BLE001 - a tile that does not launch: report, go on
                        print(f"  {shape} M{m} {fmt} {cfg}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                rule_s = f"BM {rule['BM']} SPLIT {rule.get('SPLIT', 1)}"
                print(f"{shape:>11} M{m:<3} {fmt:5s} now {t_now:7.2f} us ({rule_s}) | "
                      + " | ".join(f"{name} {t:7.2f} ({t / t_now:.2f})" for name, t in cols), flush=True)
            del qws
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
