"""GPU time of the int8 GEMM that quantizes its activations in the same launch (gemm_wgmma_a8.cu, A8_FQ) against the
two launches it replaces (the per-token row quantizer, then the GEMM: config FQ 0), both as a call plan prepares them
(the registry's cuda_wgmma_a8 entry with per-token scales), protocol graph timing (C layer copies > 3x L2 in one CUDA
graph, median / C), the two taking turns for --rounds rounds (medians). Each pair is checked bit-equal first.

Usage: PYTHONPATH=src python -m tools.bench.a8_quantizing [--shapes 2048x2048,...] [--ms 16,256,...]
       [--formats w8pc,w4g128qt] [--rounds 3] [--json OUT.json]
"""

from __future__ import annotations

import argparse

import torch

from mixgemm.kernels.cuda_wgmma_a8 import config as _wgmma_a8_config
from mixgemm.kernels.cuda_wgmma_a8 import prepare as _prepare_wgmma_a8
from mixgemm.kernels.int8_activations import a8_problem
from tools.bench.int8 import (
    add_case_args,
    cases,
    format_weight,
    interleaved_medians,
    layer_copies,
    write_rows,
)

SHAPES = "2048x2048,4096x4096,4096x14336,14336x4096,8192x28672,28672x8192"
MS = "16,64,128,256,512,1024,2048,4096"


def launches(qw, m: int, fq: int):
    """FQ 0: the plan's two launches (row quantizer, GEMM) as a callable of (x, bias, lo, hi). FQ 1: the GEMM that
    quantizes in its launch, called directly with scratch and counters of its own (the plan's launch takes the two
    launches under graph capture, which this timing uses)."""
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import OutputRows
    from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import prepare_wgmma_a8, scratch_bytes

    dev = torch.device("cuda", torch.cuda.current_device())
    p = a8_problem(m, qw, torch.float16, dev, "sym", True)
    cfg = dict(_wgmma_a8_config(p), FQ=fq)
    if not fq:
        return _prepare_wgmma_a8(p, qw, cfg)
    n, k = qw.shape
    g = prepare_wgmma_a8(qw, m, k, True, OutputRows(torch.float16, n, True, dev), cfg, quantize_from=torch.float16)
    if not g.quantizes:
        return None
    scratch = torch.empty(scratch_bytes(m, k), dtype=torch.uint8, device=dev)
    counters = torch.zeros(2, dtype=torch.int32, device=dev)  # left zero by every launch

    def call(x, bias, lo, hi):
        y = torch.empty(m, n, dtype=torch.float16, device=dev)
        return g.launch_quantizing(x, scratch.data_ptr(), counters.data_ptr(), bias, lo, hi, y)

    call.keep = (scratch, counters)
    return call


def measure(k: int, n: int, m: int, fmt: str, rounds: int) -> dict:
    qw = format_weight(fmt, n, k)
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    inf = float("inf")
    fused, two = launches(qw, m, 1), launches(qw, m, 0)
    row = dict(K=k, N=n, M=m, format=fmt, quantizes=fused is not None)
    if fused is None:
        return row
    y1, y2 = fused(x, None, -inf, inf), two(x, None, -inf, inf)
    row["bit_equal"] = bool(torch.equal(y1, y2))
    qws = layer_copies(qw)
    fa = [launches(q, m, 1) for q in qws]
    fb = [launches(q, m, 0) for q in qws]
    med = interleaved_medians({"fused": [lambda f=f: f(x, None, -inf, inf) for f in fa],
                               "two": [lambda f=f: f(x, None, -inf, inf) for f in fb]}, rounds)
    row.update(fused_us=med["fused"], two_launch_us=med["two"])
    row["ratio"] = row["fused_us"] / row["two_launch_us"]
    del qws, fa, fb
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser()
    add_case_args(ap, SHAPES, MS, "w8pc,w4g128qt")
    a = ap.parse_args()
    rows = []
    print(f"{'K x N':>12} {'M':>5} {'format':>9} {'fused us':>9} {'2 launches':>10} {'ratio':>6} equal")
    for shape, k, n, m, fmt in cases(a):
        r = measure(k, n, m, fmt, a.rounds)
        rows.append(r)
        if not r["quantizes"]:
            print(f"{shape:>12} {m:>5} {fmt:>9}  (the tile does not quantize in the launch)")
            continue
        print(f"{shape:>12} {m:>5} {fmt:>9} {r['fused_us']:9.1f} {r['two_launch_us']:10.1f} "
              f"{r['ratio']:6.3f} {r['bit_equal']}", flush=True)
    write_rows(a, rows)


if __name__ == "__main__":
    main()
