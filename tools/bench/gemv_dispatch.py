"""Which small-M kernel and config wins, layer by layer: the measurements behind the GEMV rules of the tuning tables.

For every layer of the model list (mixgemm.bench.models, or --shapes), each weight format (w4s: W4 g128 sym, w4z: W4
g128 zero point, w8: W8 per channel) and each M, this times through mixgemm.matmul, with the benchmark protocol's
graph timing over rotating layer copies (mixgemm.bench.protocol):

* M = 1: the CUDA-core GEMV's default config and its candidates (KernelEntry.candidates), and the tensor-core GEMV
  over its whole (KS, U) grid (KS 1..16 with at least two k-tiles per slice, U 1 / 2);
* M > 1: the CUDA-core GEMV's default, the tensor-core GEMV's default and candidates, and the wgmma GEMM's default;
* with --crossover, at M > 1 only the two choices a compacted weight's dispatch has: the tensor-core GEMV's default
  on wgmma_v1 (``cuda_gemv_mma/compact``) against the wgmma GEMM's default (the tables' gemv_max_m / gemv_over_wgmma);
* with --wg-simt, at M = 1 also the CUDA-core GEMV on wgmma_v1 (cuda_gemv_wg_simt: gemv_wg_simt.cu) over its (RT, U,
  PF, KS, RG) grid, under the label ``cuda_gemv_wg_simt/grid``; --simt-only times only that grid and the CUDA-core
  GEMV's default.

Each row says which entry the dispatcher picks today (``default_entry``). The JSON ({"gpu", "res": [{K, N, fmt, M,
default_entry, rows: {entry: [{cfg, us, default}]}}]}) is what choose_mma_config's MMA_WARPS_PER_SM and the
tables' gemv_over_wgmma / gemv_mma_m1 / wgmma_from_m entries were read from; results stay out of the tree
(docs/benchmarking.md).

Usage: PYTHONPATH=src python -m tools.bench.gemv_dispatch --formats w4s,w4z --ms 1,16 --budget 280 --out $OUT
       [--dtype bfloat16] [--no-mma-grid] [--wg-simt] [--simt-only] [--compact-only] [--split-rt-grid] [--lw-grid]
       [--warm P]
       PYTHONPATH=src python -m tools.bench.gemv_dispatch --suggest SWEEP.json ...  (the M = 1 bucket entries a
       sweep supports: a CUDA-core tile >= 5% faster than the default on every measured layer of its bucket)
       PYTHONPATH=src python -m tools.bench.gemv_dispatch --suggest-simt SIMT_SWEEP.json ...  (the wgmma_v1 M = 1 tile
       entries of tuning.gemv_m1.WG_SIMT_M1 a --simt-only sweep supports)
       PYTHONPATH=src python -m tools.bench.gemv_dispatch --simt-held-out SIMT_SWEEP.json ...  (how those tables carry
       to layer shapes left out of them)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import time
import traceback

import torch

import mixgemm
from mixgemm.bench import protocol
from mixgemm.bench.models import catalog, model_layers
from mixgemm.formats.weight import quantize_weight
from mixgemm.kernels import cuda_gemv, cuda_gemv_mma, cuda_gemv_wg_simt, cuda_wgmma, linear_common
from mixgemm.kernels.cuda.gemv_launch import _MODE, chunks_per_row
from mixgemm.kernels.cuda_gemv.gemv_steps import lane_tiles, wg_simt_tiles
from mixgemm.kernels.cuda_gemv_mma.host import WG_LAYOUT, mma_k_tiles, mma_reduction_fits
from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_packs
from mixgemm.kernels.registry import device_info
from tools.bench.gemv_tables import (
    FORMATS,
    SIMT_GRID,
    simt_generalization,
    simt_resident_blocks,
    suggest,
    suggest_simt,
)


def mma_grid(base: dict, kt: int) -> list[dict]:
    """The tensor-core GEMV's (KS, U) grid around ``base``: KS 1..16 with kt >= 2 KS, U 1 or 2, RG = 8 warps / KS."""
    return [{**base, "KS": ks, "RG": max(1, 8 // ks), "U": u}
            for ks in (1, 2, 4, 8, 16) for u in (1, 2) if kt >= 2 * ks]


def mma_variants(base: dict) -> list[dict]:
    """The tensor-core GEMV's M > 1 variants around the default ``base`` (kernels.cuda_gemv_mma.host.mma_row_tiles):
    without EARLY and RT, with EARLY (the first step's weights before the PDL wait), and EARLY with two row tiles per
    warp (RT 2) at the same KS, less ``base`` itself and those whose k-slice reduction does not fit
    (kernels.cuda_gemv_mma.host.mma_reduction_fits)."""
    # (explicit 0 / 1: a forced config is laid over the default, kernels.cuda_gemv_mma.host.mma_override)
    out = [{**base, "EARLY": 0, "RT": 1}, {**base, "EARLY": 1, "RT": 1}, {**base, "EARLY": 1, "RT": 2}]
    same = {**base, "EARLY": base.get("EARLY", 0), "RT": base.get("RT", 1)}
    return [c for c in out if c != same and mma_reduction_fits(c)]


# (RT row tiles per warp, U k-tiles per step, PF double buffering) of the M = 1 CUDA-core math on wgmma_v1: 1-8 tiles of
# 512 bytes per lane in flight (PF counts twice)
def wg_simt_grid(kt64: int, pack: bool = False, mode: str = "sym") -> list[dict]:
    """M = 1 CUDA-core GEMV on wgmma_v1 (gemv_wg_simt.cu): the step-cost model's tile space
    (kernels.cuda_gemv.gemv_steps.wg_simt_tiles) for kt64 64-k tiles, each as the dispatcher runs it for ``mode``
    (kernels.cuda_gemv_wg_simt.host.wg_simt_packs: zero point / offset with PACK where PF is on). pack: each
    zero-point / offset tile also with the other PACK."""
    out = [wg_simt_packs(t.config(), mode) for t in wg_simt_tiles(kt64)]
    if not pack or mode == "sym":
        return out
    return out + [{**c, "PACK": 1 - c["PACK"]} for c in out]


def precompile_simt(fmts: list[str], dtype: torch.dtype, shapes: list[tuple[int, int]], arch: str,
                    pack: bool = False) -> None:
    """Compile every gemv_wg_simt.cu instantiation the sweep will time, in parallel processes (NVRTC is single
    threaded; the on-disk cubin cache hands them to the timing process)."""
    from concurrent.futures import ProcessPoolExecutor

    from mixgemm.kernels.cuda import nvrtc
    from mixgemm.kernels.cuda.gemv_launch import _ACT
    from mixgemm.kernels.cuda_gemv_wg_simt.host import SIMT_SOURCE, simt_defines_for

    keys = set()
    for fmt in fmts:
        bits, group, mode = FORMATS[fmt]
        for k, _ in shapes:
            for cfg in wg_simt_grid(-(-k // 64), pack, mode):
                d = simt_defines_for(bits, _ACT[dtype], 0, _MODE[mode], {**cfg, "G32": int(group == 32)})
                keys.add(tuple(sorted(d.items())))
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(nvrtc.compile_cubin, [SIMT_SOURCE] * len(keys), sorted(keys), [arch] * len(keys)))


def split_rt_grid(p, mma: dict, kt: int) -> tuple[list[dict], list[dict]]:
    """(tensor-core GEMV configs, wgmma GEMM configs) beyond the defaults' neighbourhoods at M > 1: the GEMV with EARLY
    and RT 2 / 4 row tiles per warp at KS 4 / 8 / 16 and U 1 / 2 (within the k-slice reduction's shared memory, two
    k-tiles per slice); the GEMM's k split over a thread-block cluster (CLUSTER 1, SPLIT 2 / 3 / 4, no stream-K) at
    NWG 2 and 1."""
    gemv = []
    for rt in (2, 4):
        for ks in (4, 8, 16):
            for u in (1, 2):
                c = {**mma, "EARLY": 1, "RT": rt, "KS": ks, "RG": 1, "U": u}
                if kt >= 2 * ks and mma_reduction_fits(c):
                    gemv.append(c)
    base = cuda_wgmma.choose_config(p)
    gemm = [{**base, "NWG": nwg, "SK": 0, "SERIAL": 0, "SPLIT": s, "CLUSTER": 1} for nwg in (2, 1) for s in (2, 3, 4)]
    return gemv, gemm


def mma_pack_variants(base: dict) -> list[dict]:
    """The tensor-core GEMV's default ``base`` with and without register double buffering (PF) and the zero-point /
    offset parameter pair in one register (PACK: gemv_mma.cu MMA_PACK), less ``base`` itself."""
    same = {**base, "PF": base.get("PF", 0), "PACK": base.get("PACK", 0)}
    out = [{**base, "PF": pf, "PACK": pack} for pf in (0, 1) for pack in (0, 1)]
    return [c for c in out if c != same]


def lane_grid(base: dict, kc: int) -> list[dict]:
    """The CUDA-core GEMV's M = 1 tiles over lanes per row (gemv.cu GEMV_LW): the step-cost model's space
    (gemv_steps.lane_tiles: LW 32 / 16 / 8 x KS 1 / 2 / 4 / 8 x U 1 / 2 x R 2 / 4, RG = 8 warps / KS, no PF, where
    every lane group of every k-slice gets a chunk of a row's kc), with base's ZSUM, less ``base`` itself."""
    out = []
    for tile in lane_tiles(kc):
        c = tile.config()
        if base.get("ZSUM", 0):
            c["ZSUM"] = 1
        if not all(base.get(key, 32 if key == "LW" else 0) == v for key, v in {"LW": 32, **c}.items()):
            out.append(c)
    return out


def candidates(p, m: int, bits: int, k: int, mma_grid_m1: bool = True,
               simt_grid: bool = False, mma_grid_all: bool = False, simt_only: bool = False,
               compact_only: bool = False, split_rt: bool = False,
               small_m_tiles: bool = False, simt_pack: bool = False, mma_pack: bool = False,
               lw_grid: bool = False, crossover: bool = False) -> dict[str, list[dict]]:
    """{label: [config, ...]} to time for one problem, the entry's default first; a label is the entry's name, or
    name/variant for another config family of the same entry (SIMT_GRID: cuda_gemv_wg_simt's tile grid).
    simt_only (M = 1): the CUDA-core GEMV's default on the plain codes against the wgmma_v1 CUDA-core grid (with
    simt_pack each tile also with PACK).
    compact_only: today's defaults on the plain codes against the small-M choices on wgmma_v1 (the layout a
    compacted weight keeps): at M = 1 cuda_gemv_wg_simt's config for a compacted weight, and cuda_gemv_mma/compact:
    [the tensor-core GEMV's config for a compacted weight, the plain codes' tile on wgmma_v1]; at M > 1
    cuda_gemv_mma/compact: [the compacted weight's own config, mma_variants], and the plain codes' tensor-core GEMV
    with mma_variants too.
    small_m_tiles (M > 1): the tensor-core GEMV's defaults on both layouts (cuda_gemv_mma, cuda_gemv_mma/compact)
    against the wgmma GEMM's config without the table's small-M tile family (first) and the family's 16 tiles
    (kernels.cuda_wgmma.small_m_family_candidates).
    mma_pack (M > 1, with compact_only or the default families): each tensor-core GEMV family's default also with PF
    and PACK on and off (mma_pack_variants) instead of its other variants.
    lw_grid (M = 1): the CUDA-core GEMV's default against lane_grid only.
    crossover (M > 1): the tensor-core GEMV's default on wgmma_v1 against the wgmma GEMM's default."""
    if crossover and m > 1:
        pr = dataclasses.replace(p, resident=WG_LAYOUT)
        return {"cuda_gemv_mma/compact": [dict(cuda_gemv_mma.choose_config(pr))],
                "cuda_wgmma": [cuda_wgmma.choose_config(pr)]}
    if mma_pack and m > 1:
        out = {"cuda_gemv_mma": [cuda_gemv_mma.choose_config(p)]}
        if compact_only:
            out["cuda_gemv_mma/compact"] = [dict(cuda_gemv_mma.choose_config(dataclasses.replace(p,
                                                                                                 resident=WG_LAYOUT)))]
        return {label: [c[0], *mma_pack_variants(c[0])] for label, c in out.items()}
    simt, mma = cuda_gemv.choose_config(p), cuda_gemv_mma.choose_config(p)
    if small_m_tiles and m > 1:
        on_wg = cuda_gemv_mma.choose_config(dataclasses.replace(p, resident=WG_LAYOUT))
        return {"cuda_gemv_mma": [mma],
                "cuda_gemv_mma/compact": [dict(on_wg)],
                "cuda_wgmma": [cuda_wgmma.choose_config(p, small_m_family=False),
                               *cuda_wgmma.small_m_family_candidates(p)]}
    if compact_only:
        pr = dataclasses.replace(p, resident=WG_LAYOUT)
        on_wg = [dict(cuda_gemv_mma.choose_config(pr))]
        if m == 1:
            if {**mma, "WG": 1} not in on_wg:
                on_wg.append({**mma, "WG": 1})
            out = {"cuda_gemv": [simt], "cuda_gemv_mma": [mma, *mma_variants(mma)],
                   "cuda_gemv_wg_simt": [dict(cuda_gemv_wg_simt.choose_config(pr))], "cuda_gemv_mma/compact": on_wg}
            if simt_grid:  # both kernels' grids on wgmma_v1: the tensor-core GEMV's (KS, U) and the CUDA-core tiles
                kt64 = -(-k // 64)
                out["cuda_gemv_mma/compact"] += [c for c in mma_grid(on_wg[-1], kt64) if c not in on_wg]
                out[SIMT_GRID] = wg_simt_grid(kt64, mode=p.mode)
            return out
        out = {"cuda_gemv": [simt], "cuda_gemv_mma": [mma, *mma_variants(mma)],
               "cuda_gemv_mma/compact": on_wg + mma_variants(on_wg[0])}
        if split_rt:  # the compacted weight's other choices: the GEMV's row tiles and the GEMM's cluster splits
            pr = dataclasses.replace(p, resident=WG_LAYOUT)
            more_gemv, more_gemm = split_rt_grid(pr, on_wg[0], mma_k_tiles(bits, k))
            out["cuda_gemv_mma/compact"] += [c for c in more_gemv if c not in out["cuda_gemv_mma/compact"]]
            out["cuda_wgmma"] = [cuda_wgmma.choose_config(pr), *more_gemm, *cuda_wgmma.small_m_family_candidates(pr)]
        return out
    if m == 1 and lw_grid:
        base = cuda_gemv.choose_config(p)
        return {"cuda_gemv": [base, *lane_grid(base, chunks_per_row(bits, k))]}
    if m == 1 and simt_only:
        return {"cuda_gemv": [simt], SIMT_GRID: wg_simt_grid(-(-k // 64), simt_pack, p.mode)}
    if m == 1:
        grid = [c for c in mma_grid(mma, mma_k_tiles(bits, k)) if c != mma] if mma_grid_m1 else []
        out = {"cuda_gemv": [simt, *cuda_gemv.candidates(p)], "cuda_gemv_mma": [mma, *grid]}
        if simt_grid:
            out[SIMT_GRID] = wg_simt_grid(-(-k // 64), mode=p.mode)
        return out
    near = cuda_gemv_mma.candidates(p)
    if mma_grid_all:
        near += [c for c in mma_grid(mma, mma_k_tiles(bits, k)) if c != mma and c not in near]
    wg = [cuda_wgmma.choose_config(p)]
    if split_rt:
        more_gemv, more_gemm = split_rt_grid(p, mma, mma_k_tiles(bits, k))
        near += [c for c in more_gemv if c != mma and c not in near]
        wg += [c for c in more_gemm if c not in wg]
    return {"cuda_gemv": [simt], "cuda_gemv_mma": [mma, *near], "cuda_wgmma": wg}


def plain(cfg: dict) -> dict:
    return {k: (v if isinstance(v, (int, float, str)) else str(v)) for k, v in cfg.items()}


def layer_copies(k: int, n: int, fmt: str, l2: int, scale_dtype: torch.dtype = torch.float16) -> list:
    """Fresh random weights of a K x N layer in a sweep format (scales in scale_dtype), as many copies as the protocol
    times (past 3x L2)."""
    bits, group, mode = FORMATS[fmt]

    def make():
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
        return quantize_weight(w, bits=bits, group_size=group, mode=mode, scale_dtype=scale_dtype)

    q0 = make()
    return [q0] + [make() for _ in range(protocol.copies_for(q0.nbytes(), l2) - 1)]


def forced_time_us(entry: str, cfg: dict, x: torch.Tensor, weights: list) -> float:
    """Protocol graph time of mixgemm.matmul(x, weight) over the copies with ``entry`` forced at config ``cfg``."""
    with mixgemm.kernel_options(force=entry, configs={entry: dict(cfg)}):
        return protocol.graph_time_us([lambda q=q: mixgemm.matmul(x, q) for q in weights], warmup_ms=5, rep_ms=30)


def measure_layer(k: int, n: int, fmt: str, ms: list[int], di, l2: int, dtype: torch.dtype = torch.float16,
                  mma_grid_m1: bool = True, simt_grid: bool = False, mma_grid_all: bool = False,
                  simt_only: bool = False, compact_only: bool = False, split_rt: bool = False,
                  warm_only: bool = False, small_m_tiles: bool = False, simt_pack: bool = False,
                  mma_pack: bool = False, lw_grid: bool = False, crossover: bool = False) -> list[dict]:
    bits = FORMATS[fmt][0]
    dev = torch.device("cuda")
    weights = layer_copies(k, n, fmt, l2)
    q0 = weights[0]
    out = []
    for m in ms:
        x = torch.randn(m, k, device=dev, dtype=dtype)
        p = linear_common.linear_problem(m, q0, dtype, di)
        rows = {}

        def time_us(entry: str, cfg: dict, x: torch.Tensor = x) -> float:
            if warm_only:  # compile and load only (a parallel warm-up of the on-disk cubin cache)
                with mixgemm.kernel_options(force=entry, configs={entry: dict(cfg)}):
                    mixgemm.matmul(x, q0)
                torch.cuda.synchronize()
                return 0.0
            return forced_time_us(entry, cfg, x, weights)

        for label, cfgs in candidates(p, m, bits, k, mma_grid_m1, simt_grid, mma_grid_all, simt_only,
                                        compact_only, split_rt, small_m_tiles, simt_pack, mma_pack,
                                        lw_grid, crossover).items():
            entry = label.split("/")[0]
            for i, cfg in enumerate(cfgs):
                rec = {"cfg": plain(cfg), "us": None, "default": i == 0 and label == entry}
                try:
                    rec["us"] = time_us(entry, cfg)
                except Exception as e:  # a config that cannot launch here is recorded, not fatal
                    rec["error"] = repr(e)[:200]
                rows.setdefault(label, []).append(rec)
        # Each entry's default is timed first on a layer's fresh copies, and on the largest layers (H100, 224 MiB at
        # 8192x57344) that first timing read ~10% slow in two sweeps: it is timed again last, and keeps the faster one
        # (the first config of every label: a family's first timing on a layout just built read up to 1.6x slow)
        for label, recs in rows.items():
            if recs and recs[0]["us"] is not None:
                first = recs[0]["us"]
                recs[0]["us"], recs[0]["us_first"] = min(first, time_us(label.split("/")[0], recs[0]["cfg"])), first
        out.append({"K": k, "N": n, "fmt": fmt, "M": m, "default_entry": mixgemm.explain(x, q0).kernel,
                    "rows": rows})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default="w4s,w4z,w8")
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--shapes", default="", help="KxN,... (default: every layer of the model list)")
    ap.add_argument("--budget", type=float, default=280, help="stop starting new layers after S seconds")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16", help="activation dtype")
    ap.add_argument("--no-mma-grid", action="store_true",
                    help="M = 1: time only the tensor-core GEMV's default, not its (KS, U) grid")
    ap.add_argument("--crossover", action="store_true",
                    help="M > 1: the tensor-core GEMV's default on wgmma_v1 against the wgmma GEMM's default only")
    ap.add_argument("--min-n", type=int, default=0, help="only layers with at least this many output features")
    ap.add_argument("--wg-simt", action="store_true",
                    help="M = 1: also time the CUDA-core GEMV on wgmma_v1 (cuda_gemv_wg_simt) over its tile grid")
    ap.add_argument("--simt-only", action="store_true",
                    help="M = 1: only the CUDA-core GEMV's default against the wgmma_v1 CUDA-core grid (--wg-simt)")
    ap.add_argument("--compact-only", action="store_true",
                    help="the plain codes' defaults against the small-M choices on wgmma_v1 (compacted weights)")
    ap.add_argument("--mma-grid-all", action="store_true",
                    help="M > 1: also time the tensor-core GEMV's whole (KS, U) grid")
    ap.add_argument("--split-rt-grid", action="store_true",
                    help="at M > 1 also the GEMV's row tiles (RT 2 / 4) and the wgmma GEMM's cluster split-K "
                         "(split_rt_grid)")
    ap.add_argument("--small-m-tiles", action="store_true",
                    help="M > 1: the tensor-core GEMV's defaults (plain codes, wgmma_v1) against the wgmma GEMM's "
                         "default and its small-M tile family (NWG 2 / 1, KT 2 / 4, cluster splits 1-8)")
    ap.add_argument("--warm", type=int, default=0, metavar="P",
                    help="first compile every config the sweep will time in P parallel processes (each runs its "
                         "share of the cases once, untimed), then time them in this one")
    ap.add_argument("--warm-part", default="", help=argparse.SUPPRESS)  # i/P: one warm-up process's share
    ap.add_argument("--suggest", nargs="+", default=None, metavar="JSON",
                    help="read sweep files and print the M = 1 bucket entries they support (no GPU)")
    ap.add_argument("--suggest-simt", nargs="+", default=None, metavar="JSON",
                    help="read --simt-only sweep files of one GPU and print the wgmma_v1 M = 1 tile entries they "
                         "support, in tuning.gemv_m1's table format (no GPU)")
    ap.add_argument("--simt-held-out", nargs="+", default=None, metavar="JSON",
                    help="read --simt-only sweep files of one GPU and print how --suggest-simt's tables carry to "
                         "layers left out of them (simt_generalization; no GPU)")
    ap.add_argument("--sms", type=int, default=132,
                    help="SM count of the swept GPU, for the rule (--suggest-simt) and MAXB (--suggest)")
    ap.add_argument("--simt-pack", action="store_true",
                    help="--simt-only: time each tile also with PACK (zero-point / offset parameters in one register)")
    ap.add_argument("--mma-pack", action="store_true",
                    help="M > 1: the tensor-core GEMV's default (with --compact-only on both layouts) with PF and PACK "
                         "on and off")
    ap.add_argument("--simt-formats", default="",
                    help="--suggest-simt: only these formats' cases (w4z: the zero-point table)")
    ap.add_argument("--simt-shipped", action="store_true",
                    help="--suggest-simt: against today's pick (the shipped tables) instead of the rule, with at "
                         "most --simt-worst on any layer")
    ap.add_argument("--lw-grid", action="store_true",
                    help="M = 1: the CUDA-core GEMV's default against its lanes-per-row grid (lane_grid) only")
    ap.add_argument("--simt-worst", type=float, default=1.05,
                    help="--suggest-simt: the most a kept tile may take on one layer, over the baseline's time")
    args = ap.parse_args()
    if args.simt_held_out:
        print("time over the grid's best per layer, geometric mean: rule / table (in sample) / table without the layer")
        for cls, v in simt_generalization(args.simt_held_out, args.sms).items():
            print(f"{cls:>10}: {v['rule']:.3f} / {v['table']:.3f} / {v['held_out']:.3f} ({v['cases']} cases)")
        return
    if args.suggest_simt:
        fmts = tuple(f for f in args.simt_formats.split(",") if f)
        resident = simt_resident_blocks
        if fmts:  # the registers of the modes the table serves
            modes = tuple(sorted({_MODE[FORMATS[f][2]] for f in fmts}))
            resident = functools.partial(simt_resident_blocks, modes=modes)
        for bits, bucket, (k, n), t, layers in suggest_simt(args.suggest_simt, args.sms, max_worst=args.simt_worst,
                                                            resident=resident, fmts=fmts, shipped=args.simt_shipped):
            print(f"({bits}, {k}, {n}, {t}),  # {bucket}: " + ", ".join(
                f"{kk}x{nn} {f} {ru:.2f} -> {tu:.2f}" for kk, nn, f, ru, tu in layers))
        return
    if args.suggest:
        for fmt, bucket, (k, n), cfg, layers in suggest(args.suggest, num_sms=args.sms):
            tile = {key: cfg[key] for key in ("R", "U", "KS", "PF", "ZSUM", "LW", "MAXB") if key in cfg}
            print(f"{fmt} {bucket} ({k}, {n}) {tile}: " + ", ".join(f"{kk}x{nn} {d:.2f} -> {t:.2f}"
                                                                   for kk, nn, d, t in layers))
        return
    dtype = getattr(torch, args.dtype)
    fmts, ms = args.formats.split(","), [int(v) for v in args.ms.split(",")]
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    else:
        shapes = sorted(model_layers(list(catalog().values())), key=lambda s: s[0] * s[1])
    shapes = [(k, n) for k, n in shapes if n >= args.min_n]
    di, l2, t0 = device_info(torch.device("cuda")), protocol.l2_bytes(), time.time()
    if args.wg_simt or args.simt_only:
        from mixgemm.kernels.cuda.nvrtc import arch_of

        precompile_simt(fmts, dtype, shapes, arch_of(torch.device("cuda")), args.simt_pack)
        print(f"precompiled the wgmma_v1 CUDA-core grid: {time.time() - t0:.0f} s", flush=True)
    if args.warm_part:
        i, parts = (int(v) for v in args.warm_part.split("/"))
        cases = [(k, n, fmt) for k, n in shapes for fmt in fmts][i::parts]
        for k, n, fmt in cases:
            try:
                measure_layer(k, n, fmt, ms, di, l2, dtype, not args.no_mma_grid, args.wg_simt, args.mma_grid_all,
                              args.simt_only, args.compact_only, args.split_rt_grid, warm_only=True,
                              small_m_tiles=args.small_m_tiles, simt_pack=args.simt_pack,
                              mma_pack=args.mma_pack, lw_grid=args.lw_grid)
            except Exception:
                traceback.print_exc()
            torch.cuda.empty_cache()
        return
    if args.warm:
        import subprocess
        import sys

        argv, skip = [], False
        for a in sys.argv[1:]:  # this command line less --warm P
            if not skip and not a.startswith("--warm"):
                argv.append(a)
            skip = a == "--warm"
        procs = [subprocess.Popen([sys.executable, "-m", "tools.bench.gemv_dispatch", *argv,
                                   f"--warm-part={i}/{args.warm}"]) for i in range(args.warm)]
        for pr in procs:
            pr.wait()
        print(f"warm-up in {args.warm} processes: {time.time() - t0:.0f} s", flush=True)
        t0 = time.time()
    path = os.path.join(args.out, f"gemv_dispatch_{args.dtype}_{'_'.join(fmts)}_m{'_'.join(map(str, ms))}.json")
    res = []
    for k, n in shapes:
        if time.time() - t0 > args.budget:
            break
        for fmt in fmts:
            try:
                res += measure_layer(k, n, fmt, ms, di, l2, dtype, not args.no_mma_grid, args.wg_simt,
                                     args.mma_grid_all, args.simt_only, args.compact_only, args.split_rt_grid,
                                     small_m_tiles=args.small_m_tiles, simt_pack=args.simt_pack,
                                     mma_pack=args.mma_pack, lw_grid=args.lw_grid, crossover=args.crossover)
            except Exception:
                res.append({"K": k, "N": n, "fmt": fmt, "error": traceback.format_exc()[-500:]})
            torch.cuda.empty_cache()
        with open(path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "dtype": args.dtype, "res": res}, f)
        print(f"{k}x{n} {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
