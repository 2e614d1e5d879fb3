"""Protocol-style timing of the activation-quantized int8 path (mixgemm.ops.int8) against fp16 cuBLAS and
torch._int_mm.

Method (docs/benchmarking.md): C copies of each layer exceeding 3x L2, one CUDA graph calling the
C layers back to back on the same activation, median replay (triton.testing.do_bench) / C; eager time as a
second column. mixgemm timings always include the activation quantization kernel (x fp16 -> int8 codes,
scales, sums) as well as the GEMM. torch._int_mm is timed alone on pre-quantized int8 (no quantization,
no scaling): the protocol's "int8 core" peer. Before timing, every mixgemm case is checked against a float64
GEMM of the same quantized operands (64 rows; dequantized activations x dequantized weights).

Usage: PYTHONPATH=src python -m tools.bench.int8 [--accept] [--sweep] [--tests]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import replace

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import mixgemm
import mixgemm.tuning as tuning
from mixgemm.bench import protocol
from mixgemm.bench.protocol import eager_time_us, graph_time_us
from mixgemm.formats.activation import act_block_size, quantize_activation
from mixgemm.formats.int_scales import quantize_weight_int_scales
from mixgemm.formats.weight import dequantize_weight, quantize_weight
from mixgemm.kernels.int8_activations import act_quant as _act_quant
from mixgemm.kernels.triton.act_quant import act_quant
from mixgemm.kernels.triton_a8.int8_gemm import a8_gemm
from mixgemm.kernels.triton_a8.layout import get_int8_layout
from mixgemm.ops.int8 import make_a8_runner

ACCEPT_SHAPES = [(8192, 28672), (28672, 8192)]  # K x N


def copy_bandwidth() -> float:
    return protocol.copy_bandwidth(warmup_ms=50, rep_ms=300)


def matmul_rates() -> tuple[float, float]:
    """(fp16 TFLOP/s, int8 _int_mm TOP/s) at 8192^3."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    t16 = do_bench(lambda: a @ b, warmup=20, rep=200, return_mode="median") * 1e-3
    ai = torch.randint(-128, 127, (n, n), device="cuda", dtype=torch.int8)
    bi = torch.randint(-128, 127, (n, n), device="cuda", dtype=torch.int8)
    t8 = do_bench(lambda: torch._int_mm(ai, bi.t()), warmup=20, rep=200, return_mode="median") * 1e-3
    return 2 * n**3 / t16 / 1e12, 2 * n**3 / t8 / 1e12


def graph_time(fns, rep=200) -> float:
    """Median time (s) of one call, fns = C callables over distinct layer copies replayed in one CUDA graph."""
    return graph_time_us(fns, warmup_ms=10, rep_ms=rep) * 1e-6


def eager_time(fns, rep=100) -> float:
    """Median time (s) of one call for the C calls run eagerly back to back."""
    return eager_time_us(fns, warmup_ms=10, rep_ms=rep) * 1e-6


def copies_for(nbytes: int) -> int:
    """Layer copies that together exceed 3x L2 (at least 2)."""
    return protocol.copies_for(nbytes, protocol.l2_bytes(), min_copies=2)


def add_case_args(ap: argparse.ArgumentParser, shapes: str, ms: str, formats: str) -> None:
    """--shapes / --ms / --formats / --rounds / --json of the int8 A/B tools (a8_quantizing, a8_tail, a8_parts)."""
    ap.add_argument("--shapes", default=shapes, help="K x N, comma separated")
    ap.add_argument("--ms", default=ms)
    ap.add_argument("--formats", default=formats)
    ap.add_argument("--rounds", type=int, default=3, help="timings per variant, taken in turns (medians)")
    ap.add_argument("--json")


def cases(a: argparse.Namespace):
    """(K x N text, K, N, M, format) of every case the --shapes / --ms / --formats of add_case_args name."""
    for shape in a.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        for m in (int(v) for v in a.ms.split(",")):
            for fmt in a.formats.split(","):
                yield shape, k, n, m, fmt


def interleaved_medians(variants: dict, rounds: int) -> dict[str, float]:
    """{name: median us} of protocol graph timings of {name: [calls over the layer copies]}, the variants timed in
    turns for ``rounds`` rounds (power-capped GPUs drift within a run: docs/benchmarking.md)."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fns in variants.items():
            times[name].append(graph_time_us(fns))
    return {name: statistics.median(v) for name, v in times.items()}


def write_rows(a: argparse.Namespace, rows: list) -> None:
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), f, indent=1)


def clone_qw(qw):
    c = lambda t: None if t is None else t.clone()
    return replace(qw, qweight=c(qw.qweight), scales=c(qw.scales), zeros=c(qw.zeros), offsets=c(qw.offsets),
                   _layouts={})


def w8_cuda_options(bits: int, group: int, m: int) -> dict | None:
    """--w8-cuda: the kernel_options arguments under which int8 per-channel weights take the CUDA int8 wgmma GEMM at
    every M it serves (M >= mixgemm.tuning.A8_WGMMA_MIN_M), past the tuned hand-over to the Triton kernel
    (A8_W8_PER_CHANNEL_TRITON_FROM_M); None (the dispatch's own choice) for other weights and smaller M."""
    if bits == 8 and group == -1 and m >= tuning.A8_WGMMA_MIN_M:
        return {"force": "cuda_wgmma_a8"}
    return None


def a8_runner(x, qw, act_mode, options: dict | None = None, **kw):
    """make_a8_runner(x, qw, act_mode, **kw) chosen under mixgemm.kernel_options(**options) when given (the runner
    keeps the kernel and config chosen there)."""
    if not options:
        return make_a8_runner(x, qw, act_mode, **kw)
    with mixgemm.kernel_options(**options):
        return make_a8_runner(x, qw, act_mode, **kw)


def lay_bytes(lay) -> int:
    return lay.codes.numel() + lay.num_groups * lay.n * 4  # codes + the float32 scales a sym kernel reads


def make_weight(w, bits, group, mode="sym", int_scales=False):
    """The QuantizedWeight of w: int4 with integer group scales (formats/int_scales.py) or quantize_weight's."""
    if int_scales:
        return quantize_weight_int_scales(w, group_size=group)
    return quantize_weight(w, bits=bits, group_size=group, mode=mode)


# --formats of the int8 A/B tools (a8_quantizing, a8_tail, a8_parts): (bits, group size, integer group scales)
A8_FORMATS = {"w8pc": (8, -1, False), "w4g128t": (4, 128, False), "w4g128qt": (4, 128, True)}


def format_weight(fmt: str, n: int, k: int):
    """A random [n, k] sym weight of an A8_FORMATS format on the GPU."""
    bits, group, int_scales = A8_FORMATS[fmt]
    return make_weight(torch.randn(n, k) * 0.05, bits, group, int_scales=int_scales).to("cuda")


def layer_copies(qw) -> list:
    """qw and as many clones as together exceed 3x L2 (the protocol's copies, at least 2)."""
    return [qw] + [clone_qw(qw) for _ in range(copies_for(qw.qweight.numel() * qw.qweight.element_size()) - 1)]


def check(x, qw, act_mode, y, rows=64, act_block=None) -> float:
    """rel. error of y[:rows] vs float64 (dequantized quantized activations) @ (dequantized weights).T; activations
    quantized per act_block (default: the weight's group)."""
    r = min(rows, x.shape[0])
    a = quantize_activation(x[:r], act_block or qw.group_size, act_mode).dequantize()
    w = dequantize_weight(qw, torch.float64)
    ref = a @ w.T
    del w
    return float((y[:r].double() - ref).norm() / ref.norm())


def bench_a8(k, n, m, bits, group, act_mode="sym", mode="sym", config=None, peers=True, rep=200, act_block="group",
             repeat=1, int_scales=False, options=None):
    """One protocol row: mixgemm (act quant + GEMM) vs fp16 F.linear and torch._int_mm; act_block "token": one
    activation scale per token (matmul_a8's act_block). repeat > 1: mixgemm and fp16 cuBLAS are timed in turn that
    many times and the medians reported (single cuBLAS timings move by up to 15% within a run). int_scales: int4
    weights with integer group scales (formats/int_scales.py). options: mixgemm.kernel_options arguments the runners
    are chosen under (a8_runner)."""
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    qw0 = make_weight(w, bits, group, mode, int_scales)
    del w
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    lay0 = get_int8_layout(qw0)
    run0 = a8_runner(x, qw0, act_mode, options, config=config, act_block=act_block)
    # the block the runner quantizes with (per-channel weights: the whole row, not block -1, which would time the
    # Triton quantizer instead of the row kernel the runner calls)
    blk = act_block_size(k, qw0.group_size, act_block)
    err = check(x, qw0, act_mode, run0(), act_block=blk)
    c = copies_for(lay_bytes(lay0))
    qws = [qw0] + [clone_qw(qw0) for _ in range(c - 1)]
    runs = [run0] + [a8_runner(x, q, act_mode, options, config=config, act_block=act_block) for q in qws[1:]]
    ws = None
    if peers:
        ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02 for _ in range(copies_for(n * k * 2))]
    ts, t16s = [], []
    for _ in range(max(1, repeat)):
        ts.append(graph_time(runs, rep) * 1e6)
        if peers:
            t16s.append(graph_time([lambda w=w: F.linear(x, w) for w in ws], rep) * 1e6)
    te = eager_time(runs)
    act = act_mode + ("/token" if act_block == "token" else "") + ("/iscale" if int_scales else "")
    row = dict(k=k, n=n, m=m, bits=bits, group=group, act=act,
               us=statistics.median(ts), eager_us=te * 1e6, err=err, C=c)
    if repeat > 1:
        row["rounds_us"], row["fp16_rounds_us"] = ts, t16s
    del runs, qws, run0
    torch.cuda.empty_cache()
    # activation quantization alone (included above): the quantizer the runner calls (ops.int8._act_quant: the CUDA
    # row kernel for per-token blocks of K > 4096, else the Triton one), so the column matches what the runner pays
    q = _act_quant(x, blk, act_mode)
    row["actq_us"] = do_bench(lambda: _act_quant(x, blk, act_mode, out=q), warmup=10, rep=50,
                              return_mode="median") * 1e3
    if peers:
        row["fp16_us"] = statistics.median(t16s)
        row["fp16_eager_us"] = eager_time([lambda w=w: F.linear(x, w) for w in ws]) * 1e6
        del ws
        torch.cuda.empty_cache()
        if m > 16:
            ci = copies_for(n * k)
            xi = torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8)
            wi = [torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8) for _ in range(ci)]
            row["intmm_us"] = graph_time([lambda w=w: torch._int_mm(xi, w.t()) for w in wi], rep) * 1e6
            del wi
    torch.cuda.empty_cache()
    return row


def pdl_ab(k, n, m, rounds=5, rep=100):
    """W4A8 g128 per-token (act quant + int8 wgmma GEMM, the runner's default tile): the same runners timed with
    programmatic dependent launch on and off (kernel_options(pdl=...)) in alternating rounds, fp16 cuBLAS in each
    round too; prints every round and the medians."""
    import mixgemm

    qw0 = quantize_weight(torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02, bits=4, group_size=128)
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    c = copies_for(lay_bytes(get_int8_layout(qw0)))
    qws = [qw0] + [clone_qw(qw0) for _ in range(c - 1)]
    runs = [make_a8_runner(x, q, "sym", act_block="token") for q in qws]
    for r in runs:
        r()  # builds the layouts (the first call after a build never uses PDL)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02 for _ in range(copies_for(n * k * 2))]
    res = {"on": [], "off": [], "fp16": []}
    for i in range(rounds):
        for key, flag in (("on", True), ("off", False)) if i % 2 == 0 else (("off", False), ("on", True)):
            with mixgemm.kernel_options(pdl=flag):  # the runners prepare each call's launch, so this reaches them
                res[key].append(graph_time(runs, rep) * 1e6)
        res["fp16"].append(graph_time([lambda w=w: F.linear(x, w) for w in ws], rep) * 1e6)
        print(f"  {k}x{n} M={m} round {i}: PDL on {res['on'][-1]:.1f}, off {res['off'][-1]:.1f}, "
              f"fp16 {res['fp16'][-1]:.1f} us", flush=True)
    med = {key: statistics.median(v) for key, v in res.items()}
    print(f"{k}x{n} M={m} W4A8 g128 per-token: PDL on {med['on']:.1f} us ({med['fp16'] / med['on']:.3f}x fp16), "
          f"off {med['off']:.1f} us ({med['fp16'] / med['off']:.3f}x), fp16 {med['fp16']:.1f} us", flush=True)
    del runs, qws, ws
    torch.cuda.empty_cache()


def floor_us(k, n, m, bits, group, bw, int8_tops):
    """max(bytes / copy bandwidth, ops / measured _int_mm rate); bytes = packed weights + 4 bytes of
    scale(+zero) per group + fp16 activations in + fp16 output."""
    g = k if group == -1 else group
    byts = n * k * bits // 8 + n * (k // g) * 4 + m * k * 2 + m * n * 2
    return max(byts / bw, 2 * m * n * k / (int8_tops * 1e12)) * 1e6


def print_rows(rows, bw, top8):
    print(f"{'KxN':>12} {'M':>5} {'fmt':>12} {'us':>9} {'eager':>9} {'actq':>7} {'fp16':>9} {'x fp16':>6} "
          f"{'_int_mm':>9} {'%floor':>6} {'err':>8} C")
    for r in rows:
        fl = floor_us(r["k"], r["n"], r["m"], r["bits"], r["group"], bw, top8)
        f16 = r.get("fp16_us", float("nan"))
        fmt = f"W{r['bits']}A8 g{r['group']} {r['act'][:2]}" + ("tk" if r["act"].endswith("token") else "")
        print(f"{r['k']:>5}x{r['n']:<6} {r['m']:>5} {fmt:>12} "
              f"{r['us']:9.1f} {r['eager_us']:9.1f} {r['actq_us']:7.1f} {f16:9.1f} {f16 / r['us']:6.2f} "
              f"{r.get('intmm_us', float('nan')):9.1f} {100 * fl / r['us']:5.0f}% {r['err']:8.1e} {r['C']}",
              flush=True)
        if len(rows) == 1 and r.get("fp16_rounds_us"):  # the rounds behind the medians (each printed row once)
            pairs = zip(r["rounds_us"], r["fp16_rounds_us"], strict=True)
            print("    rounds (us, x fp16):", "  ".join(f"{t:.1f} / {t16:.1f} = {t16 / t:.2f}" for t, t16 in pairs),
                  flush=True)


def sweep_configs(k, n, m, bits, group, configs, rep=100):
    """GEMM-only (pre-quantized activations) graph timing of each tile config; returns [(us, cfg)]."""
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    qw = quantize_weight(w, bits=bits, group_size=group, mode="sym")
    del w
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    lay = get_int8_layout(qw)
    c = copies_for(lay_bytes(lay))
    lays = [lay] + [get_int8_layout(clone_qw(qw)) for _ in range(c - 1)]
    aq, sa, oa, su = act_quant(x, lay.group_size, "sym")
    out = torch.empty((m, n), dtype=torch.float16, device="cuda")
    res = []
    for cfg in configs:
        t0 = time.time()
        try:
            a8_gemm(aq, sa, oa, su, lay, False, None, -math.inf, math.inf, torch.float16, config=cfg, out=out)
            err = check(x, qw, "sym", out)
            t = graph_time([lambda L=L, cfg=cfg: a8_gemm(aq, sa, oa, su, L, False, None, -math.inf, math.inf,
                                                        torch.float16, config=cfg, out=out) for L in lays], rep)
            res.append((t * 1e6, cfg))
            print(f"  {k}x{n} M={m} W{bits} g{group} {cfg}: {t * 1e6:.1f} us err {err:.1e} "
                  f"({time.time() - t0:.1f}s)", flush=True)
        except Exception as e:  # a config that does not compile / fit: report and go on
            print(f"  {k}x{n} M={m} W{bits} g{group} {cfg}: FAILED {type(e).__name__}: {str(e)[:150]}", flush=True)
    del lays
    torch.cuda.empty_cache()
    res.sort(key=lambda r: r[0])
    return res


def C(bm, bn, bk, w, s, gm=8, tma=False):
    d = dict(BM=bm, BN=bn, BK=bk, GROUP_M=gm, num_warps=w, num_stages=s)
    if tma:
        d["TMA"] = True
    return d


def actq_rows_sweep(bw):
    """Per-token quantization of x [M, K] fp16 by act_quant_rows.act_quant_rows at each block size: time and bandwidth
    (bytes = 2 MK read + MK written), beside the copy bandwidth."""
    from mixgemm.kernels.cuda import act_quant_rows as aq

    nt0 = aq.ACTQ_NT
    try:
        for k in (8192, 28672):
            for m in (2048, 4096):
                x = torch.randn(m, k, device="cuda", dtype=torch.float16)
                ref = None
                for nt in (256, 512, 1024):
                    aq.ACTQ_NT = nt
                    q = aq.act_quant_rows(x, "sym")
                    if ref is None:
                        ref = q
                    same = all(torch.equal(a, b) for a, b in zip(q, ref, strict=True))
                    t = do_bench(lambda q=q, x=x: aq.act_quant_rows(x, "sym", out=q), warmup=10, rep=50,
                                 return_mode="median") * 1e-3
                    print(f"actq rows K={k} M={m} NT={nt}: {t * 1e6:.1f} us, {3 * m * k / t / 1e12:.2f} TB/s "
                          f"({3 * m * k / t / bw:.0%} of copy), identical {same}", flush=True)
                del x, ref
    finally:
        aq.ACTQ_NT = nt0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--accept", action="store_true")
    ap.add_argument("--ms", default="1,16,256,2048,4096,16384")
    ap.add_argument("--repeat", type=int, default=1, help="--accept: rounds of (mixgemm, fp16 cuBLAS) timed in turn; "
                    "the medians are reported")
    ap.add_argument("--rep-ms", type=int, default=100, help="--accept: each timing's window (ms of graph replays, "
                    "do_bench's rep); the H100 runs these rows at its 700 W cap with the SM clock moving between 1.1 "
                    "and 1.9 GHz within 200 ms (measured on the H100), so longer windows average over that")
    ap.add_argument("--token", action="store_true", help="--accept: the W4A8 g128 rows with per-token activations only")
    ap.add_argument("--pdl-ab", action="store_true", help="W4A8 g128 per-token at --ms (>= 128) on the acceptance "
                    "shapes: PDL on / off in alternating rounds (--repeat rounds, at least 5)")
    ap.add_argument("--actq-rows", action="store_true",
                    help="only the CUDA per-token row quantizer (what matmul_a8 runs for per-token blocks) at "
                         "block sizes 256 / 512 / 1024 threads")
    ap.add_argument("--w8-cuda", action="store_true", help="int8 per-channel weights without a --sweep config take the "
                    "CUDA int8 wgmma kernel at every M from mixgemm.tuning.A8_WGMMA_MIN_M (kernel_options(force="
                    "'cuda_wgmma_a8'), past the tuned hand-over to the Triton kernel)")
    ap.add_argument("--w8-only", action="store_true", help="--accept: the W8A8 rows only")
    ap.add_argument("--int-scales", action="store_true", help="--accept --token: int4 weights with integer group "
                    "scales (formats/int_scales.py: no per-group fold in the int8 wgmma GEMM)")
    args = ap.parse_args()

    def w8_options(bits, group, m, config):
        # --w8-cuda; an explicit (Triton) config forces the Triton kernel, as before
        return w8_cuda_options(bits, group, m) if args.w8_cuda and config is None else None

    p = torch.cuda.get_device_properties(0)
    import triton

    print(f"GPU {p.name}, {p.multi_processor_count} SMs, L2 {p.L2_cache_size >> 20} MiB, torch {torch.__version__}, "
          f"triton {triton.__version__}", flush=True)
    bw = copy_bandwidth()
    tf16, top8 = matmul_rates()
    print(f"copy {bw / 1e12:.3f} TB/s; fp16 matmul {tf16:.0f} TFLOP/s; _int_mm {top8:.0f} TOP/s", flush=True)
    if args.actq_rows:
        actq_rows_sweep(bw)
        return
    if args.pdl_ab:
        for k, n in ACCEPT_SHAPES:
            for m in (int(v) for v in args.ms.split(",")):
                pdl_ab(k, n, m, rounds=max(5, args.repeat))
        return
    best = {}
    if args.sweep:
        import mixgemm.kernels.triton.act_quant as AQ

        # activation quantization: long-row policy (per-channel K=28672 and K=8192 at M=4096)
        xs = {kk: torch.randn(4096, kk, device="cuda", dtype=torch.float16) for kk in (8192, 28672)}
        res = []
        for pol in ({"MAX_TILE_BLOCK": 4096, "ROW_CH": 2048, "ROW_WARPS": 8},
                    {"MAX_TILE_BLOCK": 4096, "ROW_CH": 4096, "ROW_WARPS": 4},
                    {"MAX_TILE_BLOCK": 4096, "ROW_CH": 1024, "ROW_WARPS": 4},
                    {"MAX_TILE_BLOCK": 4096, "ROW_CH": 8192, "ROW_WARPS": 8},
                    {"MAX_TILE_BLOCK": 8192, "ROW_CH": 4096, "ROW_WARPS": 4},
                    {"MAX_TILE_BLOCK": 32768, "ROW_CH": 2048, "ROW_WARPS": 8}):
            AQ.LONG_BLOCK.update(pol)
            ts = []
            for xx in xs.values():
                q = act_quant(xx, -1, "sym")
                ts.append(do_bench(lambda xx=xx, q=q: act_quant(xx, -1, "sym", out=q), warmup=10, rep=50,
                                   return_mode="median") * 1e3)
            print(f"  actq policy {pol}: K=8192 {ts[0]:.1f} us, K=28672 {ts[1]:.1f} us", flush=True)
            res.append((ts[0] + ts[1], dict(pol)))
        res.sort(key=lambda r: r[0])
        AQ.LONG_BLOCK.update(res[0][1])
        print("BEST actq", res[0], flush=True)
        del xs

        k, n = ACCEPT_SHAPES[0]

        def T(bm, bn, w, st, lag=False, asm=False):
            d = C(bm, bn, 128, w, st, tma=True)
            d["LAG"] = lag
            d["ASM"] = asm
            return d

        g4 = [T(64, 128, 4, 4), T(64, 128, 4, 4, asm=True), T(64, 128, 4, 3), T(64, 128, 4, 5), T(64, 64, 4, 4),
              T(64, 256, 4, 3), T(128, 64, 4, 4), T(128, 128, 8, 4, asm=True), T(64, 128, 4, 4, lag=True, asm=True)]
        r = sweep_configs(k, n, 4096, 4, 128, g4)
        print("BEST W4A8", k, n, r[:3], flush=True)
        if r:
            best["w4"] = r[0][1]
        r = sweep_configs(k, n, 4096, 8, 128, [T(64, 128, 4, 4), T(128, 128, 8, 3), T(128, 128, 8, 4)])
        print("BEST W8A8 g128", k, n, r[:3], flush=True)
        w8 = [C(256, 128, 128, 8, 3, tma=True), C(256, 128, 128, 8, 4, tma=True), C(128, 256, 128, 8, 4, tma=True),
              C(256, 128, 128, 8, 3, gm=16, tma=True), C(256, 128, 128, 8, 3, gm=4, tma=True)]
        sc = {}
        for kk, nn in ACCEPT_SHAPES:
            for us, cfg in sweep_configs(kk, nn, 4096, 8, -1, w8):
                sc.setdefault(str(cfg), [cfg, 0.0])[1] += us
        bw8 = min(sc.values(), key=lambda v: v[1])
        print("BEST W8A8 per-channel (sum over shapes)", bw8, flush=True)
        best["w8"] = bw8[0]

        def S(bn, st, sp, asm=True, bk=128):
            d = C(16, bn, bk, 4, st, gm=1)
            d["SPLIT_K"] = sp
            d["ASM"] = asm
            return d

        g1 = [S(64, 4, 2), S(64, 4, 4), S(64, 4, 8), S(128, 4, 8), S(128, 3, 4), S(256, 4, 8), S(128, 4, 8, False)]
        for k, n in ACCEPT_SHAPES:
            r = sweep_configs(k, n, 1, 4, 128, g1)
            print("BEST W4A8 M=1", k, n, r[:3], flush=True)
            if r:
                best[("w4m1", k)] = r[0][1]
        g1w8 = [S(64, 4, 1, False, 256), S(64, 4, 4, False, 256), S(128, 4, 4, False, 256), S(128, 4, 8, False, 128),
                S(64, 4, 8, False, 128), S(256, 3, 4, False, 128)]
        for k, n in ACCEPT_SHAPES:
            r = sweep_configs(k, n, 1, 8, -1, g1w8)
            print("BEST W8A8 M=1", k, n, r[:3], flush=True)
            if r:
                best[("w8m1", k)] = r[0][1]
    if args.accept and args.token:
        rows = []
        for k, n in ACCEPT_SHAPES:
            for m in (1, 2048, 4096, 16384):
                rows.append(bench_a8(k, n, m, 4, 128, rep=args.rep_ms, act_block="token", repeat=args.repeat,
                                     int_scales=args.int_scales))
                print_rows(rows[-1:], bw, top8)
        print_rows(rows, bw, top8)
    elif args.accept:
        rows = []
        for ms in ((2048, 4096), (16384,)):
            for k, n in ACCEPT_SHAPES:
                for m in ms:
                    cfg = best.get("w8")
                    rows.append(bench_a8(k, n, m, 8, -1, config=cfg, rep=args.rep_ms, repeat=args.repeat,
                                         options=w8_options(8, -1, m, cfg)))
                    print_rows(rows[-1:], bw, top8)
                for m in () if args.w8_only else ((1,) if ms[0] == 2048 else ()) + ms:
                    cfg = best.get(("w4m1", k)) if m == 1 else best.get("w4")
                    rows.append(bench_a8(k, n, m, 4, 128, config=cfg, rep=args.rep_ms, repeat=args.repeat))
                    print_rows(rows[-1:], bw, top8)
        k, n = ACCEPT_SHAPES[0]
        for bits, group, m in () if args.w8_only else ((8, -1, 1), (8, -1, 16), (4, 128, 16), (8, -1, 256),
                                                        (4, 128, 256)):
            cfg = best.get(("w8m1", k)) if (bits, m) == (8, 1) else None
            rows.append(bench_a8(k, n, m, bits, group, config=cfg, rep=100, options=w8_options(bits, group, m, cfg)))
            print_rows(rows[-1:], bw, top8)
        print("best configs:", best)
        print_rows(rows, bw, top8)


if __name__ == "__main__":
    main()
