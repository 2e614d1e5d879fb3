"""Protocol-style timing of the Triton weight-only GEMM next to fp16 cuBLAS (F.linear), for tuning.

Each measured case: C copies of the layer (weights + scales, > 3x L2 together), one CUDA graph calling
them back to back on the same activation, median replay time (triton.testing.do_bench) / C.

  PYTHONPATH=src python -m tools.bench.gemm_triton sweep --out DIR [--budget S] [--set NAME]
      every candidate config of the chosen set per (format, shape, M); writes DIR/sweep_<set>.json
  PYTHONPATH=src python -m tools.bench.gemm_triton cross --out DIR
      the CUDA GEMV against this GEMM at M = 1..32 (the dispatcher's crossover); writes DIR/cross_<tag>.json
  PYTHONPATH=src python -m tools.bench.gemm_triton final --out DIR
      ceilings and the dispatcher's own choice (mixgemm.ops.dispatch) per acceptance case, graph and eager;
      writes DIR/final.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from mixgemm.bench import protocol
from mixgemm.bench.protocol import eager_time_us, graph_time_us
from mixgemm.formats.weight import quantize_weight
from mixgemm.kernels.triton_gemm.gemm import auto_split, gemm
from mixgemm.kernels.triton_gemm.layout import get_layout, layout_name
from tools.bench.kernel_choice import entry_config

INF = float("inf")
DEV = torch.device("cuda")


def env() -> dict:
    p = torch.cuda.get_device_properties(0)
    return dict(gpu=torch.cuda.get_device_name(0), sms=p.multi_processor_count, l2=p.L2_cache_size,
                torch=torch.__version__, triton=triton.__version__)


def graph_time(calls, c: int) -> float:
    """Median us per call (over c calls) of a CUDA graph replaying ``calls`` back to back."""
    return graph_time_us(calls, warmup_ms=10, rep_ms=60) * len(calls) / c


def eager_time(calls, c: int) -> float:
    """Median us per call (over c calls) of ``calls`` run eagerly back to back."""
    return eager_time_us(calls, warmup_ms=10, rep_ms=40) * len(calls) / c


def copies_for(nbytes: int) -> int:
    """Layer copies that together exceed 3x L2 (at least 2)."""
    return protocol.copies_for(nbytes, protocol.l2_bytes(), min_copies=2)


def make_weights(k: int, n: int, bits: int, gs: int, mode: str, ks_list=(16, 32, 64)):
    """C QuantizedWeight copies with distinct storage (plain tensors and every KS layout cloned)."""
    w = torch.randn(n, k, device=DEV) * 0.02
    qw = quantize_weight(w, bits=bits, group_size=gs, mode=mode)
    del w
    lays = {ks: get_layout(qw, ks) for ks in ks_list}
    la = lays[ks_list[0]]
    nbytes = sum(t.numel() * t.element_size() for t in (la.words, la.scales, la.zeros, la.offsets)
                 if t is not None)
    c = copies_for(nbytes)
    out = [qw]
    clone = lambda t: None if t is None else t.clone()
    for _ in range(c - 1):
        cl = {layout_name(ks): replace(la, words=la.words.clone(), scales=la.scales.clone(), zeros=clone(la.zeros),
                                       offsets=clone(la.offsets)) for ks, la in lays.items()}
        out.append(replace(qw, qweight=qw.qweight.clone(), scales=qw.scales.clone(), zeros=clone(qw.zeros),
                           offsets=clone(qw.offsets), _layouts=cl))
    return out, nbytes


_FP16 = {}


def fp16_time(k: int, n: int, x: torch.Tensor) -> tuple[float, float]:
    key = (k, n, x.shape[0])
    if key not in _FP16:
        c = copies_for(n * k * 2)
        ws = [torch.randn(n, k, device=DEV, dtype=torch.float16) * 0.02 for _ in range(c)]
        calls = [lambda w=w: F.linear(x, w) for w in ws]
        _FP16[key] = (graph_time(calls, c), eager_time(calls, c))
        del ws
    return _FP16[key]


def check(qw, x, cfg) -> float:
    from mixgemm.reference.matmul import matmul as ref

    xs = x[:64]
    y = gemm(xs, qw, None, -INF, INF, cfg)
    r = ref(xs, qw, None, None, out_dtype=torch.float64)
    return float((y.double() - r).norm() / r.norm())


SMALL_TILES = [  # (BN, KS, KCH, num_warps, num_stages) for M <= 64 (BM = M rounded up to 16)
    (128, 32, 1, 4, 3), (128, 16, 1, 4, 3), (64, 32, 1, 4, 4), (128, 64, 1, 4, 3), (256, 32, 1, 8, 3),
    (128, 32, 1, 4, 4), (64, 64, 1, 4, 3), (256, 16, 1, 8, 4)]
LARGE_TILES = [  # (BM, BN, KS, KCH, num_warps, num_stages) for M > 64
    (128, 128, 16, 1, 8, 3), (256, 128, 16, 1, 8, 3), (128, 256, 16, 1, 8, 3), (256, 128, 16, 1, 8, 2),
    (128, 128, 32, 1, 8, 3), (256, 128, 32, 1, 8, 2), (128, 128, 16, 1, 4, 4), (64, 128, 32, 1, 4, 3),
    (64, 256, 16, 1, 8, 3)]


def candidates(m: int, set_name: str, n: int, k: int, sms: int, bits: int) -> list[dict]:
    out = []
    if m <= 64:
        bm = max(16, 1 << (m - 1).bit_length())
        for bn, ks, kch, nw, st in SMALL_TILES:
            out.append(dict(KS=ks, BM=bm, BN=bn, KCH=kch, GROUP_M=1, num_warps=nw, num_stages=st, SPLIT_K="auto"))
        out.append(dict(KS=32, BM=bm, BN=128, KCH=1, GROUP_M=1, num_warps=4, num_stages=3, SPLIT_K=2))
    else:
        for bm, bn, ks, kch, nw, st in LARGE_TILES:
            if m <= 256 and bm > 128:
                continue
            out.append(dict(KS=ks, BM=bm, BN=bn, KCH=kch, GROUP_M=8, num_warps=nw, num_stages=st, SPLIT_K="auto"))
    for c in out:
        if c["SPLIT_K"] == "auto":
            c["SPLIT_K"] = auto_split(m, n, k, c, sms, bits)
    uniq = []
    for c in out:
        if c not in uniq:
            uniq.append(c)
    return uniq


SETS = {
    "quick": dict(formats=[(4, 128, "sym"), (8, -1, "sym")], shapes=[(8192, 28672)],
                  ms=[32, 64, 256, 1024, 4096]),
    "main": dict(formats=[(4, 128, "sym"), (8, -1, "sym")], shapes=[(8192, 28672), (4096, 14336)],
                 ms=[32, 64, 256, 1024, 4096, 16384]),
}


def run_sweep(args):
    e = env()
    e.update(ceilings())
    print(json.dumps(e), flush=True)
    t0 = time.time()
    spec = SETS[args.set]
    formats = spec["formats"] if not args.formats else [tuple(json.loads(f)) for f in args.formats]
    shapes = spec["shapes"] if not args.shapes else [tuple(int(v) for v in s.split("x")) for s in args.shapes]
    ms = spec["ms"] if not args.ms else [int(v) for v in args.ms.split(",")]
    rows = []
    for bits, gs, mode in formats:
        for k, n in shapes:
            qws, nbytes = make_weights(k, n, bits, gs, mode)
            for m in ms:
                if time.time() - t0 > args.budget:
                    print("budget reached", flush=True)
                    break
                x = torch.randn(m, k, device=DEV, dtype=torch.float16)
                f16, f16e = fp16_time(k, n, x)
                cands = json.loads(args.configs) if args.configs else candidates(m, args.set, n, k, e["sms"],
                                                                                 bits)
                best = None
                for cfg in cands:
                    if time.time() - t0 > args.budget:
                        break
                    try:
                        err = check(qws[0], x, cfg)
                        calls = [lambda q=q, x=x, cfg=cfg: gemm(x, q, None, -INF, INF, cfg) for q in qws]
                        t = graph_time(calls, len(qws))
                    except Exception as ex:  # noqa: BLE001 - report and go on with the next config
                        print(f"FAIL {cfg}: {type(ex).__name__}: {str(ex)[:200]}", flush=True)
                        continue
                    row = dict(bits=bits, gs=gs, mode=mode, k=k, n=n, m=m, cfg=cfg, us=t, fp16_us=f16,
                               ratio=f16 / t, err=err)
                    rows.append(row)
                    if best is None or t < best["us"]:
                        best = row
                if best:
                    print(f"W{bits} g{gs} {k}x{n} M={m:5d}  fp16 {f16:9.1f}  best {best['us']:9.1f}  "
                          f"x{best['ratio']:.2f}  err {best['err']:.1e}  {best['cfg']}", flush=True)
                del x
            del qws
            _FP16.clear()
            torch.cuda.empty_cache()
    with open(f"{args.out}/sweep_{args.tag}.json", "w") as f:
        json.dump(dict(env=e, rows=rows), f, indent=1)


def ceilings() -> dict:
    a = torch.empty(1 << 29, dtype=torch.float16, device=DEV)
    b = torch.empty_like(a)
    t = do_bench(lambda: b.copy_(a), return_mode="median") * 1e-3
    bw = 2 * a.numel() * 2 / t
    x = torch.randn(8192, 8192, device=DEV, dtype=torch.float16)
    t = do_bench(lambda: x @ x, return_mode="median") * 1e-3
    return dict(copy_TBps=bw / 1e12, fp16_TFLOPs=2 * 8192**3 / t / 1e12)


def run_final(args):
    from mixgemm.ops.dispatch import cuda_matmul, pick_kernel

    e = env()
    e.update(ceilings())
    print(json.dumps(e), flush=True)
    rows = []
    cases = [((4, 128, "sym"), (8192, 28672)), ((4, 128, "sym"), (4096, 14336)),
             ((8, -1, "sym"), (8192, 28672)), ((8, -1, "sym"), (4096, 14336))]
    ms = [int(v) for v in args.ms.split(",")] if args.ms else [1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048,
                                                                 4096, 8192, 16384]
    t0 = time.time()
    for (bits, gs, mode), (k, n) in cases:
        qws, nbytes = make_weights(k, n, bits, gs, mode)
        for m in ms:
            if time.time() - t0 > args.budget:
                break
            x = torch.randn(m, k, device=DEV, dtype=torch.float16)
            f16, f16e = fp16_time(k, n, x)
            path = pick_kernel(m, n, k, qws[0], DEV)
            calls = [lambda q=q, x=x: cuda_matmul(x, q, None, None) for q in qws]
            t = graph_time(calls, len(qws))
            te = eager_time(calls, len(qws))
            row = dict(bits=bits, gs=gs, mode=mode, k=k, n=n, m=m, path=path, us=t, eager_us=te, fp16_us=f16,
                       fp16_eager_us=f16e, ratio=f16 / t)
            if m <= 32:  # crossover: the GEMM at the same M (the dispatcher may have picked the GEMV), with the
                # config the dispatcher hands it (called without one it uses its own rule)
                cfg = entry_config(x, qws[0], "triton_gemm")
                tg = graph_time([lambda q=q, x=x, cfg=cfg: gemm(x, q, None, -INF, INF, cfg) for q in qws], len(qws))
                row["gemm_us"] = tg
            rows.append(row)
            print(f"W{bits} g{gs} {k}x{n} M={m:5d} {path:4s} {t:9.1f} us (eager {te:9.1f})  fp16 {f16:9.1f}"
                  f"  x{f16 / t:.2f}" + (f"  gemm {row['gemm_us']:.1f}" if "gemm_us" in row else ""),
                  flush=True)
            del x
        del qws
        _FP16.clear()
        torch.cuda.empty_cache()
    with open(f"{args.out}/final.json", "w") as f:
        json.dump(dict(env=e, rows=rows), f, indent=1)


def run_cross(args):
    """GEMV vs GEMM at small M (the dispatch crossover), next to fp16 cuBLAS."""
    from mixgemm.kernels.cuda.gemv_direct import gemv

    e = env()
    print(json.dumps(e), flush=True)
    rows = []
    t0 = time.time()
    for fmt in args.formats or ['[4,128,"sym"]', '[8,-1,"sym"]']:
        bits, gs, mode = json.loads(fmt)
        for shape in args.shapes or ["4096x14336", "8192x28672"]:
            k, n = (int(v) for v in shape.split("x"))
            qws, _ = make_weights(k, n, bits, gs, mode, ks_list=(16, 32))
            for m in [int(v) for v in (args.ms or "1,2,4,8,16,24,32").split(",")]:
                if time.time() - t0 > args.budget:
                    break
                x = torch.randn(m, k, device=DEV, dtype=torch.float16)
                f16, _ = fp16_time(k, n, x)
                row = dict(bits=bits, gs=gs, mode=mode, k=k, n=n, m=m, fp16_us=f16)
                if m <= 16:
                    row["gemv_us"] = graph_time([lambda q=q, x=x: gemv(x, q, None, -INF, INF) for q in qws], len(qws))
                best = None
                for ks, bn, st in ((32, 128, 3), (16, 128, 3), (32, 64, 4)):
                    cfg = dict(KS=ks, BM=16 if m <= 16 else 32, BN=bn, KCH=1, GROUP_M=1, num_warps=4,
                               num_stages=st, SPLIT_K=1)
                    t = graph_time([lambda q=q, x=x, cfg=cfg: gemm(x, q, None, -INF, INF, cfg) for q in qws],
                                   len(qws))
                    if best is None or t < best[0]:
                        best = (t, cfg)
                row["gemm_us"], row["gemm_cfg"] = best
                rows.append(row)
                print(f"W{bits} g{gs} {k}x{n} M={m:3d} fp16 {f16:7.1f}  gemv {row.get('gemv_us', float('nan')):7.1f}"
                      f"  gemm {best[0]:7.1f} {best[1]}", flush=True)
            del qws
            _FP16.clear()
            torch.cuda.empty_cache()
    with open(f"{args.out}/cross_{args.tag}.json", "w") as f:
        json.dump(dict(env=e, rows=rows), f, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["sweep", "final", "cross"])
    ap.add_argument("--out", default=".")
    ap.add_argument("--set", default="main")
    ap.add_argument("--budget", type=float, default=200)
    ap.add_argument("--formats", nargs="*")
    ap.add_argument("--shapes", nargs="*")
    ap.add_argument("--ms", default="")
    ap.add_argument("--configs", default="")
    ap.add_argument("--tag", default="main")
    args = ap.parse_args(argv)
    {"sweep": run_sweep, "final": run_final, "cross": run_cross}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
