"""Protocol timing of the small-M tensor-core GEMM (mixgemm.kernels.cuda.gemm_mma) next to fp16 cuBLAS.

Method (shared/benchmark-protocol.md): C layer copies > 3x L2, one CUDA graph calling them back to back on
the same activation, median replay (do_bench) / C; fp16 F.linear timed the same way in the same process.
Every case is first checked against the float64 reference. Floor = max(bytes / copy bandwidth,
flops / fp16 matmul rate), bytes = packed weights + params + activations in + output out.

Usage: PYTHONPATH=src python scripts/bench_gemm_mma.py [--sweep] [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import mixgemm.reference as ref
from mixgemm.bench.protocol import graph_time_us
from mixgemm.formats.weight import quantize_weight
from mixgemm.kernels.cuda import gemm_mma as gm

INF = math.inf


def ceilings():
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    bw = 2 * n / (do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median") * 1e-3)
    sq = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    fl = 2 * 8192**3 / (do_bench(lambda: sq @ sq, warmup=25, rep=100, return_mode="median") * 1e-3)
    return bw, fl


def copies_for(nbytes: int) -> int:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(3, math.ceil(3 * l2 / nbytes) + 1)


def quant(k, n, bits, group, mode):
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    return quantize_weight(w, bits=bits, group_size=group, mode=mode, scale_dtype=torch.float16)


def floor_us(k, n, m, bits, group, mode, bw, fl):
    g = k if group == -1 else group
    per = 2 if mode == "sym" else 4
    by = n * k * bits // 8 + n * (k // g) * per + m * k * 2 + m * n * 2
    return max(by / bw, 2 * m * n * k / fl) * 1e6


_cublas: dict = {}


def cublas_us(k, n, m):
    key = (k, n, m)
    if key not in _cublas:
        ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02 for _ in range(copies_for(n * k * 2))]
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        _cublas[key] = graph_time_us([lambda w=w: F.linear(x, w) for w in ws], warmup_ms=10, rep_ms=60)
        del ws
        torch.cuda.empty_cache()
    return _cublas[key]


class Layer:
    def __init__(self, k, n, bits, group, mode):
        self.k, self.n, self.bits, self.group, self.mode = k, n, bits, group, mode
        self.qws = [quant(k, n, bits, group, mode) for _ in range(copies_for(n * k * bits // 8))]
        self.xr: dict = {}

    def x_ref(self, m):
        if m not in self.xr:
            x = torch.randn(m, self.k, device="cuda", dtype=torch.float16)
            self.xr[m] = (x, ref.matmul(x, self.qws[0], out_dtype=torch.float64))
        return self.xr[m]

    def time(self, m, cfg=None, rep=60):
        x, r = self.x_ref(m)
        gm.CFG_OVERRIDE = cfg
        try:
            y = gm.gemm_mma(x, self.qws[0], None, -INF, INF)
            err = float((y.double() - r).norm() / r.norm())
            t = graph_time_us([lambda q=q: gm.gemm_mma(x, q, None, -INF, INF) for q in self.qws],
                              warmup_ms=10, rep_ms=rep)
            props = torch.cuda.get_device_properties(0)
            used = gm.choose_config(m, self.n, self.k, props.multi_processor_count, self.bits, gm.smem_limit_of(props))
            used = {k_: used[k_] for k_ in ("W", "R", "S", "SK", "ST")}
        finally:
            gm.CFG_OVERRIDE = None
        return t, err, used


def sweep_configs(m, bits):
    """~24 tile structures around the rule's choice: (W, R) pairs x split-K 1..4, plus ST = 3."""
    mb = gm.m_block(m)
    if mb <= 4:
        wr = [(4, 2), (7, 2), (8, 2), (7, 4), (8, 4), (8, 1)]
    else:
        wr = [(4, 1), (7, 1), (8, 1), (4, 2), (7, 2), (8, 2)]
    out = [{"W": w, "R": r, "S": s, "ST": 4} for (w, r), s in itertools.product(wr, (1, 2, 3, 4)) if r * mb <= 16]
    r = 2 if mb <= 8 else 1
    sk = 2 if bits == 4 else 4  # the rule's stage (128 k); also half and double that
    return out + [{"W": 7, "R": r, "S": 1, "ST": 3}, {"W": 8, "R": r, "S": 1, "SK": 2 * sk, "ST": 3},
                  {"W": 8, "R": r, "S": 1, "SK": sk // 2, "ST": 6}]


def mma_peak(act: int = 0) -> dict:
    """Raw mma.sync m16n8k16 fp32-accumulate rate (gemm_mma.cu GM_PEAK kernel): TFLOP/s for 4 / 8 / 16 warps
    per SM (one block per SM) and 8 independent accumulator chains per warp; clocks per mma per sub-partition."""
    import ctypes

    from mixgemm.kernels.cuda import nvrtc

    props = torch.cuda.get_device_properties(0)
    fn = nvrtc.get_function("gemm_mma.cu", "mixgemm_mma_peak", {"GM_PEAK": 8, "GM_ACT": act}, torch.device("cuda"))
    res = {}
    iters = 4096
    for warps in (4, 8, 16):
        blocks = props.multi_processor_count
        out = torch.empty(blocks * warps * 32, device="cuda")
        args = [ctypes.c_void_p(out.data_ptr()), ctypes.c_int(iters), ctypes.c_uint(12345)]

        def run(fn=fn, blocks=blocks, warps=warps, args=args):
            nvrtc.launch(fn, (blocks, 1, 1), (32 * warps, 1, 1), args, torch.cuda.current_stream().cuda_stream)

        ms = do_bench(run, warmup=10, rep=50, return_mode="median")
        mmas = blocks * warps * iters * 8
        clk = props.clock_rate * 1e3 if hasattr(props, "clock_rate") else 1.98e9
        res[warps] = dict(tflops=mmas * 2 * 16 * 8 * 16 / (ms * 1e-3) / 1e12,
                          clk_per_mma_smsp=(ms * 1e-3) * clk / (mmas / (blocks * 4)))
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--budget", type=float, default=150.0, help="seconds for the sweep")
    ap.add_argument("--mma-peak", action="store_true", help="also measure the raw mma.sync rate")
    ap.add_argument("--pre", action="store_true", help="also time every case with GM_PRE=1 (same config)")
    args = ap.parse_args()
    t0 = time.time()
    bw, fl = ceilings()
    props = torch.cuda.get_device_properties(0)
    print(f"GPU {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}; "
          f"copy {bw / 1e12:.2f} TB/s, fp16 matmul {fl / 1e12:.0f} TFLOP/s")
    if args.mma_peak:
        for act, name in ((0, "fp16"), (1, "bf16")):
            pk = mma_peak(act)
            print(f"mma.sync m16n8k16 {name}->fp32 peak: " + ", ".join(
                f"{w} warps/SM {v['tflops']:.0f} TFLOP/s ({v['clk_per_mma_smsp']:.1f} clk/mma/SMSP)"
                for w, v in pk.items()), flush=True)
    rows = []
    sweeps = {}
    cases = [  # (k, n, bits, group, mode, Ms)
        (8192, 28672, 4, 128, "zero_point", (17, 32, 64, 128)),
        (4096, 14336, 4, 128, "zero_point", (17, 32, 64, 128)),
        (8192, 28672, 4, 128, "sym", (32, 64)),
        (4096, 14336, 4, 128, "sym", (32, 64)),
        (8192, 28672, 8, -1, "sym", (32, 64)),
        (4096, 14336, 8, -1, "sym", (32, 64)),
        (14336, 4096, 4, 128, "zero_point", (32, 64)),
        (28672, 8192, 4, 128, "zero_point", (32, 64)),
        (4096, 4096, 4, 128, "zero_point", (32, 64)),
    ]
    for k, n, bits, group, mode, ms in cases:
        lay = Layer(k, n, bits, group, mode)
        for m in ms:
            t, err, used = lay.time(m)
            cb = cublas_us(k, n, m)
            fu = floor_us(k, n, m, bits, group, mode, bw, fl)
            row = dict(k=k, n=n, bits=bits, group=group, mode=mode, m=m, us=t, cublas_us=cb, ratio=cb / t,
                       pct_floor=100 * fu / t, floor_us=fu, err=err, cfg=used)
            target = (k, n) in ((8192, 28672), (4096, 14336)) and (mode != "sym" or bits == 8)
            if args.sweep and target and m in (32, 64) and time.time() - t0 < args.budget:
                res = []
                for c in sweep_configs(m, bits):
                    try:
                        tc, ec, _ = lay.time(m, c, rep=30)
                    except Exception as e:  # noqa: BLE001 - report and go on
                        print("cfg", c, "failed:", str(e)[:120])
                        continue
                    res.append((tc, ec, c))
                res.sort(key=lambda v: v[0])
                sweeps[f"{k}x{n} W{bits} g{group} {mode} M{m}"] = res[:8]
                print(f"sweep {k}x{n} W{bits} M={m}: default {t:.1f} {used} | " +
                      "  ".join(f"{c['W']}/{c['R']}/{c['S']}/{c.get('SK', '-')}/{c['ST']}:{tc:.1f}"
                                for tc, ec, c in res[:6]) +
                      f" | worst {res[-1][0]:.1f} maxerr {max(e for _, e, _ in res):.1e}", flush=True)
                if res:
                    row["best_us"], row["best_cfg"] = res[0][0], res[0][2]
            if args.pre:
                tp, ep, _ = lay.time(m, {**used, "PRE": 1})
                row["pre_us"], row["pre_err"] = tp, ep
            rows.append(row)
            print(f"{k}x{n} W{bits} g{group} {mode} M={m}: {t:.1f} us, cuBLAS {cb:.1f}, ratio {cb / t:.2f}, "
                  f"{row['pct_floor']:.0f}% floor, err {err:.1e}, cfg {used}", flush=True)
        del lay
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpu=props.name, bw=bw, flops=fl, rows=rows, sweeps={k: [(t, e, c) for t, e, c in v]
                                                                            for k, v in sweeps.items()}), f, indent=1)
    print("\n| K x N | W | M | ours us | best-sweep us (W/R/S) | PRE=1 us (err) | fp16 cuBLAS us | ratio | % floor "
          "| rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        fmt = f"W{r['bits']} g{r['group']} {r['mode']}"
        best = (f"{r['best_us']:.1f} ({r['best_cfg']['W']}/{r['best_cfg']['R']}/{r['best_cfg']['S']})"
                if "best_us" in r else "-")
        pre = f"{r['pre_us']:.1f} ({r['pre_err']:.0e})" if "pre_us" in r else "-"
        print(f"| {r['k']}x{r['n']} | {fmt} | {r['m']} | {r['us']:.1f} | {best} | {pre} | {r['cublas_us']:.1f} | "
              f"{r['ratio']:.2f} | {r['pct_floor']:.0f}% | {r['err']:.1e} |")
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
