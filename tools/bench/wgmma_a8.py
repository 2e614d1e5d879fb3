"""Tile sweep of the int8 wgmma GEMM (kernels/cuda_wgmma_a8/gemm_wgmma_a8.cu) beside the Triton int8 GEMM it replaces
and fp16 cuBLAS, GEMM only (activations quantized once before timing), protocol graph timing (tools.bench.int8's
helpers: C layer copies > 3x L2 in one CUDA graph, median / C). Every config is checked against the float64 reference
(64 rows) before it is timed.

Usage: PYTHONPATH=src python -m tools.bench.wgmma_a8 [--shapes 8192x28672,...] [--ms 2048,4096]
       [--formats w4g128,w8pc] [--cfgs '[{"BM":128,...}, ...]' | --splits 1,2,4] [--repeat R] [--no-triton]

--splits S,...: instead of --cfgs, each case's default_config with SPLIT S (split-K over a cluster of S CTAs).
--bms B,...: likewise with BM B (tokens per CTA).
--bm-grid B,...: likewise with BM B and as many stages as fit (at most 4), and with --kt1 B,... also KT 1 at those BM
(the data of gemm_wgmma_a8.token_tile's cost model: tools/bench/a8_tile_fit.py).

--repeat R: every config and fp16 cuBLAS are timed in turn R times (rounds) and the medians reported; single timings
move by several percent within a run, so a same-run A/B of two configs should use R >= 3.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from mixgemm.formats.layouts_wgmma_a8 import build_wgmma_a8_v1
from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import LAYOUT, QS_MAX_K, default_config, gemm_wgmma_a8, ring_stages
from mixgemm.kernels.int8_activations import per_group_params
from mixgemm.kernels.triton.act_quant import act_quant
from mixgemm.kernels.triton_a8.int8_gemm import a8_gemm
from mixgemm.kernels.triton_a8.layout import get_int8_layout
from tools.bench.int8 import check, clone_qw, copies_for, graph_time, make_weight
from tools.bench.launch_spy import prepared_launches

FORMATS = {"w4g128": (4, 128), "w4g256": (4, 256), "w8g128": (8, 128), "w8pc": (8, -1), "w4pc": (4, -1)}
# a "t" suffix (w4g128t): per-token activation scales over the grouped weight; a "q" before it (w4g128qt): int4 with
# integer group scales (formats/int_scales.py)
DEFAULT_CFGS = [
    dict(BM=128, NWG=2, STAGES=4, KT=2, NP=2, CVT=0),
    dict(BM=128, NWG=2, STAGES=4, KT=2, NP=1, CVT=0),
    dict(BM=128, NWG=2, STAGES=4, KT=2, NP=2, CVT=1),
    dict(BM=128, NWG=2, STAGES=3, KT=4, NP=2, CVT=0),
    dict(BM=64, NWG=2, STAGES=5, KT=2, NP=2, CVT=0),
    dict(BM=128, NWG=1, STAGES=5, KT=2, NP=2, CVT=0),
]


def fmt_spec(fmt: str):
    """(bits, group, per-token activations, integer group scales) of a --formats entry."""
    base = fmt.removesuffix("t")
    return (*FORMATS[base.removesuffix("q")], fmt.endswith("t"), base.endswith("q"))



def triton_time(qw, aq, sa, oa, su, out, rep):
    """Graph time (us) of the Triton int8 GEMM (its own pick_config) on the same operands."""
    inf = math.inf
    lay8 = get_int8_layout(qw)
    lays = [lay8] + [get_int8_layout(clone_qw(qw)) for _ in range(copies_for(lay8.codes.numel()) - 1)]
    tt = graph_time([lambda L=L: a8_gemm(aq, sa, oa, su, L, False, None, -inf, inf, torch.float16, out=out)
                     for L in lays], rep) * 1e6
    del lays
    torch.cuda.empty_cache()
    return tt


def cluster_wave(run) -> str:
    """'' or, when run() makes a cluster launch, how many of its clusters the GPU holds at once (the wave) against
    its grid."""
    with prepared_launches() as seen:  # (the GEMM prepares its launch per call: gemm_wgmma_a8 -> prepare_wgmma_a8)
        run()
    ln = next((v for v in seen if v.cluster is not None), None)
    if ln is None:
        return ""
    return (f", {ln.clusters_at_once()} clusters of {ln.cluster[0]} at once ({ln.grid[0] // ln.cluster[0]} in the "
            "grid)")


def sweep(k, n, m, bits, group, cfgs, rep=100, per_token=False, repeat=1, triton=True, int_scales=False):
    qw = make_weight(torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02, bits, group, int_scales=int_scales)
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    blk = k if group == -1 or per_token else group
    aq, sa, oa, su = act_quant(x, blk, "sym")
    out = torch.empty((m, n), dtype=torch.float16, device="cuda")
    lay = qw.layout(LAYOUT, build_wgmma_a8_v1)
    c = copies_for(lay.weight.numel() + lay.params.numel() * 4)
    qws = [qw] + [clone_qw(qw) for _ in range(c - 1)]
    for q in qws:
        q.layout(LAYOUT, build_wgmma_a8_v1)
    inf = math.inf
    live = []  # (cfg, err) of the configs that ran and matched the reference
    for cfg in cfgs:
        try:
            wave = cluster_wave(lambda cfg=cfg: gemm_wgmma_a8(aq, sa, qw, None, -inf, inf, torch.float16, config=cfg,
                                                              out=out))
            live.append((cfg, check(x, qw, "sym", out, act_block=blk)))
            if wave:
                print(f"  {k}x{n} M={m} {cfg}{wave}", flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"  {k}x{n} M={m} W{bits} g{group} cuda {cfg}: FAILED {type(e).__name__}: {str(e)[:300]}",
                  flush=True)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02 for _ in range(copies_for(n * k * 2))]
    times = {i: [] for i in range(len(live))}
    tfs = []
    for r in range(max(1, repeat)):  # rounds: every config, then fp16 cuBLAS
        for i, (cfg, _) in enumerate(live):
            times[i].append(graph_time([lambda q=q, cfg=cfg: gemm_wgmma_a8(aq, sa, q, None, -inf, inf, torch.float16,
                                                                           config=cfg, out=out) for q in qws],
                                       rep) * 1e6)
        tfs.append(graph_time([lambda w=w: F.linear(x, w) for w in ws], rep) * 1e6)
        if repeat > 1:
            print(f"  round {r}: " + ", ".join(f"{times[i][-1]:.1f}" for i in range(len(live)))
                  + f" | fp16 {tfs[-1]:.1f} us", flush=True)
    rows = []
    for i, (cfg, err) in enumerate(live):
        t = statistics.median(times[i])
        rows.append((t, cfg, err))
        print(f"  {k}x{n} M={m} W{bits} g{group} cuda {cfg}: {t:.1f} us "
              f"({2 * m * n * k / t / 1e6:.0f} TOP/s, {statistics.median(tfs) / t:.3f}x fp16) err {err:.1e}",
              flush=True)
    tf = statistics.median(tfs)
    del qws, ws
    torch.cuda.empty_cache()
    # peer: the Triton int8 GEMM (its own pick_config); it takes activation scales per weight group, so per-token
    # ones are described per group first, as the dispatcher does (outside the timing)
    if triton and per_token and group != -1:
        sa, oa, su = per_group_params(aq, sa, oa, su, "sym", group)
    tt = triton_time(qw, aq, sa, oa, su, out, rep) if triton else math.nan
    best = min(rows, key=lambda r: r[0]) if rows else (math.nan, None, math.nan)
    print(f"{k}x{n} M={m} W{bits} g{group}: best cuda {best[0]:.1f} us {best[1]} | triton {tt:.1f} us | fp16 "
          f"{tf:.1f} us | x fp16: cuda {tf / best[0]:.2f}, triton {tf / tt:.2f}", flush=True)
    return dict(k=k, n=n, m=m, bits=bits, group=group, cuda=[(t, c, e) for t, c, e in rows], triton_us=tt,
                fp16_us=tf, rounds_us=[times[i] for i in range(len(live))], fp16_rounds_us=tfs)


def launch(m, k, n, bits, group, per_token, int_scales, cfg):
    qw = make_weight(torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02, bits, group, int_scales=int_scales)
    blk = k if group == -1 or per_token else group
    aq, sa, _, _ = act_quant(torch.randn(m, k, device="cuda", dtype=torch.float16), blk, "sym")
    for _ in range(4):
        gemm_wgmma_a8(aq, sa, qw, None, -math.inf, math.inf, torch.float16, config=cfg)
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x28672,28672x8192")
    ap.add_argument("--ms", default="4096")
    ap.add_argument("--formats", default="w4g128")
    ap.add_argument("--cfgs", default=None)
    ap.add_argument("--splits", default=None, help="each case's default_config with these SPLIT values")
    ap.add_argument("--bms", default=None, help="each case's default_config with these BM values (tokens per CTA)")
    ap.add_argument("--bm-grid", default=None, help="each case's default_config with these BM values, stages that fit")
    ap.add_argument("--kt1", default="", help="with --bm-grid: these BM values with KT 1 too")
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeat", type=int, default=1, help="rounds of (every config, fp16 cuBLAS); medians reported")
    ap.add_argument("--no-triton", action="store_true", help="skip the Triton int8 GEMM peer")
    ap.add_argument("--launch", default=None, help="M,K,N,FMT,CFG_JSON: 4 launches only (for a profiler)")
    args = ap.parse_args()
    if args.launch:
        m, k, n, fmt, cfg = args.launch.split(",", 4)
        launch(int(m), int(k), int(n), *fmt_spec(fmt), json.loads(cfg))
        return
    p = torch.cuda.get_device_properties(0)
    print(f"GPU {p.name}, torch {torch.__version__}", flush=True)
    cfgs = json.loads(args.cfgs) if args.cfgs else DEFAULT_CFGS
    res = []
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        for fmt in args.formats.split(","):
            bits, group, per_token, int_scales = fmt_spec(fmt)
            for m in (int(v) for v in args.ms.split(",")):
                if args.bm_grid or args.splits or args.bms:
                    qs = int_scales and per_token and -(-k // 128) * 128 <= QS_MAX_K  # (qs_layout's test)
                    g = k if group == -1 else group
                    base = default_config(m, n, k, g, bits, qs=qs)
                if args.bm_grid:
                    grid = [(int(b), 2) for b in args.bm_grid.split(",")]
                    grid += [(int(b), 1) for b in args.kt1.split(",") if b]
                    nwg = int(base.get("NWG", 2))
                    cfgs = [dict(base, BM=b, KT=kt, STAGES=ring_stages(b, nwg, bits, kt, g == k, 2, 4))
                            for b, kt in grid]
                elif args.splits or args.bms:
                    key, values = ("SPLIT", args.splits) if args.splits else ("BM", args.bms)
                    cfgs = [dict(base, **{key: int(v)}) for v in values.split(",")]
                res.append(sweep(k, n, m, bits, group, cfgs, per_token=per_token, repeat=args.repeat,
                                 triton=not args.no_triton, int_scales=int_scales))
    if args.out:
        Path(args.out).write_text(json.dumps(dict(gpu=p.name, torch=torch.__version__, rows=res), indent=1))


if __name__ == "__main__":
    main()
