"""The int8 GEMM's TAIL (gemm_wgmma_a8.tail_rows: whole waves of tiles in one launch, the partial last wave's weight
rows as cluster split-K tiles in a second) against one launch, whole calls as a call plan prepares them (the registry's
cuda_wgmma_a8 entry, per-token activation scales, the quantizer included), with fp16 cuBLAS in the same run; protocol
graph timing (C layer copies > 3x L2 in one CUDA graph, median / C), the variants taking turns for --rounds rounds
(medians). Each variant is checked bit-equal to TAIL 0 first.

Usage: PYTHONPATH=src python -m tools.bench.a8_tail [--shapes 4096x4608,...] [--ms 1024,2048,4096]
       [--formats w8pc,w4g128qt] [--tails auto,auto-wait,3] [--rounds 3] [--json OUT.json]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from mixgemm.kernels.cuda_wgmma_a8 import config as _wgmma_a8_config
from mixgemm.kernels.cuda_wgmma_a8 import prepare as _prepare_wgmma_a8
from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import tail_rows
from mixgemm.kernels.int8_activations import a8_problem
from tools.bench.int8 import (
    add_case_args,
    cases,
    format_weight,
    interleaved_medians,
    layer_copies,
    write_rows,
)

SHAPES = "4096x4608,5120x5120,5120x7168,13824x5120,36864x4608,4096x4096"
MS = "1024,2048,4096"


def tail_spec(tail) -> tuple:
    """(TAIL, TAIL_WAIT) of a --tails value: "auto" or 2..8, with "-wait" appended TAIL_WAIT 1 (the tail launch
    waiting for the whole first launch, as before A8_CHAIN)."""
    t, _, wait = str(tail).partition("-")
    return (int(t) if t.isdigit() else t), int(wait == "wait")


def plan(qw, m: int, tail):
    """The call plan's launch with the --tails value ``tail`` (tail_spec)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    p = a8_problem(m, qw, torch.float16, dev, "sym", True)
    value, wait = tail_spec(tail)
    cfg = dict(_wgmma_a8_config(p), TAIL=value, TAIL_WAIT=wait)
    return _prepare_wgmma_a8(p, qw, cfg), cfg


def measure(k: int, n: int, m: int, fmt: str, tails: list, rounds: int) -> dict:
    qw = format_weight(fmt, n, k)
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    inf = float("inf")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    base, cfg = plan(qw, m, 0)
    y0 = base(x, None, -inf, inf)
    row = dict(K=k, N=n, M=m, format=fmt, config={k_: v for k_, v in cfg.items() if k_ not in ("TAIL", "TAIL_WAIT")},
               variants={})
    qws = layer_copies(qw)
    variants = {"0": [plan(q, m, 0)[0] for q in qws]}
    for t in tails:
        n0, split = tail_rows(m, n, {**cfg, "TAIL": tail_spec(t)[0]}, sms)
        if not n0:
            row["variants"][t] = {"applies": False}
            continue
        y = plan(qw, m, t)[0](x, None, -inf, inf)
        row["variants"][t] = {"applies": True, "n0": n0, "split": split, "bit_equal": bool(torch.equal(y, y0))}
        variants[t] = [plan(q, m, t)[0] for q in qws]
    w16 = [torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.05 for _ in qws]
    calls = {name: [lambda f=f: f(x, None, -inf, inf) for f in fs] for name, fs in variants.items()}
    med = interleaved_medians({**calls, "fp16": [lambda w=w: F.linear(x, w) for w in w16]}, rounds)
    row["fp16_us"], row["us"] = med["fp16"], med["0"]
    for t in variants:
        if t != "0":
            row["variants"][t].update(us=med[t], ratio=med[t] / med["0"])
    del qws, variants, w16
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser()
    add_case_args(ap, SHAPES, MS, "w8pc,w4g128qt")
    ap.add_argument("--tails", default="auto,auto-wait", help="TAIL values to time against TAIL 0 (auto, 2..8; "
                    "'-wait' appended: TAIL_WAIT 1, the tail launch waiting for the whole first launch)")
    a = ap.parse_args()
    tails = a.tails.split(",")
    rows = []
    print(f"{'K x N':>12} {'M':>5} {'format':>9} {'fp16 us':>8} {'TAIL 0':>8}  TAIL variants (us, x TAIL 0, x fp16)")
    for shape, k, n, m, fmt in cases(a):
        r = measure(k, n, m, fmt, tails, a.rounds)
        rows.append(r)
        parts = []
        for t, v in r["variants"].items():
            parts.append(f"{t}: -" if not v["applies"] else
                         f"{t} (n0 {v['n0']}, split {v['split']}, equal {v['bit_equal']}): {v['us']:.1f} "
                         f"{v['ratio']:.3f} {r['fp16_us'] / v['us']:.2f}x")
        print(f"{shape:>12} {m:>5} {fmt:>9} {r['fp16_us']:8.1f} {r['us']:8.1f} {r['fp16_us'] / r['us']:.2f}x  "
              + "; ".join(parts), flush=True)
    write_rows(a, rows)


if __name__ == "__main__":
    main()
