"""Host time of one eager QuantLinear call, piece by piece, beside nn.Linear: back-to-back calls without a sync (the
rate an eager decode loop issues layers at), then the per-call pieces of the plan path (weight lookup, plan lookup,
the prepared launch alone), the GPU time of the same call (replayed from a CUDA graph: what back-to-back calls cannot
go below), with --compiled the same calls under torch.compile without CUDA graphs, and a cProfile of the call.
Schemes: W4A16, W8A16, W8A8 and W4A8 (per-token activations), on a 2048x2048 fp16 layer at M = 1, 16 and 512.

    PYTHONPATH=src python -m tools.profile.eager_overhead --out DIR [--compiled]

Writes DIR/eager_overhead.json and DIR/eager_overhead.prof.txt."""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import time

import torch

import mixgemm
from mixgemm.bench.protocol import graph_time_us
from mixgemm.ops.custom_ops import weight_from_tensors
from mixgemm.ops.dispatch import plans_of

N = K = 2048
GRAPH_CALLS = 20


def rate_us(fn, iters=2000) -> float:
    """Host microseconds per call of back-to-back calls, best of 5 rounds (the GPU keeps up: these layers run a few
    us; the GPU is synchronized between rounds where there is one)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(max(50, iters // 100)):
        fn()
    sync()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t0) / iters * 1e6)
        sync()
    return best


def measure(name: str, q, lin, m: int, compiled: bool) -> dict:
    x = torch.randn(m, K, device="cuda", dtype=torch.float16)
    q(x)
    c = q.config
    qw = weight_from_tensors(q.qweight, q.scales, q.zeros, q.offsets, c.bits, c.group_size, c.mode, N, K)
    plan = next(v for key, v in plans_of(qw).items() if key[1] == m)
    r = dict(scheme=name, M=m, kernel=plan.kernel,
             linear=rate_us(lambda: lin(x)), F_linear=rate_us(lambda: torch.nn.functional.linear(x, lin.weight)),
             quantlinear=rate_us(lambda: q(x)), forward=rate_us(lambda: q.forward(x)),
             weight_lookup=rate_us(lambda: weight_from_tensors(q.qweight, q.scales, q.zeros, q.offsets, c.bits,
                                                               c.group_size, c.mode, N, K)),
             empty=rate_us(lambda: torch.empty((m, N), dtype=torch.float16, device="cuda")))
    if plan.launch is not None:
        r["launch_only"] = rate_us(lambda: plan.launch(x, None, -float("inf"), float("inf")))
    # GPU time: GRAPH_CALLS calls as one CUDA graph, the benchmark protocol's timing
    r["gpu_quantlinear"] = graph_time_us([lambda: q(x)] * GRAPH_CALLS)
    r["gpu_linear"] = graph_time_us([lambda: lin(x)] * GRAPH_CALLS)
    r["ratio"] = r["quantlinear"] / r["linear"]
    if compiled:  # torch.compile without CUDA graphs: the op's dispatch through the compiled graph
        # a fresh dynamo cache per case: the same module compiled for every M would reach dynamo's recompile limit and
        # then run eager, unreported
        torch._dynamo.reset()
        cq, cl = torch.compile(q, dynamic=False), torch.compile(lin, dynamic=False)
        r["compiled_quantlinear"] = rate_us(lambda: cq(x), iters=1000)
        r["compiled_linear"] = rate_us(lambda: cl(x), iters=1000)
        r["compiled_ratio"] = r["compiled_quantlinear"] / r["compiled_linear"]
    return r


def profile(q, m: int, calls: int = 2000) -> str:
    x = torch.randn(m, K, device="cuda", dtype=torch.float16)
    for _ in range(20):
        q(x)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        q(x)
    pr.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--compiled", action="store_true", help="also time the calls under torch.compile (no graphs)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows, prof = [], []
    with torch.no_grad():
        lin = torch.nn.Linear(K, N, bias=False).half().cuda()
        schemes = (("W4A16", mixgemm.W4A16()), ("W8A16", mixgemm.W8A16()), ("W8A8", mixgemm.W8A8()),
                   ("W4A8-token", mixgemm.W4A8(act_block="token")))
        for name, cfg in schemes:
            model = torch.nn.Sequential(torch.nn.Linear(K, N, bias=False)).half().cuda()
            mixgemm.quantize_(model, cfg)
            for m in (1, 16, 512):
                r = measure(name, model[0], lin, m, a.compiled)
                rows.append(r)
                print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
            for m in (1, 16):
                prof.append(f"== {name} M={m}\n" + profile(model[0], m))
                if a.compiled:  # where a compiled call's host time goes, beside a compiled nn.Linear's
                    torch._dynamo.reset()
                    prof.append(f"== compiled {name} M={m}\n" + profile(torch.compile(model[0], dynamic=False), m))
        if a.compiled:
            for m in (1, 16):
                torch._dynamo.reset()
                prof.append(f"== compiled nn.Linear M={m}\n" + profile(torch.compile(lin, dynamic=False), m))
    with open(os.path.join(a.out, "eager_overhead.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(a.out, "eager_overhead.prof.txt"), "w") as f:
        f.write("\n".join(prof))
    print("\n".join(prof)[:8000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
