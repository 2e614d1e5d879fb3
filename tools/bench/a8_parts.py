"""Where a whole int8-activation call's time goes at large M: the call as a plan runs it (per-token row quantizer,
then the int8 GEMM, PDL-chained), the row quantizer alone, the GEMM alone on codes already quantized, and fp16
cuBLAS, protocol graph timing (C layer copies > 3x L2 in one CUDA graph, median / C; the quantizer's C calls all read
the same activations, as the whole calls do), medians of --rounds rounds taken in turns.

Usage: PYTHONPATH=src python -m tools.bench.a8_parts [--shapes 4096x4096,...] [--ms 2048,4096] [--formats w8pc,w4g128qt]
       [--actq-units 1,4] [--rounds 3] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import functools

import torch
import torch.nn.functional as F

from mixgemm import tuning
from mixgemm.kernels.cuda import act_quant_rows
from mixgemm.kernels.cuda_wgmma.gemm_wgmma import OutputRows
from mixgemm.kernels.cuda_wgmma_a8 import config as _wgmma_a8_config
from mixgemm.kernels.cuda_wgmma_a8 import prepare as _prepare_wgmma_a8
from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import prepare_wgmma_a8
from mixgemm.kernels.int8_activations import a8_problem
from tools.bench.int8 import (
    add_case_args,
    cases,
    format_weight,
    interleaved_medians,
    layer_copies,
    write_rows,
)


def measure(k: int, n: int, m: int, fmt: str, rounds: int) -> dict:
    dev = torch.device("cuda", torch.cuda.current_device())
    qw = format_weight(fmt, n, k)
    qws = layer_copies(qw)
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    inf = float("inf")
    p = a8_problem(m, qw, torch.float16, dev, "sym", True)
    cfg = dict(_wgmma_a8_config(p), FQ=0)
    plans = [_prepare_wgmma_a8(a8_problem(m, q, torch.float16, dev, "sym", True), q, cfg) for q in qws]
    rows = act_quant_rows.prepare_act_quant_rows(m, k, torch.float16, dev, "sym")
    scratch = torch.empty(m * k + 8 * m + 16, dtype=torch.uint8, device=dev)
    base, sc = scratch.data_ptr(), scratch.data_ptr() + m * k
    gemms = [prepare_wgmma_a8(q, m, k, True, OutputRows(torch.float16, n, True, dev), cfg) for q in qws]
    y = torch.empty(m, n, dtype=torch.float16, device=dev)
    rows.launch_into(x, base, k, sc, sc + 4 * m, sc + 4 * m)
    w16 = [torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.05 for _ in qws]
    fns = {
        "whole": [lambda f=f: f(x, None, -inf, inf) for f in plans],
        "quantizer": [lambda: rows.launch_into(x, base, k, sc, sc + 4 * m, sc + 4 * m) for _ in qws],
        "gemm": [lambda g=g: g.launch_from(base, sc, None, -inf, inf, y) for g in gemms],
        "fp16": [lambda w=w: F.linear(x, w) for w in w16],
    }
    med = interleaved_medians(fns, rounds)
    del qws, plans, gemms, w16
    torch.cuda.empty_cache()
    return dict(K=k, N=n, M=m, format=fmt, tail=cfg.get("TAIL", 0), **{f"{n_}_us": v for n_, v in med.items()})


def main():
    ap = argparse.ArgumentParser()
    add_case_args(ap, "4096x4096,4096x4608,4608x4096,5120x5120,4096x14336,8192x28672", "2048,4096", "w8pc,w4g128qt")
    ap.add_argument("--actq-units", default="", help="comma list: time the calls with tuning.A8_ACTQ_UNITS at each")
    ap.add_argument("--actq-pdl", default="", help="comma list of 0 / 1: time the calls with the row quantizer "
                                                   "launched without / with PDL")
    a = ap.parse_args()
    units = [int(u) for u in a.actq_units.split(",")] if a.actq_units else [tuning.A8_ACTQ_UNITS]
    pdls = [bool(int(v)) for v in a.actq_pdl.split(",")] if a.actq_pdl else [None]
    default_prepare = act_quant_rows.prepare_act_quant_rows
    rows = []
    print(f"{'K x N':>12} {'M':>5} {'format':>9} units {'fp16':>8} {'whole':>8} {'quant':>7} {'gemm':>8}  "
          "whole x fp16, gemm x fp16, (whole - gemm) / whole")
    for shape, k, n, m, fmt in cases(a):
        for u, pdl in [(u, pdl) for u in units for pdl in pdls]:
            tuning.A8_ACTQ_UNITS = u
            # (the plan calls it so)
            act_quant_rows.prepare_act_quant_rows = functools.partial(default_prepare, pdl=pdl)
            r = measure(k, n, m, fmt, a.rounds)
            r.update(actq_units=u, actq_pdl=pdl)
            rows.append(r)
            tag = "" if pdl is None else " pdl" if pdl else " ---"
            print(f"{shape:>12} {m:>5} {fmt:>9} {u:>5}{tag} {r['fp16_us']:8.1f} {r['whole_us']:8.1f} "
                  f"{r['quantizer_us']:7.1f} {r['gemm_us']:8.1f}  {r['fp16_us'] / r['whole_us']:.2f}x "
                  f"{r['fp16_us'] / r['gemm_us']:.2f}x {(r['whole_us'] - r['gemm_us']) / r['whole_us']:.2f}",
                  flush=True)
    write_rows(a, rows)


if __name__ == "__main__":
    main()
