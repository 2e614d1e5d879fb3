"""The tensor-core GEMV's tiles on wgmma_v1 at the 16-row M bucket (M 9..16; the measurement behind a table's
gemv_mma_wg_16row section, kernels.cuda_gemv_mma.host.wg_16row_tiles): per layer, the plain weight's dispatch, the
compacted
weight's dispatch and a grid of (RT, KS, U, MINB) tiles with EARLY forced on the compacted weight, each checked
against the float64 reference; benchmark protocol (one CUDA graph over layer copies > 3x L2, median per call, the
best of two timings). Layers the compacted dispatch does not send to the tensor-core GEMV are skipped.

    PYTHONPATH=src python -m tools.bench.wg_16row --shapes 4096x4096 5120x5120 --ms 16,9 [--formats w4s] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import torch

import mixgemm
from mixgemm.bench import protocol
from mixgemm.reference.matmul import matmul as reference_matmul
from tools.bench.wg_simt_diag import FORMATS, weight

# (RT, KS, U, MINB): the rule's neighbours at the k-split's cap and below it (wg_16row_tiles' two choices among them)
GRID = [(1, 8, 2, 2), (1, 8, 4, 2), (1, 16, 1, 0), (1, 16, 1, 2), (2, 8, 2, 0), (2, 8, 1, 0), (1, 8, 2, 0),
        (2, 16, 2, 0)]


def timed(x: torch.Tensor, weights: list, entry: str | None = None, cfg: dict | None = None):
    """(us, the dispatcher's choice, the first copy's output) under the forced entry / config, if any."""
    opts = mixgemm.kernel_options(force=entry, configs={entry: cfg}) if entry else mixgemm.kernel_options()
    with opts:
        choice = mixgemm.explain(x, weights[0])
        fns = [lambda q=q: mixgemm.matmul(x, q) for q in weights]
        us = min(protocol.graph_time_us(fns, warmup_ms=5, rep_ms=30) for _ in range(2))
        y = mixgemm.matmul(x, weights[0])
    return us, choice, y


def measure(k: int, n: int, fmt: str, m: int, l2: int) -> dict | None:
    copies = protocol.copies_for(n * k * FORMATS[fmt][0] // 8, l2)
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    if mixgemm.explain(x, weight(k, n, fmt, True, 0)).kernel != "cuda_gemv_mma":
        return None
    plain = [weight(k, n, fmt, False, i) for i in range(copies)]
    ref = reference_matmul(x, plain[0], out_dtype=torch.float64)
    plain_us, plain_choice, _ = timed(x, plain)
    del plain
    comp = [weight(k, n, fmt, True, i) for i in range(copies)]
    comp_us, comp_choice, _ = timed(x, comp)
    base = {a: b for a, b in (comp_choice.config or {}).items() if isinstance(b, int)}
    row = {"K": k, "N": n, "M": m, "fmt": fmt, "plain": plain_us, "plain_kernel": plain_choice.kernel,
           "compact": comp_us, "compact_cfg": base, "grid": []}
    for rt, ks, u, minb in GRID:
        if u * ks > -(-k // 64):
            continue
        cfg = {**base, "RT": rt, "KS": ks, "RG": 1, "U": u, "PF": 0, "EARLY": 1, "MINB": minb}
        us, _, y = timed(x, comp, "cuda_gemv_mma", cfg)
        err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
        row["grid"].append({"cfg": cfg, "us": us, "err": err})
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", required=True, help="K x N layer shapes")
    ap.add_argument("--ms", default="16,9", help="comma-separated M values (9..16)")
    ap.add_argument("--formats", default="w4s", help=f"comma-separated, of {sorted(FORMATS)}")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    l2 = protocol.l2_bytes()
    rows = []
    path = os.path.join(args.out, "wg_16row.json")
    for fmt, m, shape in itertools.product(args.formats.split(","), (int(v) for v in args.ms.split(",")),
                                           args.shapes):
        k, n = (int(v) for v in shape.lower().split("x"))
        row = measure(k, n, fmt, m, l2)
        if row is None:
            print(f"{fmt} {k}x{n} M {m}: not the tensor-core GEMV, skipped", flush=True)
            continue
        rows.append(row)
        best = min(row["grid"], key=lambda g: g["us"])
        print(f"{fmt} {k}x{n} M {m}: plain {row['plain']:.2f} compact {row['compact']:.2f} {row['compact_cfg']} "
              f"best {best['us']:.2f} {best['cfg']} err {best['err']:.1e}", flush=True)
        with open(path, "w") as f:  # after every layer: a run cut short keeps what it measured
            json.dump({"machine": protocol.machine_info(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
