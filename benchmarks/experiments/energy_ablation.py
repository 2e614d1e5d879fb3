"""Where the energy of the int8 wgmma GEMM goes (issue #6, session 28): sustained windows (scripts/power_probe.py's
probe) of the GEMM alone -- activation codes quantized once, outside the graph -- with parts of the kernel switched
off by the experiment-only A8_ABLATE define (results wrong on purpose:
bit 1 XORs the partials instead of folding them, 2 no int4 unpack, 4 no I2FP),
beside the per-channel W4 / W8 GEMMs, the quantizer alone and fp16 cuBLAS. The ablated variants, PP (ping-pong) and
CVT 2 need int8_energy_ablation_pingpong_s28.patch (in this folder, against commit 82cedf0) applied; the script
refuses them otherwise (the kernel would ignore the keys and time the default build).

Usage: PYTHONPATH=src python benchmarks/experiments/energy_ablation.py [--shape 28672x8192] [--m 2048] [--seconds 3]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_int8 import clone_qw, copies_for, lay_bytes  # noqa: E402
from power_probe import print_rows, probe  # noqa: E402

from mixgemm.bench.protocol import capture_graph  # noqa: E402
from mixgemm.formats.weight import quantize_weight  # noqa: E402
from mixgemm.kernels.cuda import nvrtc  # noqa: E402
from mixgemm.kernels.cuda.gemm_wgmma_a8 import default_config, gemm_wgmma_a8  # noqa: E402
from mixgemm.kernels.triton.int8_layout import get_int8_layout  # noqa: E402
from mixgemm.ops.int8 import _act_bufs, _act_quant  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="28672x8192")
    ap.add_argument("--m", type=int, default=2048)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--variants", default="base,cvt1,xorfold,noi2f,w4pc,w8pc,w8bm256kt1,w8bm256kt2,quant,fp16")
    args = ap.parse_args()
    k, n = (int(v) for v in args.shape.split("x"))
    m = args.m
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    bufs = _act_bufs(m, k, 1, x.device)
    aq, sa, _, _ = _act_quant(x, k, "sym", out=bufs)  # per token
    out = torch.empty(m, n, dtype=torch.float16, device="cuda")
    inf = math.inf
    weights = {}

    def copies(bits, group):
        if (bits, group) not in weights:
            qw = quantize_weight(torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02, bits=bits,
                                 group_size=group, mode="sym")
            c = copies_for(lay_bytes(get_int8_layout(qw)))
            weights[(bits, group)] = [qw] + [clone_qw(qw) for _ in range(c - 1)]
        return weights[(bits, group)]

    def gemm(bits, group, **over):
        qws = copies(bits, group)
        cfg = {**default_config(m, n, k, group if group > 0 else k, bits), **over}
        return [lambda q=q: gemm_wgmma_a8(aq, sa, q, None, -inf, inf, torch.float16, config=cfg, out=out)
                for q in qws], len(qws)

    # name, weight (bits, group), config overrides, ablated (wrong results on purpose)
    table = {
        "base": ("W4 g128 per-token", (4, 128), {}, False),
        "cvt1": ("W4 g128 per-token CVT 1", (4, 128), {"CVT": 1}, False),
        "xorfold": ("W4 g128, XOR for the fold", (4, 128), {"ABLATE": 1}, True),
        "noi2f": ("W4 g128, fold without I2FP", (4, 128), {"ABLATE": 4}, True),
        "nounpack": ("W4 g128, no unpack", (4, 128), {"ABLATE": 2}, True),
        "mc1": ("W4 g128 per-token MC 1", (4, 128), {"MC": 1}, False),
        "pp": ("W4 g128 per-token PP", (4, 128), {"PP": 1}, False),
        "ppmc1": ("W4 g128 per-token PP MC 1", (4, 128), {"PP": 1, "MC": 1}, False),
        "w8pp": ("W8 per-channel PP", (8, -1), {"PP": 1}, False),
        "w8bm256pp": ("W8 per-channel BM 256 KT 2 ST 2 PP", (8, -1), {"BM": 256, "KT": 2, "STAGES": 2, "PP": 1}, False),
        "w4pc": ("W4 per-channel", (4, -1), {}, False),
        "w8pc": ("W8 per-channel", (8, -1), {}, False),
        "w8bm256kt1": ("W8 per-channel BM 256 KT 1 ST 4", (8, -1), {"BM": 256, "KT": 1, "STAGES": 4}, False),
        "w8bm256kt2": ("W8 per-channel BM 256 KT 2 ST 2", (8, -1), {"BM": 256, "KT": 2, "STAGES": 2}, False),
        "w8bm256kt1mc1": ("W8 per-channel BM 256 KT 1 ST 4 MC 1", (8, -1),
                          {"BM": 256, "KT": 1, "STAGES": 4, "MC": 1}, False),
    }
    hooks = "A8_ABLATE" in nvrtc.read_source("gemm_wgmma_a8.cu")
    needs = [v for v in args.variants.split(",") if v in table and set(table[v][2]) & {"ABLATE", "PP"}]
    if needs and not hooks:
        sys.exit(f"{needs} need int8_energy_ablation_pingpong_s28.patch applied to gemm_wgmma_a8.cu / .py")
    methods = {}
    first = {}  # weight -> output of the first exact variant on it: the others must be bit-equal
    for v in args.variants.split(","):
        if v == "fp16":
            ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02 for _ in range(copies_for(n * k * 2))]
            methods["fp16 cuBLAS"] = ([lambda w=w: F.linear(x, w) for w in ws], len(ws))
        elif v == "quant":
            methods["act quant per-token only"] = ([lambda: _act_quant(x, k, "sym", out=bufs)], 1)
        else:
            name, (bits, group), over, ablated = table[v]
            methods[name] = gemm(bits, group, **over)
            if not ablated:
                methods[name][0][0]()
                y = out.clone()
                if (bits, group) in first:
                    print(f"{name}: bit-equal to {first[(bits, group)][0]}: "
                          f"{torch.equal(y, first[(bits, group)][1])}", flush=True)
                else:
                    first[(bits, group)] = (name, y)
    graphs = {name: (capture_graph(fns), c) for name, (fns, c) in methods.items()}
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}; {k}x{n} M = {m}, GEMM only "
          f"(activations quantized outside the graph), {args.seconds} s per window")
    print_rows(probe(graphs, args.seconds), 2 * m * n * k)


if __name__ == "__main__":
    main()
