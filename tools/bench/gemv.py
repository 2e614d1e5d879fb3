"""Protocol-style timing of the CUDA GEMV (mixgemm.kernels.cuda_gemv.host) against fp16 cuBLAS and tinygemm.

Method (docs/benchmarking.md): C copies of each layer exceeding 3x L2, one CUDA graph calling
the C layers back to back on the same activation, median replay time (triton.testing.do_bench) / C.
Eager (no graph) time as a second column. Copy ceiling: 1 GiB device-to-device copy, bytes read +
written / time. Floor = bytes(packed weights + scales/zeros + activations + output) / copy bandwidth;
for W4 g128 the protocol's floor counts fp16 scales and fp16 zeros (4 bytes per group).

Usage: PYTHONPATH=src python -m tools.bench.gemv [--quick] [--check]
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

import mixgemm.reference as ref
from mixgemm.bench import protocol
from mixgemm.bench.protocol import eager_time_us, graph_time_us
from mixgemm.formats.weight import quantize_weight
from mixgemm.kernels.cuda.gemv_direct import gemv
from tools.bench.kernel_choice import gemv_options

SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672), (28672, 8192)]  # K x N


def copy_bandwidth() -> float:
    return protocol.copy_bandwidth(warmup_ms=50, rep_ms=300)


def graph_time(fns, rep=200) -> float:
    """Median time (s) of one call, fns = C callables over distinct layer copies replayed in one CUDA graph."""
    return graph_time_us(fns, warmup_ms=10, rep_ms=rep) * 1e-6


def eager_time(fns) -> float:
    """Median time (s) of one call for the C calls run eagerly back to back."""
    return eager_time_us(fns, warmup_ms=10, rep_ms=100) * 1e-6


def copies_for(nbytes: int) -> int:
    """Layer copies that together exceed 3x L2 (at least 2)."""
    return protocol.copies_for(nbytes, protocol.l2_bytes(), min_copies=2)


def quant_layer(k, n, bits, group, mode):
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    return quantize_weight(w, bits=bits, group_size=group, mode=mode, scale_dtype=torch.float16)


def floor_bytes(k, n, m, bits, group, act_bytes=2, mode="zero_point"):
    g = k if group == -1 else group
    # fp16 s + z (or s + m) per group; sym and per-channel: s only
    params = n * (k // g) * (2 if mode == "sym" or group == -1 else 4)
    return n * k * bits // 8 + params + m * k * act_bytes + m * n * act_bytes


def bench_case(k, n, m, bits, group, mode, bw, dtype=torch.float16, do_peers=True):
    qw0 = quant_layer(k, n, bits, group, mode)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    # correctness on this very shape first
    y = gemv(x, qw0, None, -math.inf, math.inf)
    r = ref.matmul(x, qw0, out_dtype=torch.float64)
    err = float((y.double() - r).norm() / r.norm())
    c = copies_for(qw0.nbytes())
    qws = [qw0] + [quant_layer(k, n, bits, group, mode) for _ in range(c - 1)]
    for q in qws:
        gemv(x, q, None, -math.inf, math.inf)
    t = graph_time([lambda q=q: gemv(x, q, None, -math.inf, math.inf) for q in qws])
    te = eager_time([lambda q=q: gemv(x, q, None, -math.inf, math.inf) for q in qws])
    fb = floor_bytes(k, n, m, bits, group, mode=mode)
    floor = fb / bw
    row = dict(k=k, n=n, m=m, bits=bits, group=group, mode=mode, us=t * 1e6, eager_us=te * 1e6,
               floor_us=floor * 1e6, pct=100 * floor / t, err=err)
    del qws
    if do_peers:
        cc = copies_for(n * k * 2)
        ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02 for _ in range(cc)]
        xh = x.half()
        row["cublas_us"] = graph_time([lambda w=w: F.linear(xh, w) for w in ws]) * 1e6
        del ws
        try:
            xb = x.bfloat16()
            tg = []
            for _ in range(copies_for(n * k // 2)):
                q = torch.randint(0, 16, (n, k), dtype=torch.uint8, device="cuda")
                packed = torch._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).contiguous(), 8)
                sz = torch.randn(k // 128, n, 2, device="cuda", dtype=torch.bfloat16) * 0.01
                tg.append((packed, sz))
            row["tinygemm_us"] = graph_time(
                [lambda p=p, s=s: torch._weight_int4pack_mm(xb, p, 128, s) for p, s in tg]) * 1e6
            del tg
        except Exception as e:  # peer unavailable on this torch: say so, keep going
            row["tinygemm_us"] = float("nan")
            row["tinygemm_err"] = str(e)[:80]
    torch.cuda.empty_cache()
    return row


def sweep(bw, shapes, fmts, configs, kind="simt", m=1, names=None, show=6):
    """Tile sweep at M = m of the ``kind`` kernel (simt: R, U, KS, ...; mma: U, KS, ...) over ``configs``, each
    forced through kernel_options (tools.bench.kernel_choice.gemv_options); prints the best six and the worst."""
    names = names or (["R", "U", "KS", "PF"] if kind == "simt" else ["U", "KS", "PF"])

    x_cache = {}
    best = {}
    for k, n in shapes:
        for bits, group, mode in fmts:
            c = copies_for(n * k * bits // 8)
            qws = [quant_layer(k, n, bits, group, mode) for _ in range(c)]
            x = x_cache.setdefault(k, torch.randn(m, k, device="cuda", dtype=torch.float16))
            r = ref.matmul(x, qws[0], out_dtype=torch.float64)
            res = []
            for cfg in configs:
                try:
                    with gemv_options(kind, dict(zip(names, cfg, strict=True))):
                        y = gemv(x, qws[0], None, -math.inf, math.inf)
                        err = float((y.double() - r).norm() / r.norm())
                        t = graph_time([lambda q=q, x=x: gemv(x, q, None, -math.inf, math.inf) for q in qws], rep=40)
                except Exception as e:
                    print("cfg", cfg, "failed", str(e)[:100])
                    continue
                pct = 100 * floor_bytes(k, n, m, bits, group, mode=mode) / bw / t
                res.append((t * 1e6, cfg, pct, err))
            res.sort()
            best[(k, n, bits)] = dict(zip(names, res[0][1], strict=True))
            print(f"sweep {kind} M={m} {k}x{n} W{bits} g{group} {mode}: " +
                  "  ".join(f"{c}:{t:.1f}us/{p:.0f}%" for t, c, p, e in res[:show]) +
                  f"   worst {res[-1][1]}:{res[-1][0]:.1f}  maxerr {max(e for *_, e in res):.1e}")
            del qws
            torch.cuda.empty_cache()
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--modes", default="zero_point")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-mode", default="zero_point", help="W4 mode of --sweep (sym, zero_point, offset)")
    ap.add_argument("--sweep-shapes", default=None, help="KxN list for --sweep (default: every protocol shape)")
    ap.add_argument("--sweep-mma", action="store_true")
    ap.add_argument("--pdl", action="store_true", help="default kernels with programmatic dependent launch off/on")
    ap.add_argument("--sweep-m16", action="store_true", help="tensor-core kernel at M=16: U x KS x DEFER")
    ap.add_argument("--sweep-lowreg", action="store_true", help="CUDA-core W4 M=1: low-register tiles")
    ap.add_argument("--sweep-defer", action="store_true", help="mma kernel: scaling scheme x tiles, M = 1 and 16")
    ap.add_argument("--sweep-xs", action="store_true", help="W4 M=1: x in shared memory / light bookkeeping")
    ap.add_argument("--sweep-wide", action="store_true",
                    help="W4 M=1 (--sweep-mode, --sweep-shapes): register tiles R x U x KS and bulk-copy rings")
    ap.add_argument("--m16-big", action="store_true", help="M=16 only on 8192x28672 (with --ms 1)")
    ap.add_argument("--no-table", action="store_true")
    args = ap.parse_args()
    p = torch.cuda.get_device_properties(0)
    bw = copy_bandwidth()
    print(f"GPU {p.name}, {p.multi_processor_count} SMs, L2 {p.L2_cache_size >> 20} MiB, "
          f"torch {torch.__version__}")
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s")
    sweep_shapes = SHAPES if not args.sweep_shapes else [tuple(int(v) for v in s.split("x"))
                                                         for s in args.sweep_shapes.split(",")]
    if args.sweep:
        cfgs = [(r, u, ks, pf) for r, u in ((2, 2), (4, 1), (4, 2)) for ks in (1, 2, 4, 8) for pf in (0, 1)]
        sweep(bw, sweep_shapes, [(4, 128, args.sweep_mode)], cfgs)
        w8 = [(2, 1, 4, 0), (2, 1, 8, 0), (2, 1, 4, 1), (2, 1, 8, 1), (2, 2, 4, 1), (2, 2, 8, 1)]
        sweep(bw, sweep_shapes, [(8, -1, "sym")], w8)
    best = {}
    if args.sweep_xs:
        # (R, U, KS, PF, XS, LITE, MINB)
        cfgs = [(4, 2, 2, 0, 0, 0, 0), (4, 1, 8, 0, 0, 0, 0), (2, 2, 2, 0, 0, 0, 0),
                (4, 2, 2, 0, 0, 1, 0), (4, 1, 8, 0, 0, 1, 0), (2, 2, 2, 0, 0, 1, 0), (4, 1, 8, 0, 1, 0, 0),
                (4, 2, 2, 0, 1, 1, 0), (4, 2, 2, 0, 1, 1, 3), (4, 1, 8, 0, 1, 1, 0), (4, 1, 2, 0, 1, 1, 3),
                (2, 2, 2, 0, 1, 1, 0), (4, 2, 4, 0, 1, 1, 3), (4, 1, 4, 0, 1, 1, 0), (2, 2, 4, 0, 1, 1, 0),
                (2, 1, 8, 0, 1, 1, 0), (4, 2, 1, 0, 1, 1, 3), (2, 2, 1, 0, 1, 1, 0)]
        best = sweep(bw, SHAPES, [(4, 128, "zero_point")], cfgs,
                     names=["R", "U", "KS", "PF", "XS", "LITE", "MINB"], show=len(cfgs))
        print("best per shape:", {f"{k}x{n}": tuple(c.values()) for (k, n, _), c in best.items()})
    if args.sweep_wide:
        # (R, U, KS, RG, BULK, LITE, MINB): register-fed tiles of 8 warps, then bulk-copy rings (persistent grid,
        # RG x KS compute warps + the producer); rings too big for one block fall back to registers and are skipped
        cfgs = [(r, u, ks, 8 // ks, 0, 0, 0) for r, u in ((2, 2), (2, 4), (4, 1), (4, 2), (8, 1))
                for ks in (1, 2, 4, 8)]
        cfgs += [(r, 1, ks, rg, bulk, 1, 2) for r in (4, 8) for ks in (2, 4, 8) for rg in (1, 2) for bulk in (2, 4)
                 if bulk * rg * r * ks * 32 * 16 <= 200 * 1024]
        sweep(bw, sweep_shapes, [(4, 128, args.sweep_mode)], cfgs, names=["R", "U", "KS", "RG", "BULK", "LITE", "MINB"],
              show=10)
    if args.sweep_mma:
        cfgs = [(u, ks, 1) for u in (2, 4) for ks in (4, 8, 16)] + [(2, 8, 0)]
        sweep(bw, SHAPES, [(4, 128, "zero_point"), (8, -1, "sym")], cfgs, kind="mma")
        sweep(bw, SHAPES[3:5], [(4, 128, "zero_point")], cfgs, kind="mma", m=16)
    if args.pdl:
        # the same default kernels timed with programmatic dependent launch off and on (protocol graph timing)
        import mixgemm

        rows = []
        for k, n in SHAPES:
            for m, bits, group, mode in ((1, 4, 128, "zero_point"), (16, 4, 128, "zero_point"), (1, 8, -1, "sym")):
                for pdl in (False, True):
                    with mixgemm.kernel_options(pdl=pdl):
                        r = bench_case(k, n, m, bits, group, mode, bw, do_peers=False)
                    rows.append((k, n, m, bits, pdl, r["us"], r["pct"], r["err"]))
        for k, n, m, bits, pdl, us, pct, err in rows:
            print(f"pdl {k}x{n} M={m} W{bits} PDL={int(pdl)}: {us:.2f} us {pct:.0f}% of floor err {err:.1e}")
    if args.sweep_m16:
        # tensor-core kernel at M = 16 with few k-slices per block (RG = 8 / KS row tiles share x in L1)
        names = ["U", "KS", "PF", "DEFER"]
        cfgs = [(u, ks, 0, d) for u in (1, 2, 4) for ks in (1, 2, 8) for d in (0, 1)]
        sweep(bw, SHAPES[1:], [(4, 128, "zero_point")], cfgs, kind="mma", m=16, names=names, show=6)
    if args.sweep_lowreg:
        # CUDA-core W4 kernel with few registers (full occupancy, like the W8 kernel at 91%): (R, U, KS, PF, XS, LITE)
        cfgs = [(4, 2, 2, 0, 0, 0), (4, 1, 8, 0, 0, 0), (2, 1, 8, 0, 0, 0), (2, 1, 4, 0, 0, 0),
                (1, 1, 8, 0, 0, 0), (1, 2, 8, 0, 0, 0), (2, 2, 8, 0, 0, 0), (2, 1, 8, 0, 1, 0), (2, 1, 8, 0, 1, 1),
                (1, 1, 8, 0, 1, 1), (2, 1, 4, 0, 1, 1), (2, 1, 8, 0, 0, 1)]
        sweep(bw, SHAPES, [(4, 128, "zero_point")], cfgs, names=["R", "U", "KS", "PF", "XS", "LITE"], show=6)
    if args.sweep_defer:
        # (U, KS, PF, DEFER): DEFER = where the tensor-core kernel applies the scale (gemv_mma.cu)
        cfgs = [(u, ks, 0, d) for d in (0, 1) for u, ks in ((2, 4), (2, 8), (4, 8), (2, 16), (1, 8))]
        names = ["U", "KS", "PF", "DEFER"]
        sweep(bw, SHAPES, [(4, 128, "zero_point")], cfgs, kind="mma", names=names, show=8)
        sweep(bw, SHAPES[1:], [(8, -1, "sym")], cfgs, kind="mma", names=names, show=4)
        sweep(bw, SHAPES[3:5], [(4, 128, "zero_point")], cfgs, kind="mma", m=16, names=names, show=8)
    if args.no_table:
        return
    ms = [int(v) for v in args.ms.split(",")]
    rows = []
    shapes = SHAPES[:1] + SHAPES[3:4] if args.quick else SHAPES
    for k, n in shapes:
        shape_ms = ms + ([16] if args.m16_big and (k, n) == (8192, 28672) and 16 not in ms else [])
        for m in shape_ms:
            for mode in args.modes.split(","):
                first = mode == args.modes.split(",")[0]
                rows.append(bench_case(k, n, m, 4, 128, mode, bw, do_peers=first))
                if m == 1 and (k, n, 4) in best:  # the sweep's fastest config, same protocol
                    with gemv_options("simt", best[(k, n, 4)]):
                        rows.append(bench_case(k, n, m, 4, 128, mode, bw, do_peers=False))
                    rows[-1]["mode"] = "best " + str(tuple(best[(k, n, 4)].values()))
        rows.append(bench_case(k, n, 1, 8, -1, "sym", bw, do_peers=False))
    hdr = (f"{'KxN':>12} {'M':>3} {'fmt':>14} {'us':>8} {'eager':>8} {'floor':>7} {'%floor':>7} "
           f"{'cuBLAS':>8} {'xcuBLAS':>7} {'tinygemm':>8} {'err':>8}")
    print(hdr)
    for r in rows:
        fmt = f"W{r['bits']} g{r['group']} {r['mode'][:4]}"
        if r["mode"].startswith("best"):
            fmt = r["mode"]
        cb = r.get("cublas_us", float("nan"))
        print(f"{r['k']:>5}x{r['n']:<6} {r['m']:>3} {fmt:>14} {r['us']:8.2f} {r['eager_us']:8.2f} "
              f"{r['floor_us']:7.2f} {r['pct']:6.1f}% {cb:8.2f} {cb / r['us']:7.2f} "
              f"{r.get('tinygemm_us', float('nan')):8.2f} {r['err']:8.1e}")
    for r in rows:
        if "tinygemm_err" in r:
            print("tinygemm unavailable:", r["tinygemm_err"])
            break


if __name__ == "__main__":
    main()
