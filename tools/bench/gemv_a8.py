"""Benchmark of the fused activation-quantized CUDA GEMV (mixgemm.kernels.cuda_gemv_a8.gemv_a8) against the Triton
W4A8 / W8A8 path (act-quant launch + GEMM) and fp16 cuBLAS, benchmark protocol (CUDA graph over C layer
copies > 3x L2, median / C). Activation quantization is inside every mixgemm time.

    PYTHONPATH=src python -m tools.bench.gemv_a8            # table
    PYTHONPATH=src python -m tools.bench.gemv_a8 --sweep    # + grid / tile sweep on the acceptance shapes

The CUDA column forces the fused GEMV (registry entry cuda_gemv_a8) at every M <= 16 where it can run, past its tuned
range (mixgemm.tuning.A8_GEMV_MAX_M); the Triton column is the dispatch with that entry disabled. Tile configs go in
through mixgemm.kernel_options(configs={"cuda_gemv_a8": ...}) (gemv_a8.complete_config's keys, GRID included).
Floor = (packed weights + 4 bytes per group + fp16 x + fp16 y) / measured copy bandwidth (as tools.bench.int8).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import mixgemm
from mixgemm.bench.protocol import graph_time_us
from mixgemm.formats.activation import quantize_activation
from mixgemm.formats.weight import dequantize_weight, quantize_weight
from mixgemm.kernels.registry import NoKernel
from mixgemm.ops.int8 import make_a8_runner
from mixgemm.tuning.gemv_m1 import a8_m1_entry
from tools.bench.int8 import clone_qw, copies_for, copy_bandwidth

SHAPES = [(8192, 28672), (28672, 8192)]  # K x N
GEMV_A8 = "cuda_gemv_a8"  # the fused GEMV's registry entry
# (R, KS, NW, PF) candidates of the M = 1 sweep
SWEEP_CFGS = [(4, 1, 8, 0), (2, 1, 8, 0), (2, 1, 8, 1), (1, 1, 8, 1), (4, 1, 8, 1), (2, 1, 16, 1), (4, 1, 16, 0),
              (2, 2, 8, 1), (1, 2, 8, 1), (4, 2, 8, 0), (2, 2, 16, 1)]


def floor_us(k, n, m, bits, group, bw):
    g = k if group == -1 else group
    byts = n * k * bits // 8 + n * (k // g) * 4 + m * k * 2 + m * n * 2
    return byts / bw * 1e6


def err_of(x, qw, act, y, rows=16, block="group") -> float:
    r = min(rows, x.shape[0])
    a = quantize_activation(x[:r].float().cpu(), -1 if block == "token" else qw.group_size, act).dequantize().cuda()
    ref = a @ dequantize_weight(qw, torch.float64).T
    return float((y[:r].double() - ref).norm() / ref.norm())


def time_runner(x, qws, act, rep=200, block="group") -> float:
    runs = [make_a8_runner(x, q, act, act_block=block) for q in qws]
    return graph_time_us(runs, warmup_ms=10, rep_ms=rep)


def make_case(k, n, m, bits, group, seed):
    """Fresh random sym weights (the first of C layer copies whose bytes exceed 3x L2) and activations [M, K]."""
    torch.manual_seed(seed)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    qw0 = quantize_weight(w, bits=bits, group_size=group, mode="sym")
    del w
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    c = copies_for(n * k * bits // 8)
    return qw0, x, [qw0] + [clone_qw(qw0) for _ in range(c - 1)], c


def row(k, n, m, bits, group, act, bw, rep=200, tuned=None):
    """One table row; tuned: {(bits, K, N): M = 1 config} (this run's --sweep picks for the benchmarked layers) used
    instead of the shipped bucket entries (mixgemm.tuning.gemv_m1.A8_M1)."""
    qw0, x, qws, c = make_case(k, n, m, bits, group, seed=k + n + m)
    cfg = (tuned or {}).get((bits, k, n)) if m == 1 else None
    cuda_opts = dict(force=GEMV_A8, configs=None if cfg is None else {GEMV_A8: cfg})
    path = "cuda"
    try:  # the CUDA kernel at every M <= 16 where it can run: forced past the dispatcher's tuned M range
        with mixgemm.kernel_options(**cuda_opts):
            make_a8_runner(x, qw0, act)()
    except (NoKernel, ValueError) as ex:
        # it cannot (a forced entry's hard decline, or gemv_a8's own check: shared memory at large M x K, which the
        # entry's tuning decline above A8_GEMV_MAX_M comes before): both columns time the dispatch without it
        print(f"  {k}x{n} M{m} W{bits}A8: the fused GEMV cannot run it ({ex}); Triton in both columns", flush=True)
        path, cuda_opts = "triton", dict(disable=GEMV_A8)
    with mixgemm.kernel_options(**cuda_opts):
        y = make_a8_runner(x, qw0, act)()
        err = err_of(x, qw0, act, y)
        t_cuda = time_runner(x, qws, act, rep)
    with mixgemm.kernel_options(disable=GEMV_A8):
        y2 = make_a8_runner(x, qw0, act)()
        err2 = err_of(x, qw0, act, y2)
        t_tri = time_runner(x, qws, act, rep)
    for q in qws:
        q._layouts.clear()
    del qws
    torch.cuda.empty_cache()
    cc = copies_for(n * k * 2)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02 for _ in range(cc)]
    t16 = graph_time_us([lambda w=w: F.linear(x, w) for w in ws], warmup_ms=10, rep_ms=rep)
    del ws
    torch.cuda.empty_cache()
    fl = floor_us(k, n, m, bits, group, bw)
    return dict(k=k, n=n, m=m, fmt=f"W{bits}A8 g{group} {act}", path=path, us=t_cuda, tri=t_tri, f16=t16, floor=fl,
                err=err, err_tri=err2, C=c)


def print_rows(rows):
    print(f"{'KxN':>12} {'M':>3} {'format':>16} {'cuda us':>8} {'triton':>8} {'fp16':>8} {'x fp16':>6} "
          f"{'floor':>6} {'%floor':>6} {'err':>8} {'err tri':>8} C path", flush=True)
    for r in rows:
        print(f"{r['k']:>5}x{r['n']:<6} {r['m']:>3} {r['fmt']:>16} {r['us']:8.1f} {r['tri']:8.1f} {r['f16']:8.1f} "
              f"{r['f16'] / r['us']:6.2f} {r['floor']:6.1f} {100 * r['floor'] / r['us']:5.0f}% {r['err']:8.1e} "
              f"{r['err_tri']:8.1e} {r['C']} {r['path']}", flush=True)


def sweep(k, n, m, bits, group, act, bw, rep=50, cfgs=None, block="group"):
    """Time each config of the fused GEMV (gemv_a8.complete_config's keys: R, KS, NW, PF, OP, and GRID: absent / None =
    persistent, "tiles" = one block per tile, an int = blocks per SM) on one problem, the entry forced with that
    config; fastest first."""
    qw0, x, qws, _ = make_case(k, n, m, bits, group, seed=1)
    fl = floor_us(k, n, m, bits, group, bw)
    out = []
    if cfgs is None:
        cfgs = [dict(R=r, KS=ks, NW=nw, PF=pf) for r, ks, nw, pf in SWEEP_CFGS] + [dict(R=4, KS=1, NW=8, PF=0,
                                                                                         GRID="tiles")]
    for cfg in cfgs:
        tile = {key: v for key, v in cfg.items() if key != "GRID"}
        try:
            with mixgemm.kernel_options(force=GEMV_A8, configs={GEMV_A8: cfg}):
                t = time_runner(x, qws, act, rep, block)
                y = make_a8_runner(x, qw0, act, act_block=block)()
            e = err_of(x, qw0, act, y, block=block)
        except Exception as ex:  # noqa: BLE001  (a config that does not launch: report, go on)
            print(f"  sweep {tile} grid {cfg.get('GRID')}: {type(ex).__name__}: {ex}", flush=True)
            continue
        out.append((t, dict(cfg)))
        print(f"  sweep {k}x{n} M{m} W{bits} g{group} {act} act {block} {tile} grid {cfg.get('GRID')!s:>5}: "
              f"{t:7.1f} us ({100 * fl / t:.0f}% floor) err {e:.1e}", flush=True)
    del qws
    torch.cuda.empty_cache()
    out.sort(key=lambda v: v[0])
    return out


def prologue_sweep(bw, rep):
    """M = 1 W4A8 g128, per-token and per-group activations, both shapes: the one-pass row prologue (OP) and
    programmatic dependent launch (kernel_options(pdl=...)) on and off, at the tuned config and its neighbours."""
    import mixgemm

    for k, n in SHAPES:
        base = dict(a8_m1_entry(4, k, n).value)
        others = [c for c in (dict(R=2, KS=1, NW=8, PF=0), dict(R=2, KS=1, NW=16, PF=1), dict(R=4, KS=1, NW=16, PF=0))
                  if c != base]
        for block in ("token", "group"):
            cfgs = [dict(base, OP=op) for op in ((0, 1) if block == "token" else (1,))] + others
            for pdl in (False, True):
                with mixgemm.kernel_options(pdl=pdl):
                    res = sweep(k, n, 1, 4, 128, "sym", bw, rep, cfgs, block)
                print(f"best {k}x{n} act {block} PDL {pdl}: {[(round(t, 1), c) for t, c in res[:2]]}", flush=True)


def row_w8_large(k, n, m, bw, rep=100):
    """W8A8 per-channel at large M: the one-pass CUDA row quantizer against the two-pass Triton one, alone (time and
    bit-equality), and the dispatch end to end (it always quantizes with the CUDA row kernel where that applies; the
    end-to-end run with the Triton quantizer has no switch any more)."""
    from mixgemm.kernels.cuda import act_quant_rows as aq
    from mixgemm.kernels.triton.act_quant import act_quant

    qw0, x, qws, _ = make_case(k, n, m, 8, -1, seed=k + m)
    a1 = aq.act_quant_rows(x, "sym")
    a2 = act_quant(x, -1, "sym")
    exact = all(torch.equal(u, v) for u, v in zip(a1, a2, strict=True))
    t_rows = do_bench(lambda: aq.act_quant_rows(x, "sym", out=a1), warmup=10, rep=50, return_mode="median") * 1e3
    t_tri = do_bench(lambda: act_quant(x, -1, "sym", out=a2), warmup=10, rep=50, return_mode="median") * 1e3
    kernel = mixgemm.explain(x, qw0, act_mode="sym").kernel
    y = make_a8_runner(x, qw0, "sym")()
    t, err = time_runner(x, qws, "sym", rep), err_of(x, qw0, "sym", y)
    del qws
    torch.cuda.empty_cache()
    ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02 for _ in range(copies_for(n * k * 2))]
    t16 = graph_time_us([lambda w=w: F.linear(x, w) for w in ws], warmup_ms=10, rep_ms=rep)
    del ws
    torch.cuda.empty_cache()
    print(f"W8A8 per-ch {k}x{n} M{m}: {kernel} {t:.1f} us ({t16 / t:.2f}x fp16) | fp16 {t16:.1f} us | actq alone: "
          f"rows {t_rows:.1f} us, triton {t_tri:.1f} us, identical {exact} | err {err:.1e}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true", help="sweep M = 1 configs first; the table uses the best")
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--sweep-rep", type=int, default=50)
    ap.add_argument("--large", action="store_true", help="also W8A8 per-channel M = 2048 (end to end, and the CUDA row "
                    "quantizer against the Triton one alone)")
    ap.add_argument("--prologue", action="store_true", help="only the one-pass prologue / PDL sweep (M = 1)")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    bw = copy_bandwidth()
    print(f"GPU {props.name}, {props.multi_processor_count} SMs, L2 {props.L2_cache_size >> 20} MiB, "
          f"copy {bw / 1e12:.2f} TB/s, torch {torch.__version__}", flush=True)
    if args.prologue:
        prologue_sweep(bw, args.sweep_rep)
        return
    tuned = {}  # the sweep's M = 1 picks, which the table rows run instead of the shipped entries'
    if args.sweep:
        for k, n in SHAPES:
            for bits, group in ((4, 128), (8, -1)):
                res = sweep(k, n, 1, bits, group, "sym", bw, args.sweep_rep)
                t, cfg = next(v for v in res if v[1].get("GRID") is None)  # the tuned table has no grid mode
                tuned[(bits, k, n)] = {key: v for key, v in cfg.items() if key != "GRID"}
                print(f"best {k}x{n} W{bits}: {[(round(t, 1), c) for t, c in res[:3]]}", flush=True)
        print("A8_M1 entries (mixgemm.tuning.gemv_m1: bits, measured K, N, config) =",
              [(bits, k, n, cfg) for (bits, k, n), cfg in tuned.items()], flush=True)
    rows = []
    for k, n in SHAPES:
        for bits, group, act, m in ((4, 128, "sym", 1), (4, 128, "asym", 1), (8, -1, "sym", 1), (4, 128, "sym", 2),
                                    (4, 128, "sym", 4), (8, -1, "sym", 4), (4, 128, "sym", 8)):
            rows.append(row(k, n, m, bits, group, act, bw, args.rep, tuned))
            print_rows(rows[-1:])
    print("\n== table ==")
    print_rows(rows)
    if args.large:
        for k, n in ((28672, 8192), (8192, 28672)):
            row_w8_large(k, n, 2048, bw, args.rep)


if __name__ == "__main__":
    main()
