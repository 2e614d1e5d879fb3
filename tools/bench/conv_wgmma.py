"""The wgmma implicit-GEMM conv (kernels/cuda_conv_wgmma/conv_wgmma.py) vs cuDNN fp16 and the Triton conv, per layer.

Every ResNet-50 layer of mixgemm.bench.conv.CONV_PRESET that the path takes (Ci % 64 == 0, groups 1) at batch 1 and
32, W8A16 per-channel and W4A16 g128 (g64 where Ci = 64): cuDNN fp16 channels_last, what mixgemm.conv2d picks without
this path ("triton": the table's Triton implicit GEMM or 1x1 matmul), and the wgmma path with each candidate tile.
Protocol as tools/checks/conv_gpu_check.py: C copies of input + weights (> 3 x L2) in one CUDA graph, median replay / C;
each variant is checked against F.conv2d in fp32 (TF32 off) on the dequantized weights first (> 2e-3: not timed).

  PYTHONPATH=src python -m tools.bench.conv_wgmma [--batches 1 32] [--bits 8 4] [--json out.json] [--budget-s S]
  CONV_SWEEP=dw: the depthwise kernel, default and candidate tiles.
  CONV_SWEEP=smallk: the small-K kernel (triton_conv_smallk/conv_smallk.py) with candidate tiles, on every layer whose
  padded K fits it, beside the dispatch without it.
  CONV_SWEEP=longk: split-K and stream-K tiles on the few-tile, long-K layers (use with --only / --batches 32).
  CONV_SWEEP=persist: the dispatch beside persistent whole-tile configs (SK 2, stores in flight under the next tile).
  CONV_SWEEP=wave: the dispatch beside tiles whose BM (any multiple of 8) makes the CTA count fill whole waves of the
  SMs (one or two CTAs per SM, cluster split-K 2 on long K).
  CONV_SWEEP=custom: the dispatch beside the tiles of the JSON list in CONV_CANDIDATES.
  CONV_SWEEP=auto: only what the dispatch runs (for A/B runs of two source trees beside cuDNN).
  CONV_SWEEP=table: "all" plus the persistent tiles, cluster split-K on few long tiles and KT 2 (a new GPU's table).
  CONV_SWEEP=all: the default and the "occ" candidate tiles together (a full re-sweep, e.g. after an epilogue
  change). CONV_SWEEP=tstore: the dispatch's choice with the TMA-store epilogue against the same tiles with
  per-element stores. CONV_SWEEP=pdl: the dispatch's choice with and without programmatic dependent launch of the
  wgmma kernels (kernel_options(pdl=False)).
Prints one row per layer and format (us, x cuDNN). `--emit-table A.json [B.json ...]` prints conv_table entries (the
fastest wgmma tile per layer, or None where the Triton kernel / 1x1 matmul was faster) from sweep JSON files.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

from mixgemm import kernel_options, quantize_conv_weight
from mixgemm.bench.conv import CONV_PRESET
from mixgemm.bench.protocol import graph_time_us, l2_bytes
from mixgemm.kernels.cuda_dwconv.dwconv import DwCudaConfig
from mixgemm.kernels.cuda_wgmma import gemm_wgmma as G
from mixgemm.kernels.triton_conv_smallk import conv_smallk
from mixgemm.kernels.triton_conv_smallk.conv_smallk import SmallKConfig
from mixgemm.kernels.triton_dwconv.dwconv import DwConfig
from mixgemm.ops.conv import cuda_conv2d
from mixgemm.tuning import conv_table
from tools.checks.conv_gpu_check import _inputs, _rel, qconfig

DEV = "cuda"
TOL = 2e-3
WARM_MS, REP_MS = 10, 25
INF = float("inf")
SWEEP = os.environ.get("CONV_SWEEP", "")


# CONV_SWEEP=smallk: small-K tiles (block_m, block_n, num_warps, num_stages, programs per SM)
SMALLK_CANDIDATES = [SmallKConfig(*c) for c in (
    (128, 64, 8, 2, 2), (128, 64, 4, 2, 2), (64, 64, 4, 2, 4), (64, 64, 4, 3, 4), (256, 64, 8, 2, 1),
    (128, 64, 8, 3, 2), (128, 64, 8, 1, 2), (64, 64, 8, 2, 2), (32, 64, 4, 2, 8))]


# CONV_SWEEP=dw: Triton depthwise tiles (block_m pixels, block_c channels, num_warps) and CUDA depthwise windows
# (tw output pixels per thread, cb channels per block)
DW_CANDIDATES = [DwConfig(*c) for c in ((32, 128, 4), (16, 128, 4))]
DW_CUDA_CANDIDATES = [DwCudaConfig(tw, cb) for tw in (2, 4, 8, 16, 32) for cb in (8, 16, 32, 64)]


def candidates(m: int, co: int, k: int, sweep: str = SWEEP) -> list[dict]:
    """wgmma tiles worth timing for a layer (the default rule's choice is always among them). sweep "all": the
    default candidates and the "occ" ones together."""
    if sweep in ("all", "table"):
        both = candidates(m, co, k, "") + candidates(m, co, k, "occ")
        if sweep == "table":  # a new GPU's table: also the persistent tiles, and cluster split-K for few long tiles
            both += candidates(m, co, k, "persist") if m >= 1024 else []
            both += candidates(m, co, k, "longk")[1:4] if m >= 1024 and k >= 2048 and m * co <= 2048 * 512 else []
            if m >= 1024 and k >= 512:
                both += [dict(TMA=1, GROUP_M=8, BM=128, NWG=2, STAGES=4, KT=2),
                         dict(TMA=1, GROUP_M=8, BM=128, NWG=2, STAGES=3, KT=4, FOLD=1),
                         dict(TMA=1, GROUP_M=8, BM=128, NWG=2, STAGES=3, KT=4, FOLD=1, SPLIT=2, CLUSTER=1)]
        return [c for i, c in enumerate(both) if c not in both[:i]]
    nwgs = [1] if co <= 64 else [1, 2]
    out = []
    if sweep == "occ":  # more CTAs per SM: shallow rings and register caps
        if m >= 1024:
            out += [dict(BM=128, NWG=1, STAGES=4), dict(BM=128, NWG=1, STAGES=3, MINB=3),
                    dict(BM=128, NWG=1, STAGES=4, MINB=2), dict(BM=128, NWG=1, STAGES=3, KT=2, MINB=3),
                    dict(BM=64, NWG=1, STAGES=4, MINB=4), dict(BM=64, NWG=1, STAGES=3, KT=2, MINB=4)]
            if co > 64:
                out += [dict(BM=128, NWG=2, STAGES=4), dict(BM=128, NWG=2, STAGES=3, MINB=2),
                        dict(BM=128, NWG=2, STAGES=4, MINB=2), dict(BM=128, NWG=2, STAGES=3, KT=2, MINB=2),
                        dict(BM=64, NWG=2, STAGES=4, MINB=3), dict(BM=64, NWG=2, STAGES=3, KT=2, MINB=3)]
        else:
            out += [dict(BM=32, NWG=1, STAGES=3, KT=4, SK=1, MINB=2), dict(BM=32, NWG=1, STAGES=3, KT=4, SK=1, MINB=4),
                    dict(BM=64, NWG=1, STAGES=3, KT=2, SK=1, MINB=4), dict(BM=64, NWG=1, STAGES=4, MINB=4),
                    dict(BM=16, NWG=1, STAGES=3, KT=4, SK=1, MINB=4), dict(BM=64, NWG=1, STAGES=3, KT=4, SK=1, MINB=2)]
    elif sweep == "longk":  # few output tiles over a long K (batch-32 stage-3/4 layers): split-K as one cluster
        out += [dict(BM=256, NWG=2, STAGES=5, INFLIGHT=2, SPLIT=4)]  # the workspace split-K, for reference
        clustered = [(128, 2, 4, 2, 2), (128, 2, 5, 2, 2), (128, 2, 4, 1, 2), (128, 4, 4, 1, 4), (128, 4, 4, 2, 2),
                     (128, 4, 4, 2, 4), (64, 4, 4, 2, 2), (192, 2, 4, 1, 3), (192, 2, 4, 2, 2), (256, 2, 4, 2, 4)]
        out += [dict(BM=bm, NWG=nwg, STAGES=st, KT=kt, SPLIT=sp, CLUSTER=1) for bm, nwg, st, kt, sp in clustered]
        out += [dict(BM=128, NWG=2, STAGES=3, KT=4, FOLD=1, SPLIT=2, CLUSTER=1)]
    elif sweep == "persist":  # persistent whole tiles (SK 2), TMA stores in flight under the next tile
        out += [dict(BM=128, NWG=nwg, STAGES=4, SK=2) for nwg in nwgs]
        out += [dict(BM=128, NWG=nwg, STAGES=3, SK=2, MINB=2) for nwg in nwgs]
        out += [dict(BM=64, NWG=nwg, STAGES=4, SK=2, MINB=2) for nwg in nwgs]
        if co > 64:
            out += [dict(BM=256, NWG=2, STAGES=3, SK=2)]
        if co >= 256:
            out += [dict(BM=128, NWG=4, STAGES=3, SK=2)]
        if k >= 128:
            out += [dict(BM=128, NWG=nwg, STAGES=3, KT=2, SK=2) for nwg in nwgs]
            out += [dict(BM=128, NWG=2, STAGES=3, KT=2, SK=2, MINB=2), dict(BM=256, NWG=2, STAGES=3, KT=2, SK=2)]
        if k >= 512:
            out += [dict(BM=128, NWG=2, STAGES=3, KT=4, FOLD=1, SK=2), dict(BM=128, NWG=2, STAGES=4, KT=2, SK=2)]
    elif sweep == "wave":  # BM (any multiple of 8) sized so the CTAs fill whole waves of the SMs
        sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
        for nwg in nwgs:
            ct = -(-co // (64 * nwg))
            for per_sm, split in ((1, 1), (2, 1), (1, 2)):
                if split > 1 and k < 1024:
                    continue
                fits = []
                for bm in range(64, 257, 8):
                    units = -(-m // bm) * ct * split
                    waves = -(-units // (sms * per_sm))
                    if waves <= 8 and (split == 1 or units <= sms):
                        fits.append((units / (waves * sms * per_sm), bm % 16 == 0, bm))
                for eff, _, bm in sorted(fits, reverse=True)[:2]:
                    if eff < 0.9:
                        continue
                    c = dict(BM=bm, NWG=nwg, STAGES=4 if per_sm == 1 else 3, KT=2 if k >= 512 else 1)
                    if per_sm == 2:
                        c["MINB"] = 2
                    if split > 1:
                        c.update(SPLIT=split, CLUSTER=1)
                    out.append(c)
    elif m >= 1024 and sweep == "stages":  # deeper rings / multi-tile stages
        for nwg in nwgs:
            out += [dict(BM=128, NWG=nwg, STAGES=s) for s in (4, 6, 8)]
            out += [dict(BM=128, NWG=nwg, STAGES=4, KT=2), dict(BM=128, NWG=nwg, STAGES=8, INFLIGHT=2),
                    dict(BM=64, NWG=nwg, STAGES=8), dict(BM=128, NWG=nwg, STAGES=8, SK=1),
                    dict(BM=64, NWG=nwg, STAGES=8, SK=1)]
        if co > 64:
            out += [dict(BM=256, NWG=2, STAGES=6), dict(BM=64, NWG=4, STAGES=8)]
    elif m >= 1024:
        for nwg in nwgs:
            out += [dict(BM=256, NWG=nwg, STAGES=5, INFLIGHT=2), dict(BM=128, NWG=nwg, STAGES=4),
                    dict(BM=128, NWG=nwg, STAGES=4, SK=1), dict(BM=64, NWG=nwg, STAGES=4, SK=1)]
    else:
        for nwg in nwgs:
            out += [dict(BM=64, NWG=nwg, STAGES=4, SK=1), dict(BM=32, NWG=nwg, STAGES=3, KT=4, SK=1, MINB=2),
                    dict(BM=64, NWG=nwg, STAGES=4)]
    return [{"TMA": 1, "GROUP_M": 8, **c} for c in out]


def _name(cfg) -> str:
    if cfg is None:
        return "default"
    # the rest by their first letter
    short = {"SPLIT": "sp", "GROUP_M": "g", "TSTORE": "t", "CLUSTER": "c", "SK": "sk"}
    return "".join(f"{short.get(k, k[0])}{v}" for k, v in cfg.items()
                   if k != "TMA" and not (k == "GROUP_M" and v == 8))


def run_layer(spec, batch: int, bits: int, l2: int) -> dict:
    ho = spec.out_hw
    m = batch * ho * ho
    per = batch * spec.ci * spec.hw**2 * 2 + batch * spec.co * ho * ho * 2 + spec.co * spec.ci * spec.k**2 // 2
    copies = max(3, min(400, 3 * l2 // per + 1))
    xs, w = _inputs(spec, batch, copies)
    p = spec.padding
    st, pd, dl = (spec.stride,) * 2, (p, p), (1, 1)
    qc = qconfig(spec, bits)
    q0 = quantize_conv_weight(w, qc)
    qws = [q0] + [q0.to("cpu").to(DEV) for _ in range(copies - 1)]
    row = dict(layer=spec.name, batch=batch, M=m, N=spec.co, K=spec.ci * spec.k**2, bits=bits,
               key=conv_table.layer_key(q0, (spec.stride,) * 2, spec.groups, m),
               fmt=f"int{qc.bits} {'pc' if qc.group_size == -1 else f'g{qc.group_size}'}", copies=copies)
    torch.backends.cudnn.benchmark = True
    whs = [w.half().contiguous(memory_format=torch.channels_last) for _ in range(copies)]
    row["cudnn"] = graph_time_us(
        [lambda i=i, whs=whs: F.conv2d(xs[i], whs[i], None, spec.stride, p, 1, spec.groups) for i in range(copies)],
        WARM_MS, REP_MS)
    whs = None
    torch.backends.cudnn.allow_tf32 = False
    ref = F.conv2d(xs[0].float(), q0.dequantize(torch.float32), None, spec.stride, p, 1, spec.groups)

    def call(x, qw, path, cfg):
        # "no-wgmma": the dispatch without the wgmma path (the Triton kernels and the 1x1 matmul); "no-tstore": the
        # dispatch with the wgmma epilogue's per-element stores (before WG_TSTORE); "no-pdl": without PDL
        if path == "no-wgmma":
            with kernel_options(disable="cuda_conv_wgmma"):
                return cuda_conv2d(x, qw, None, st, pd, dl, spec.groups, -INF, INF, None, cfg, None)
        if path == "no-pdl":
            with kernel_options(pdl=False):
                return cuda_conv2d(x, qw, None, st, pd, dl, spec.groups, -INF, INF, None, cfg, None)
        switch = {"no-tstore": (G, "TSTORE", False)}.get(path)
        if switch is None:
            return cuda_conv2d(x, qw, None, st, pd, dl, spec.groups, -INF, INF, None, cfg, path)
        old = getattr(*switch[:2])
        setattr(*switch)
        try:
            return cuda_conv2d(x, qw, None, st, pd, dl, spec.groups, -INF, INF, None, cfg, None)
        finally:
            setattr(*switch[:2], old)

    eligible = spec.groups == 1 and spec.ci % 64 == 0
    if SWEEP == "dw":  # depthwise: the default and candidate tiles
        variants = [("auto", None, None)] + [(f"dw:{c.block_m}x{c.block_c}w{c.num_warps}", "dw", c)
                                             for c in DW_CANDIDATES]
        variants += [(f"dwcuda:{c.pixels_per_thread}x{c.channels_per_block}", "dw_cuda", c) for c in DW_CUDA_CANDIDATES
                     if spec.ci % c.channels_per_block == 0]
    elif SWEEP == "smallk":  # the small-K kernel (default and candidate tiles) beside what the dispatch ran before it
        before = ("triton", "igemm", None) if spec.ci <= conv_smallk.SMALLK_MAX_CI else ("auto", None, None)
        variants = [before, ("smallk:default", "smallk", None)]
        variants += [(f"smallk:{c.block_m}x{c.block_n}w{c.num_warps}s{c.num_stages}p{c.programs_per_sm}", "smallk", c)
                     for c in SMALLK_CANDIDATES]
    elif SWEEP == "tstore":  # the dispatch with and without the TMA-store epilogue, same run
        variants = [("auto", None, None), ("no-tstore", "no-tstore", None)]
    elif SWEEP == "pdl":  # the dispatch with and without PDL of the wgmma kernels, same run
        variants = [("auto", None, None), ("no-pdl", "no-pdl", None)]
    elif SWEEP == "final":  # what mixgemm.conv2d runs now ("auto") and before this path existed ("triton")
        variants = [("auto", None, None), ("triton", "no-wgmma", None)] if eligible else [("auto", None, None)]
    elif SWEEP == "auto":  # only what mixgemm.conv2d runs now (A/B runs of two source trees)
        variants = [("auto", None, None)]
    elif SWEEP == "custom":  # the dispatch beside the tiles given as a JSON list in CONV_CANDIDATES
        variants = [("auto", None, None)]
        variants += [(f"wgmma:{_name(c)}", "wgmma", {"TMA": 1, "GROUP_M": 8, **c})
                     for c in json.loads(os.environ.get("CONV_CANDIDATES", "[]"))]
    elif SWEEP in ("persist", "wave"):
        variants = [("auto", None, None)]
        variants += [(f"wgmma:{_name(c)}", "wgmma", c) for c in candidates(m, spec.co, spec.ci * spec.k**2)]
    else:
        variants = [("triton", "no-wgmma", None), ("wgmma:default", "wgmma", None)]
        variants += [(f"wgmma:{_name(c)}", "wgmma", c) for c in candidates(m, spec.co, spec.ci * spec.k**2)]
    times, errs = {}, {}
    for label, path, cfg in variants:
        try:
            err = _rel(call(xs[0], q0, path, cfg), ref)
            errs[label] = err
            if not err <= TOL:
                times[label] = f"WRONG {err:.2e}"
                continue
            times[label] = graph_time_us(
                [lambda i=i, pa=path, c=cfg: call(xs[i], qws[i], pa, c) for i in range(copies)], WARM_MS, REP_MS)
        except Exception as e:  # noqa: BLE001 - report and go on with the other variants
            times[label] = f"ERROR {type(e).__name__}: {str(e)[:160]}"
    row["times"], row["errs"] = times, errs
    ok = {k: v for k, v in times.items()
          if k.startswith(("wgmma", "smallk", "dw", "auto")) and isinstance(v, float)}
    if ok:
        best = min(ok, key=ok.get)
        row["wgmma_best"], row["wgmma_best_us"] = best, ok[best]
        row["wgmma_best_cfg"] = next((c for lbl, _, c in variants if lbl == best), None)
    return row


def fmt_row(r) -> str:
    t = r["times"]
    tri = t.get("triton", t.get("no-tstore", t.get("no-pdl")))
    dfl = t.get("wgmma:default", t.get("auto"))
    best = r.get("wgmma_best_us")
    cud = r["cudnn"]

    def x(v):
        return f"{v:8.1f} ({cud / v:4.2f})" if isinstance(v, float) else f"{str(v)[:24]:>15}"

    return (f"| {r['layer']:<32} | {r['batch']:>2} | {r['fmt']:<8} | {cud:7.1f} | {x(tri)} | {x(dfl)} | {x(best)} "
            f"{r.get('wgmma_best', '')} |")


def emit_table(paths: list[str]) -> None:
    """Print conv_table entries (key: wgmma config, or None where the Triton kernel / 1x1 matmul measured faster)
    from sweep JSON files (CONV_SWEEP=table); a later file's row replaces an earlier one's for the same key."""
    from mixgemm.kernels.cuda_conv_wgmma.conv_wgmma import default_conv_config

    rows = {}
    for path in paths:
        with open(path) as f:
            rows.update({r["key"]: r for r in json.load(f)})
    for key in sorted(rows):
        r = rows[key]
        t = {k: v for k, v in r["times"].items() if isinstance(v, float)}
        wg = {k: v for k, v in t.items() if k.startswith("wgmma")}
        best = min(wg, key=wg.get)
        tri = t.get("triton", float("inf"))
        note = (f"{r['layer']} b{r['batch']}: wgmma {wg[best]:.1f} us, Triton / matmul {tri:.1f} us, "
                f"cuDNN {r['cudnn']:.1f} us")
        if tri < wg[best]:
            cfg = None
        elif best == "wgmma:default":
            cfg = default_conv_config(r["M"], r["N"], r["K"])
        else:
            cfg = r["wgmma_best_cfg"] if r.get("wgmma_best") == best else None
            if cfg is None:  # the row's best was not a wgmma label: find the config by its label
                cfg = next(c for c in candidates(r["M"], r["N"], r["K"], "table") if f"wgmma:{_name(c)}" == best)
        if cfg is not None:
            cfg = {k: v for k, v in cfg.items() if k != "TMA" and not (k == "GROUP_M" and v == 8)}
        print(f"    # {note}\n    {key!r}: {cfg!r},".replace("'", '"'))


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--emit-table":
        return emit_table(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 1])
    ap.add_argument("--bits", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--json", default=None)
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--only", default=None, help="comma-separated substrings of the layer names to run")
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    l2 = l2_bytes()
    t0 = time.time()
    rows = []
    mid = "auto (mixgemm.conv2d)" if SWEEP in ("final", "tstore") else "wgmma default"
    before = "per-element stores" if SWEEP == "tstore" else "without wgmma"
    print(f"| layer | B | format | cuDNN us | {before} (x cuDNN) | {mid} | best | best variant |")
    print("|---|---|---|---|---|---|---|---|")
    for batch in a.batches:
        for spec in CONV_PRESET:
            eligible = spec.groups == 1 and spec.ci % 64 == 0
            if SWEEP == "dw":
                eligible = spec.groups > 1
            if SWEEP == "smallk":  # layers whose padded K fits one small-K tile (the stem, 1x1 with Ci <= 256)
                eligible = spec.groups == 1 and spec.ci * spec.k**2 <= conv_smallk.MAX_K_PAD
            if (not eligible and SWEEP != "final") or (a.only and not any(o in spec.name for o in a.only.split(","))):
                continue
            for bits in a.bits:
                if time.time() - t0 > a.budget_s:
                    print("# budget reached", flush=True)
                    break
                r = run_layer(spec, batch, bits, l2)
                rows.append(r)
                print(fmt_row(r), flush=True)
                if SWEEP in ("smallk", "dw", "longk", "persist", "table"):
                    print("    " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                             for k, v in r["times"].items()), flush=True)
                torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:  # configs: wgmma dicts, or small-K dataclasses (as dicts)
            json.dump(rows, f, indent=1, default=lambda o: dataclasses.asdict(o))


if __name__ == "__main__":
    main()
