"""The stream GEMV over wgmma_v1 (gemv_wg_stream.cu) at M = 1 beside the compacted weight's dispatch (the CUDA-core
GEMV on wgmma_v1) and the plain codes' dispatch: correctness against the float64 reference on odd shapes, then times
per the benchmark protocol (one CUDA graph of calls over distinct copies > 3x L2, median per call, best of --rounds).

    PYTHONPATH=src python -m tools.bench.wg_stream [--shapes 4096x14336 ...] [--formats w8,w4s] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os

import torch

import mixgemm
from mixgemm.bench import protocol
from mixgemm.formats.weight import compact_placeholder, quantize_weight
from mixgemm.kernels.cuda.gemv_wg_stream import prepare_stream
from mixgemm.ops.custom_ops import compact_weight
from mixgemm.reference.matmul import matmul as reference_matmul

FORMATS = {"w4s": (4, 128, "sym"), "w4z": (4, 128, "zero_point"), "w8": (8, -1, "sym"), "w4o32": (4, 32, "offset"),
           "w8g128": (8, 128, "sym")}
GRID = [{"CW": 8, "S": 4}, {"CW": 4, "S": 4}, {"CW": 4, "S": 2}, {"CW": 2, "S": 4}, {"CW": 4, "S": 8},
        {"CW": 8, "S": 8}]
CHECK_CASES = [(4224, 1000, "w4s"), (4224, 1000, "w4z"), (4160, 1000, "w8"), (2112, 1000, "w4o32"),
               (2176, 333, "w8g128"), (128, 17, "w4s"), (8192, 4096, "w4z")]


def make(k: int, n: int, fmt: str, compact: bool, seed: int = 0):
    bits, group, mode = FORMATS[fmt]
    torch.manual_seed(seed)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    q = quantize_weight(w, bits=bits, group_size=group, mode=mode, scale_dtype=torch.float16)
    return compact_weight(q, compact_placeholder(q.qweight)) if compact else q


def check(dtype: torch.dtype) -> list[dict]:
    rows = []
    for k, n, fmt in CHECK_CASES:
        q = make(k, n, fmt, False)
        qc = make(k, n, fmt, True)
        x = torch.randn(1, k, device="cuda", dtype=dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype)
        ref = reference_matmul(x, q, bias, out_dtype=torch.float64)
        for cfg in (GRID[0], GRID[2], GRID[-1]):
            launch = prepare_stream(qc, dtype, x.device, cfg)
            ys = [launch(x, bias) for _ in range(3)]  # the workspace must come back zero after each call
            torch.cuda.synchronize()
            scale = ref.abs().max().item()
            err = max((y.double() - ref).abs().max().item() for y in ys) / scale
            zero = bool((launch.workspace == 0).all() and (launch.counters == 0).all())
            rows.append({"K": k, "N": n, "fmt": fmt, "dtype": str(dtype), "cfg": cfg, "grid": launch.grid,
                         "rel_err": err, "ws_zero": zero})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def time_dispatch(x: torch.Tensor, weights: list, rounds: int) -> dict:
    choice = mixgemm.explain(x, weights[0])
    fns = [lambda q=q: mixgemm.matmul(x, q) for q in weights]
    us = min(protocol.graph_time_us(fns, warmup_ms=5, rep_ms=40) for _ in range(rounds))
    return {"kernel": choice.kernel, "config": {a: b for a, b in (choice.config or {}).items() if isinstance(b, int)},
            "us": us}


def measure(k: int, n: int, fmt: str, rounds: int, l2: int, grid: list) -> list[dict]:
    bits = FORMATS[fmt][0]
    copies = protocol.copies_for(n * k * bits // 8, l2)
    x = torch.randn(1, k, device="cuda", dtype=torch.float16)
    rows = []
    plain = [make(k, n, fmt, False, seed=i) for i in range(copies)]
    rows.append({"K": k, "N": n, "fmt": fmt, "method": "plain", **time_dispatch(x, plain, rounds)})
    del plain
    torch.cuda.empty_cache()
    comp = [make(k, n, fmt, True, seed=i) for i in range(copies)]
    rows.append({"K": k, "N": n, "fmt": fmt, "method": "compact", **time_dispatch(x, comp, rounds)})
    for cfg in grid:
        launches = [prepare_stream(q, x.dtype, x.device, cfg) for q in comp]
        fns = [lambda s=s: s(x) for s in launches]
        us = min(protocol.graph_time_us(fns, warmup_ms=5, rep_ms=40) for _ in range(rounds))
        rows.append({"K": k, "N": n, "fmt": fmt, "method": "stream", "config": cfg, "grid": launches[0].grid,
                     "us": us})
    del comp
    torch.cuda.empty_cache()
    best = min(r["us"] for r in rows if r["method"] == "stream")
    base = {r["method"]: r["us"] for r in rows if r["method"] != "stream"}
    print(f"{k}x{n} {fmt}: plain {base['plain']:.2f} compact {base['compact']:.2f} stream best {best:.2f} us "
          f"({best / base['plain']:.3f}x plain)", flush=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["4096x4096", "4096x14336", "14336x4096", "8192x28672",
                                                    "28672x8192"], help="K x N layer shapes")
    ap.add_argument("--formats", default="w4s,w8,w4z")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    out = {"device": torch.cuda.get_device_name(), "check": [], "time": []}
    if not args.no_check:
        for dtype in (torch.float16, torch.bfloat16):
            out["check"] += check(dtype)
    l2 = protocol.l2_bytes()
    for fmt in args.formats.split(","):
        for shape in args.shapes:
            k, n = (int(v) for v in shape.lower().split("x"))
            out["time"] += measure(k, n, fmt, args.rounds, l2, GRID)
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "wg_stream.json"), "w") as f:
                json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
