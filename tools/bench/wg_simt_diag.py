"""What reading the compacted layout costs at M = 1: the dispatch on a compacted weight (wgmma_v1: the CUDA-core GEMV
cuda_gemv_wg_simt, or the tensor-core GEMV cuda_gemv_mma at M > 1, --ms) against the same weight's plain codes
(gemv.cu), per layer and format; --variant also times the compacted M = 1 tile with other config keys. Times per the
benchmark protocol (one CUDA graph of C calls over distinct copies > 3x L2, median per call, the best of --rounds
timings).

    PYTHONPATH=src python -m tools.bench.wg_simt_diag [--shapes 4096x14336 8192x28672] [--formats w8,w4s] [--out DIR]
        [--ms 1,2,16] [--variant RT=2,U=1,PF=1,KS=32] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os

import torch

import mixgemm
from mixgemm.bench import protocol
from mixgemm.formats.weight import compact_placeholder, quantize_weight
from mixgemm.ops.custom_ops import compact_weight

FORMATS = {"w4s": (4, 128, "sym"), "w4z": (4, 128, "zero_point"), "w8": (8, -1, "sym"), "w4s32": (4, 32, "sym"),
           "w4o32": (4, 32, "offset")}


def weight(k: int, n: int, fmt: str, compact: bool, seed: int | None = None):
    """A random [N, K] weight of ``fmt`` on the GPU, compacted (wgmma_v1 only) or plain; ``seed``: the same weight
    for the same seed (a plain and a compacted copy to compare)."""
    bits, group, mode = FORMATS[fmt]
    if seed is not None:
        torch.manual_seed(seed)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    q = quantize_weight(w, bits=bits, group_size=group, mode=mode, scale_dtype=torch.float16)
    return compact_weight(q, compact_placeholder(q.qweight)) if compact else q


def layer(k: int, n: int, fmt: str, compact: bool, l2: int) -> list:
    return [weight(k, n, fmt, compact) for _ in range(protocol.copies_for(n * k * FORMATS[fmt][0] // 8, l2))]


def time_us(x: torch.Tensor, weights: list, rounds: int, entry: str | None = None, cfg: dict | None = None) -> dict:
    opts = mixgemm.kernel_options(force=entry, configs={entry: cfg}) if entry else mixgemm.kernel_options()
    with opts:
        choice = mixgemm.explain(x, weights[0])
        fns = [lambda q=q: mixgemm.matmul(x, q) for q in weights]
        us = min(protocol.graph_time_us(fns, warmup_ms=5, rep_ms=40) for _ in range(rounds))
    return {"kernel": choice.kernel, "config": {a: b for a, b in (choice.config or {}).items() if isinstance(b, int)},
            "us": us}


def measure(k: int, n: int, fmt: str, rounds: int, l2: int, m: int = 1, variants: tuple = (),
            dtype: torch.dtype = torch.float16) -> list[dict]:
    """The plain and the compacted weight's dispatch on one layer, then the compacted M = 1 CUDA-core tile with each
    variant's keys."""
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    rows = []
    for compact in (False, True):
        weights = layer(k, n, fmt, compact, l2)
        base = time_us(x, weights, rounds)
        rows.append({"K": k, "N": n, "M": m, "fmt": fmt, "compact": compact, "variant": {}, **base})
        if compact and base["kernel"] == "cuda_gemv_wg_simt":
            for extra in variants:  # the compacted tile with other keys (e.g. KS 32, U 1)
                rows.append({"K": k, "N": n, "M": m, "fmt": fmt, "compact": compact, "variant": extra,
                             **time_us(x, weights, rounds, base["kernel"], {**base["config"], **extra})})
        del weights
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["4096x14336", "8192x28672", "5120x13824", "14336x4096"],
                    help="K x N layer shapes")
    ap.add_argument("--formats", default="w8,w4s", help=f"comma-separated, of {sorted(FORMATS)}")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ms", default="1", help="comma-separated M values")
    ap.add_argument("--variant", action="append", default=[],
                    help="KEY=V[,KEY=V]: the compacted M = 1 tile also with these keys (e.g. KS=32,U=1), repeatable")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"), help="activation dtype")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    variants = tuple({kv.split("=")[0]: int(kv.split("=")[1]) for kv in v.split(",")} for v in args.variant)
    l2 = protocol.l2_bytes()
    rows = []
    for fmt in args.formats.split(","):
        for shape in args.shapes:
            k, n = (int(v) for v in shape.lower().split("x"))
            for m in (int(v) for v in args.ms.split(",")):
                for r in measure(k, n, fmt, args.rounds, l2, m, variants, getattr(torch, args.dtype)):
                    rows.append(r)
                    kind = "compact" if r["compact"] else "plain"
                    print(f"{k}x{n} M {m} {fmt} {kind:7s} {r['variant'] or ''}: {r['us']:8.2f} us  {r['kernel']} "
                          f"{r['config']}", flush=True)
    path = os.path.join(args.out, "wg_simt_diag.json")
    with open(path, "w") as f:
        json.dump({"machine": protocol.machine_info(), "rows": rows}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
