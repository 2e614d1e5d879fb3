"""CPU speed of mixgemm's weight-only layers against a float32 F.linear: prints a Markdown table.

    python tools/bench/cpu_linear.py [--reps 7] [--shapes 4096x14336,14336x4096] [--m 1,16]

Shapes are KxN (K input features, N output features). Rows per shape and M:

* fp32 / bf16 F.linear on the float weight (the baselines; "speed" is fp32 F.linear's time over the row's time);
* W4A16 g128 sym and W8A16 per-channel sym through mixgemm.matmul, on bfloat16 activations (torch's int4 / int8
  CPU kernels) and on float32 activations (the blockwise dequantizing fallback);
* "dequantize per call": the previous CPU path, the whole weight dequantized to float32 on every call.

Each repetition runs every row once in turn (so that load from other processes on a shared machine falls on all
rows alike); the table gives the median over repetitions. Threads: torch's default (printed).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import torch.nn.functional as F

import mixgemm
from mixgemm.formats.weight import QuantizedWeight, quantize_weight
from mixgemm.kernels.cpu import cpu_can_run


def dequantize_per_call(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    """The previous CPU path: the whole weight dequantized in float32 on each call, then F.linear."""
    n, k = qw.shape
    s = qw.scales.float()
    m = qw.offsets.float() if qw.mode == "offset" else -qw.zero_points().float() * s
    q = qw.codes().float().reshape(n, qw.num_groups, qw.group_size)
    w = torch.addcmul(m[..., None], q, s[..., None]).reshape(n, k)
    return F.linear(x.float(), w).to(x.dtype)


def _time_ms(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def bench_shape(k: int, n: int, ms: list[int], reps: int, gen: torch.Generator) -> list[dict]:
    w = torch.randn(n, k, generator=gen) * 0.02
    wb = w.bfloat16()
    q4 = quantize_weight(w, bits=4, group_size=128, mode="sym")
    q8 = quantize_weight(w, bits=8, group_size=-1, mode="sym")
    rows = []
    for m in ms:
        x = torch.randn(m, k, generator=gen)
        xb = x.bfloat16()
        cases = {
            "fp32 F.linear": lambda x=x: F.linear(x, w),
            "bf16 F.linear": lambda xb=xb: F.linear(xb, wb),
            "W4A16 g128 sym, bf16 x": lambda xb=xb: mixgemm.matmul(xb, q4),
            "W8A16 per-channel sym, bf16 x": lambda xb=xb: mixgemm.matmul(xb, q8),
            "W4A16 g128 sym, fp32 x": lambda x=x: mixgemm.matmul(x, q4),
            "W8A16 per-channel sym, fp32 x": lambda x=x: mixgemm.matmul(x, q8),
            "W4A16 g128 sym, dequantize per call": lambda x=x: dequantize_per_call(x, q4),
            "W8A16 per-channel sym, dequantize per call": lambda x=x: dequantize_per_call(x, q8),
        }
        routes = {"W4A16 g128 sym, bf16 x": cpu_can_run(xb, q4)[1], "W8A16 per-channel sym, bf16 x":
                  cpu_can_run(xb, q8)[1]}
        for fn in cases.values():  # warm-up: layouts built, allocator primed
            fn()
        times = {name: [] for name in cases}
        for _ in range(reps):
            for name, fn in cases.items():
                times[name].append(_time_ms(fn))
        base = statistics.median(times["fp32 F.linear"])
        for name, ts in times.items():
            med = statistics.median(ts)
            rows.append({"K": k, "N": n, "M": m, "method": name, "ms": med, "speed": base / med,
                         "route": routes.get(name, "")})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--shapes", default="4096x14336,14336x4096", help="comma-separated KxN")
    ap.add_argument("--m", default="1,16", help="comma-separated token counts")
    args = ap.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    ms = [int(v) for v in args.m.split(",")]
    rows = []
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.lower().split("x"))
        rows += bench_shape(k, n, ms, args.reps, gen)
    print(f"machine: {platform.machine()} CPU, {torch.backends.cpu.get_cpu_capability()}; torch {torch.__version__}, "
          f"torch.get_num_threads() = {torch.get_num_threads()}; median of {args.reps} round-robin repetitions\n")
    print("| K | N | M | method | ms | speed vs fp32 F.linear |")
    print("|---:|---:|---:|---|---:|---:|")
    for r in rows:
        print(f"| {r['K']} | {r['N']} | {r['M']} | {r['method']} | {r['ms']:.1f} | {r['speed']:.2f}x |")
    print()
    for r in rows:
        if r["route"] and r["M"] == ms[0]:
            print(f"route for {r['K']}x{r['N']} {r['method']}: {r['route']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
