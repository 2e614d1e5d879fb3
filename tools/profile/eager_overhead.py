"""Host time of one eager QuantLinear call, piece by piece, beside nn.Linear: back-to-back calls without a sync (the
rate an eager decode loop issues layers at), then the per-call pieces of the plan path (weight lookup, plan lookup,
the prepared launch alone), the GPU time of the same call (replayed from a CUDA graph: what back-to-back calls cannot
go below), with --compiled the same calls under torch.compile without CUDA graphs, and a cProfile of the call
(eager and, with --compiled, compiled, beside a compiled nn.Linear). `mixgemm bench --call-overhead` writes the
result file of the same cases (mixgemm.bench.call_overhead); this tool adds the pieces and the profiles.

    PYTHONPATH=src python -m tools.profile.eager_overhead --out DIR [--compiled]

Writes DIR/eager_overhead.json and DIR/eager_overhead.prof.txt."""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats

import torch

import mixgemm
from mixgemm.bench.call_overhead import DEFAULT_MS, DEFAULT_SHAPE, SCHEMES, paired_rate_us, scheme_config, time_case
from mixgemm.ops.custom_ops import weight_from_tensors
from mixgemm.ops.dispatch import plans_of

K, N = DEFAULT_SHAPE


def rate_us(fn, iters=2000) -> float:
    """Host microseconds per call of back-to-back calls, best of the rounds (mixgemm.bench.call_overhead)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    return paired_rate_us([fn], calls=iters, rounds=7, sync=sync)[0]


def measure(name: str, q, lin, m: int, compiled: bool) -> dict:
    """`mixgemm bench --call-overhead`'s numbers for one case, plus the per-call pieces of the plan path."""
    x = torch.randn(m, K, device="cuda", dtype=torch.float16)
    q(x)
    c = q.config
    qw = weight_from_tensors(q.qweight, q.scales, q.zeros, q.offsets, c.bits, c.group_size, c.mode, N, K)
    plan = next(v for key, v in plans_of(qw).items() if key[1] == m)
    r = dict(scheme=name, M=m, kernel=plan.kernel, **time_case(q, lin, x, compiled),
             F_linear=rate_us(lambda: torch.nn.functional.linear(x, lin.weight)), forward=rate_us(lambda: q.forward(x)),
             weight_lookup=rate_us(lambda: weight_from_tensors(q.qweight, q.scales, q.zeros, q.offsets, c.bits,
                                                               c.group_size, c.mode, N, K)),
             empty=rate_us(lambda: torch.empty((m, N), dtype=torch.float16, device="cuda")))
    if plan.launch is not None:
        r["launch_only"] = rate_us(lambda: plan.launch(x, None, -float("inf"), float("inf")))
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
    ap.add_argument("--schemes", default=",".join(SCHEMES), help=f"comma list of {SCHEMES}")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows, prof = [], []
    with torch.no_grad():
        lin = torch.nn.Linear(K, N, bias=False).half().cuda()
        for name in a.schemes.split(","):
            model = torch.nn.Sequential(torch.nn.Linear(K, N, bias=False)).half().cuda()
            mixgemm.quantize_(model, scheme_config(name))
            for m in DEFAULT_MS:
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
