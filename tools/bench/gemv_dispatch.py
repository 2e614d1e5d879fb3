"""Which small-M kernel and config wins, layer by layer: the measurements behind the GEMV rules of the tuning tables.

For every layer of the model list (mixgemm.bench.models, or --shapes), each weight format (w4s: W4 g128 sym, w4z: W4
g128 zero point, w8: W8 per channel) and each M, this times through mixgemm.matmul, with the benchmark protocol's
graph timing over rotating layer copies (mixgemm.bench.protocol):

* M = 1: the CUDA-core GEMV's default config and its candidates (KernelEntry.candidates), and the tensor-core GEMV
  over its whole (KS, U) grid (KS 1..16 with at least two k-tiles per slice, U 1 / 2);
* M > 1: the CUDA-core GEMV's default, the tensor-core GEMV's default and candidates, and the wgmma GEMM's default;
* with --wg-simt, at M = 1 also the CUDA-core math on wgmma_v1 (gemv_wg_simt.cu) over its (RT, U, PF, KS, RG) grid,
  under the label ``cuda_gemv_mma/wg_simt``; --simt-only times only that grid and the CUDA-core GEMV's default.

Each row says which entry the dispatcher picks today (``default_entry``). The JSON ({"gpu", "res": [{K, N, fmt, M,
default_entry, rows: {entry: [{cfg, us, default}]}}]}) is what choose_mma_config's MMA_WARPS_PER_SM and the
tables' gemv_over_wgmma / gemv_mma_m1 / wgmma_from_m entries were read from; results stay out of the tree
(docs/benchmarking.md).

Usage: PYTHONPATH=src python -m tools.bench.gemv_dispatch --formats w4s,w4z --ms 1,16 --budget 280 --out $OUT
       [--dtype bfloat16] [--no-mma-grid] [--wg-simt] [--simt-only] [--compact-only] [--split-rt-grid] [--warm P]
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
import statistics
import time
import traceback

import torch

import mixgemm
from mixgemm.bench import protocol
from mixgemm.bench.models import catalog, model_layers
from mixgemm.formats.weight import quantize_weight
from mixgemm.kernels import linear as entries
from mixgemm.kernels.cuda.gemv import _MODE, WG_LAYOUT, mma_k_tiles, mma_reduction_fits
from mixgemm.kernels.registry import device_info

FORMATS = {"w4s": (4, 128, "sym"), "w4z": (4, 128, "zero_point"), "w8": (8, -1, "sym"),
           "w4o32": (4, 32, "offset")}  # w4o32: GGUF q4_1 / Q4_K blocks (scale and offset per 32)


def mma_grid(base: dict, kt: int) -> list[dict]:
    """The tensor-core GEMV's (KS, U) grid around ``base``: KS 1..16 with kt >= 2 KS, U 1 or 2, RG = 8 warps / KS."""
    return [{**base, "KS": ks, "RG": max(1, 8 // ks), "U": u}
            for ks in (1, 2, 4, 8, 16) for u in (1, 2) if kt >= 2 * ks]


def mma_variants(base: dict) -> list[dict]:
    """The tensor-core GEMV's M > 1 variants around the default ``base`` (kernels.cuda.gemv.mma_row_tiles): without
    EARLY and RT, with EARLY (the first step's weights before the PDL wait), and EARLY with two row tiles per warp
    (RT 2) at the same KS, less ``base`` itself and those whose k-slice reduction does not fit
    (kernels.cuda.gemv.mma_reduction_fits)."""
    # (explicit 0 / 1: a forced config is laid over the default, kernels.cuda.gemv.mma_override)
    out = [{**base, "EARLY": 0, "RT": 1}, {**base, "EARLY": 1, "RT": 1}, {**base, "EARLY": 1, "RT": 2}]
    same = {**base, "EARLY": base.get("EARLY", 0), "RT": base.get("RT", 1)}
    return [c for c in out if c != same and mma_reduction_fits(c)]


# (RT row tiles per warp, U k-tiles per step, PF double buffering) of the M = 1 CUDA-core math on wgmma_v1: 1-8 tiles of
# 512 bytes per lane in flight (PF counts twice)
SIMT_TILES = ((1, 1, 0), (1, 1, 1), (1, 2, 0), (1, 2, 1), (2, 1, 1), (2, 2, 0), (2, 2, 1), (4, 1, 1), (4, 2, 0))


def wg_simt_grid(kt64: int, pack: bool = False) -> list[dict]:
    """M = 1 CUDA-core math on wgmma_v1 (gemv_wg_simt.cu): SIMT_TILES x KS 2..32 with kt64 >= 2 KS U (64-k tiles) x
    blocks of 4 or 8 warps (RG = warps / KS, at least 1); KS 32 (1024 threads, at most 64 registers each) only for tiles
    of at most two 512-byte pieces in flight. pack: each tile also with its zero-point / offset parameter pair in one
    register (PACK)."""
    out = []
    for rt, u, pf in SIMT_TILES:
        for ks in (2, 4, 8, 16, 32):
            if ks == 32 and rt * u * (1 + pf) > 2:
                continue
            for warps in (4, 8):
                cfg = {"WG": 1, "SIMT": 1, "RT": rt, "U": u, "PF": pf, "KS": ks, "RG": max(1, warps // ks)}
                if kt64 >= 2 * ks * u and cfg not in out:
                    out.append(cfg)
    return out + [{**c, "PACK": 1} for c in out] if pack else out


def precompile_simt(fmts: list[str], dtype: torch.dtype, shapes: list[tuple[int, int]], arch: str,
                    pack: bool = False) -> None:
    """Compile every gemv_wg_simt.cu instantiation the sweep will time, in parallel processes (NVRTC is single
    threaded; the on-disk cubin cache hands them to the timing process)."""
    from concurrent.futures import ProcessPoolExecutor

    from mixgemm.kernels.cuda import nvrtc
    from mixgemm.kernels.cuda.gemv import _ACT, simt_defines_for

    keys = set()
    for fmt in fmts:
        bits, group, mode = FORMATS[fmt]
        for k, _ in shapes:
            for cfg in wg_simt_grid(-(-k // 64), pack):
                d = simt_defines_for(bits, _ACT[dtype], 0, _MODE[mode], {**cfg, "G32": int(group == 32)})
                keys.add(tuple(sorted(d.items())))
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(nvrtc.compile_cubin, ["gemv_wg_simt.cu"] * len(keys), sorted(keys), [arch] * len(keys)))


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
    base = entries._wgmma_config(p)
    gemm = [{**base, "NWG": nwg, "SK": 0, "SERIAL": 0, "SPLIT": s, "CLUSTER": 1} for nwg in (2, 1) for s in (2, 3, 4)]
    return gemv, gemm


def candidates(p, m: int, bits: int, k: int, mma_grid_m1: bool = True,
               simt_grid: bool = False, mma_grid_all: bool = False, simt_only: bool = False,
               compact_only: bool = False, split_rt: bool = False,
               small_m_tiles: bool = False, simt_pack: bool = False) -> dict[str, list[dict]]:
    """{label: [config, ...]} to time for one problem, the entry's default first; a label is the entry's name, or
    name/variant for another config family of the same entry (cuda_gemv_mma/wg_simt: gemv_wg_simt.cu).
    simt_only (M = 1): the CUDA-core GEMV's default on the plain codes against the wgmma_v1 CUDA-core grid (with
    simt_pack each tile also with PACK).
    compact_only: today's defaults on the plain codes against the small-M choices on wgmma_v1 (the layout a
    compacted weight keeps), cuda_gemv_mma/compact: [the compacted weight's own config (M = 1: the CUDA-core GEMV on
    wgmma_v1 at fp16), then at M = 1 the tensor-core GEMV, at M > 1 mma_variants]; at M > 1 the plain codes'
    tensor-core GEMV with mma_variants too.
    small_m_tiles (M > 1): the tensor-core GEMV's defaults on both layouts (cuda_gemv_mma, cuda_gemv_mma/compact)
    against the wgmma GEMM's config without the table's small-M tile family (first) and the family's 16 tiles
    (kernels.linear.small_m_family_candidates)."""
    simt, mma = entries._gemv_config(p), entries._gemv_mma_config(p)
    if small_m_tiles and m > 1:
        on_wg = entries._gemv_mma_config(dataclasses.replace(p, resident=WG_LAYOUT))
        return {"cuda_gemv_mma": [mma], "cuda_gemv_mma/compact": [dict(on_wg)],
                "cuda_wgmma": [entries._wgmma_config(p, small_m_family=False), *entries.small_m_family_candidates(p)]}
    if compact_only:
        on_wg = [dict(entries._gemv_mma_config(dataclasses.replace(p, resident=WG_LAYOUT)))]
        if m == 1:
            on_wg.append({**mma, "WG": 1})
            out = {"cuda_gemv": [simt], "cuda_gemv_mma": [mma, *mma_variants(mma)], "cuda_gemv_mma/compact": on_wg}
            if simt_grid:  # both kernels' grids on wgmma_v1: the tensor-core GEMV's (KS, U) and the CUDA-core tiles
                kt64 = -(-k // 64)
                out["cuda_gemv_mma/compact"] += [c for c in mma_grid(on_wg[-1], kt64) if c not in on_wg]
                out["cuda_gemv_mma/wg_simt"] = wg_simt_grid(kt64)
            return out
        out = {"cuda_gemv": [simt], "cuda_gemv_mma": [mma, *mma_variants(mma)],
               "cuda_gemv_mma/compact": on_wg + mma_variants(on_wg[0])}
        if split_rt:  # the compacted weight's other choices: the GEMV's row tiles and the GEMM's cluster splits
            pr = dataclasses.replace(p, resident=WG_LAYOUT)
            more_gemv, more_gemm = split_rt_grid(pr, on_wg[0], mma_k_tiles(bits, k))
            out["cuda_gemv_mma/compact"] += [c for c in more_gemv if c not in out["cuda_gemv_mma/compact"]]
            out["cuda_wgmma"] = [entries._wgmma_config(pr), *more_gemm, *entries.small_m_family_candidates(pr)]
        return out
    if m == 1 and simt_only:
        return {"cuda_gemv": [simt], "cuda_gemv_mma/wg_simt": wg_simt_grid(-(-k // 64), simt_pack)}
    if m == 1:
        grid = [c for c in mma_grid(mma, mma_k_tiles(bits, k)) if c != mma] if mma_grid_m1 else []
        out = {"cuda_gemv": [simt, *entries._gemv_candidates(p)], "cuda_gemv_mma": [mma, *grid]}
        if simt_grid:
            out["cuda_gemv_mma/wg_simt"] = wg_simt_grid(-(-k // 64))
        return out
    near = entries._gemv_mma_candidates(p)
    if mma_grid_all:
        near += [c for c in mma_grid(mma, mma_k_tiles(bits, k)) if c != mma and c not in near]
    wg = [entries._wgmma_config(p)]
    if split_rt:
        more_gemv, more_gemm = split_rt_grid(p, mma, mma_k_tiles(bits, k))
        near += [c for c in more_gemv if c != mma and c not in near]
        wg += [c for c in more_gemm if c not in wg]
    return {"cuda_gemv": [simt], "cuda_gemv_mma": [mma, *near], "cuda_wgmma": wg}


def plain(cfg: dict) -> dict:
    return {k: (v if isinstance(v, (int, float, str)) else str(v)) for k, v in cfg.items()}


def measure_layer(k: int, n: int, fmt: str, ms: list[int], di, l2: int, dtype: torch.dtype = torch.float16,
                  mma_grid_m1: bool = True, simt_grid: bool = False, mma_grid_all: bool = False,
                  simt_only: bool = False, compact_only: bool = False, split_rt: bool = False,
                  warm_only: bool = False, small_m_tiles: bool = False, simt_pack: bool = False) -> list[dict]:
    bits, group, mode = FORMATS[fmt]
    dev = torch.device("cuda")

    def make():
        w = torch.randn(n, k, device=dev, dtype=torch.float16) * 0.02
        return quantize_weight(w, bits=bits, group_size=group, mode=mode, scale_dtype=torch.float16)

    q0 = make()
    weights = [q0] + [make() for _ in range(protocol.copies_for(q0.nbytes(), l2) - 1)]
    out = []
    for m in ms:
        x = torch.randn(m, k, device=dev, dtype=dtype)
        p = entries.linear_problem(m, q0, dtype, di)
        rows = {}

        def time_us(entry: str, cfg: dict, x: torch.Tensor = x) -> float:
            with mixgemm.kernel_options(force=entry, configs={entry: dict(cfg)}):
                if warm_only:  # compile and load only (a parallel warm-up of the on-disk cubin cache)
                    mixgemm.matmul(x, q0)
                    torch.cuda.synchronize()
                    return 0.0
                return protocol.graph_time_us([lambda q=q: mixgemm.matmul(x, q) for q in weights],
                                              warmup_ms=5, rep_ms=30)

        for label, cfgs in candidates(p, m, bits, k, mma_grid_m1, simt_grid, mma_grid_all, simt_only,
                                        compact_only, split_rt, small_m_tiles, simt_pack).items():
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


def suggest(paths: list[str], min_gain: float = 0.05) -> list[tuple]:
    """Bucket entries for the M = 1 tile tables (mixgemm.tuning.gemv_m1) from sweep files: per (format, bucket), the
    CUDA-core GEMV tile that was at least ``min_gain`` faster than the default on every measured layer of the bucket
    (the fastest by the geometric mean of its ratios where several qualify). Returns [(fmt, bucket key, (K, N) of a
    measured layer, tile, [(K, N, default us, tile us), ...])]."""
    from mixgemm.tuning.buckets import ShapeBucket

    by_bucket: dict = {}
    for path in paths:
        with open(path) as f:
            for r in json.load(f)["res"]:
                if r.get("M") != 1 or "rows" not in r:
                    continue
                rows = [c for c in r["rows"].get("cuda_gemv", []) if c["us"]]
                default = next((c for c in rows if c["default"]), None)
                if default is None:
                    continue
                key = (r["fmt"], ShapeBucket.of(r["K"], r["N"]).key)
                times = {json.dumps(c["cfg"], sort_keys=True): c["us"] for c in rows}
                by_bucket.setdefault(key, []).append((r["K"], r["N"], default["us"], times))
    out = []
    for (fmt, bucket), layers in sorted(by_bucket.items()):
        common = set.intersection(*(set(t) for *_, t in layers))
        best = None
        for cfg in common:
            ratios = [t[cfg] / d for _, _, d, t in layers]
            if max(ratios) <= 1 - min_gain:
                gm = statistics.geometric_mean(ratios)
                if best is None or gm < best[0]:
                    best = (gm, cfg)
        if best is not None:
            cfg = json.loads(best[1])
            out.append((fmt, bucket, layers[0][:2], cfg, [(k, n, d, t[best[1]]) for k, n, d, t in layers]))
    return out


def _beats_rule(ratios: list[float], max_geomean: float, max_worst: float) -> bool:
    return statistics.geometric_mean(ratios) <= max_geomean and max(ratios) <= max_worst


def _simt_tile(c: dict) -> tuple:
    """(RT, U, PF, KS, RG), and a sixth element 1 for a tile with PACK."""
    return (c["RT"], c["U"], c["PF"], c["KS"], c["RG"]) + ((1,) if c.get("PACK", 0) else ())


def _simt_layers(paths: list[str], num_sms: int, fmts: tuple[str, ...] = (), shipped: bool = False) -> list[tuple]:
    """[(bits, bucket key, K, N, fmt, {tile: us}, baseline tile)] of the M = 1 cases (of the formats ``fmts``, all
    when empty) of --simt-only sweep files that timed the baseline's tile: the rule's, or with ``shipped`` what
    kernels.cuda.gemv.wg_simt_config picks now on the swept GPU (the tables of tuning.gemv_m1)."""
    from mixgemm.kernels.cuda.gemv import wg_simt_config, wg_simt_rule
    from mixgemm.tuning.buckets import ShapeBucket

    out = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for r in data["res"]:
            grid = {_simt_tile(c["cfg"]): c["us"] for c in r.get("rows", {}).get("cuda_gemv_mma/wg_simt", [])
                    if c["us"]}
            if r.get("M") != 1 or not grid or (fmts and r["fmt"] not in fmts):
                continue
            bits, _, mode = FORMATS[r["fmt"]]
            if shipped:
                rule = _simt_tile(wg_simt_config(r["N"], r["K"], bits, num_sms, data.get("gpu", ""), mode))
            else:
                rule = _simt_tile(wg_simt_rule(r["N"], r["K"], bits, num_sms))
            if rule in grid:
                out.append((bits, ShapeBucket.of(r["K"], r["N"]).key, r["K"], r["N"], r["fmt"], grid, rule))
    return out


@functools.cache
def simt_resident_blocks(tile: tuple, bits: int, modes: tuple[int, ...] = (0, 1)) -> int:
    """Blocks of a gemv_wg_simt.cu tile (RT, U, PF, KS, RG[, PACK]) that one sm_90 SM holds, for the heaviest build of
    ``modes`` (default sym and zero point: one table entry serves both): registers from the NVRTC cubin
    (nvrtc.cubin_registers, no GPU needed), allocated per warp in units of 256 of the SM's 65536, at most 64 warps
    and 32 blocks."""
    from mixgemm.kernels.cuda import nvrtc
    from mixgemm.kernels.cuda.gemv import SIMT_SOURCE, simt_defines_for

    rt, u, pf, ks, rg = tile[:5]
    cfg = {"RT": rt, "U": u, "PF": pf, "KS": ks, "RG": rg, "PACK": tile[5] if len(tile) > 5 else 0}
    regs = max(max(nvrtc.cubin_registers(nvrtc.compile_cubin(SIMT_SOURCE, tuple(sorted(simt_defines_for(
        bits, 0, 0, mode, cfg).items())), "sm_90")).values()) for mode in modes)
    warps = rg * ks
    return max(1, min(32, 64 // warps, 65536 // (-(-regs // 8) * 8 * 32) // warps))


def _simt_table(cases: list[tuple], max_geomean: float, max_worst: float, num_sms: int = 132,
                resident=simt_resident_blocks) -> dict:
    """{(bits, bucket key): (tile, blocks per SM it serves up to (BPS), [the cases it serves])} by suggest_simt's
    selection."""
    from mixgemm.kernels.cuda.gemv import wg_simt_serves

    by_bucket: dict = {}
    for c in cases:
        by_bucket.setdefault(c[:2], []).append(c)
    out = {}
    for (bits, bucket), layers in sorted(by_bucket.items()):
        common = set.intersection(*(set(g) for *_, g, _ in layers))
        best = None
        for t in sorted(common):
            # every layer of the bucket, or only those whose blocks all fit on the SMs at once (BPS = resident)
            for bps in (0, resident(t, bits)):
                serves = [wg_simt_serves(c[3], t[0], t[4], bps, num_sms) for c in layers]
                used = [c for c, s in zip(layers, serves, strict=True) if s]
                if not used or not _beats_rule([c[5][t] / c[5][c[6]] for c in used], max_geomean, max_worst):
                    continue
                score = statistics.geometric_mean([c[5][t if s else c[6]] / min(c[5].values())
                                                   for c, s in zip(layers, serves, strict=True)])
                if best is None or score < best[0]:
                    best = (score, t, bps, used)
        if best is not None:
            out[(bits, bucket)] = best[1:]
    return out


def _simt_pick(table: dict, case: tuple, num_sms: int = 132) -> tuple:
    """The tile a table gives a case (bits, bucket, K, N, fmt, grid, rule): its bucket's, where the layer's blocks
    per SM are within the entry's BPS (kernels.cuda.gemv.wg_simt_config), else the rule's."""
    from mixgemm.kernels.cuda.gemv import wg_simt_serves

    hit = table.get(case[:2])
    if hit is None or not wg_simt_serves(case[3], hit[0][0], hit[0][4], hit[1], num_sms):
        return case[6]
    return hit[0]


def suggest_simt(paths: list[str], num_sms: int = 132, max_geomean: float = 0.97,
                 max_worst: float = 1.05, resident=simt_resident_blocks, fmts: tuple[str, ...] = (),
                 shipped: bool = False) -> list[tuple]:
    """Bucket entries for the M = 1 tiles of the CUDA-core GEMV on wgmma_v1 (mixgemm.tuning.gemv_m1.WG_SIMT_M1) from
    --simt-only sweep files of one GPU. A tile serves every layer of its bucket (BPS 0) or only those whose blocks
    all fit on the SMs at once (BPS = the blocks an SM holds, ``resident``: simt_resident_blocks), the others taking
    the rule: a tile that wins in one round loses where a layer needs a second (4096x14336's RT 4 tile on
    3584x18944). Per (bits, bucket), of the (tile, BPS) pairs that take <= ``max_geomean`` the time of the rule
    (kernels.cuda.gemv.wg_simt_rule) by geometric mean and at most ``max_worst`` on every layer they serve, the one with
    the smallest geometric mean over the bucket's layers of the time it gives (the tile's or the rule's) over each
    layer's best (the int4 modes together: one entry serves both); no entry where none qualifies. ``fmts`` keeps only
    those formats' cases (the zero-point table: ("w4z",)); ``shipped`` measures against today's pick
    (_simt_layers) instead of the rule, for a table looked up before the shipped ones.
    Returns [(bits, bucket key, (K, N) of a layer it serves, (RT, U, PF, KS, RG, BPS[, PACK]), [(K, N, fmt, rule us,
    tile us), ...] of the layers it serves)]."""
    out = []
    table = _simt_table(_simt_layers(paths, num_sms, fmts, shipped), max_geomean, max_worst, num_sms, resident)
    for (bits, bucket), (best, bps, layers) in table.items():
        k, n = min((c[2], c[3]) for c in layers)
        # PACK explicit for a zero-point table (its default follows PF: kernels.cuda.gemv.wg_simt_packs)
        pack = (best[5] if len(best) > 5 else 0,) if fmts and all(FORMATS[f][2] == "zero_point" for f in fmts) \
            else best[5:]
        out.append((bits, bucket, (k, n), (*best[:5], bps, *pack),
                    [(k_, n_, f, g[rule], g[best]) for *_, k_, n_, f, g, rule in layers]))
    return out


def simt_generalization(paths: list[str], num_sms: int = 132, max_geomean: float = 0.97,
                        max_worst: float = 1.05, resident=simt_resident_blocks) -> dict[str, dict[str, float]]:
    """How suggest_simt's tables carry to layers they were not measured on: for each layer shape, the table built
    without it (every format of that shape left out) picks its tile. Per size class of the weight (``< 4 MiB``,
    ``4-16 MiB``, ``>= 16 MiB``, ``all``), the geometric mean over the cases of the time over the grid's best for the
    rule, the table built from every layer (in sample) and the leave-one-shape-out tables: {class: {"rule", "table",
    "held_out", "cases"}}."""
    cases = _simt_layers(paths, num_sms)
    full = _simt_table(cases, max_geomean, max_worst, num_sms, resident)
    ratios: dict[str, list[tuple[float, float, float]]] = {}
    for shape in sorted({(c[2], c[3]) for c in cases}):
        held = _simt_table([c for c in cases if (c[2], c[3]) != shape], max_geomean, max_worst, num_sms, resident)
        for case in (c for c in cases if (c[2], c[3]) == shape):
            bits, _, k, n, _, grid, rule = case
            best = min(grid.values())
            pick = [_simt_pick(tab, case, num_sms) for tab in (full, held)]
            if any(t not in grid for t in pick):
                continue
            size = k * n * bits // 8
            cls = "< 4 MiB" if size < 4 << 20 else "4-16 MiB" if size < 16 << 20 else ">= 16 MiB"
            row = (grid[rule] / best, grid[pick[0]] / best, grid[pick[1]] / best)
            for name in (cls, "all"):
                ratios.setdefault(name, []).append(row)
    order = ("< 4 MiB", "4-16 MiB", ">= 16 MiB", "all")
    return {cls: {"rule": statistics.geometric_mean([r[0] for r in rows]),
                  "table": statistics.geometric_mean([r[1] for r in rows]),
                  "held_out": statistics.geometric_mean([r[2] for r in rows]), "cases": len(rows)}
            for cls, rows in sorted(ratios.items(), key=lambda kv: order.index(kv[0]))}


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
    ap.add_argument("--wg-simt", action="store_true",
                    help="M = 1: also time the CUDA-core math on wgmma_v1 (MMA_SIMT) over its (KS, U) grid")
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
    ap.add_argument("--sms", type=int, default=132, help="SM count of the swept GPU, for the rule (--suggest-simt)")
    ap.add_argument("--simt-pack", action="store_true",
                    help="--simt-only: time each tile also with PACK (zero-point / offset parameters in one register)")
    ap.add_argument("--simt-formats", default="",
                    help="--suggest-simt: only these formats' cases (w4z: the zero-point table)")
    ap.add_argument("--simt-shipped", action="store_true",
                    help="--suggest-simt: against today's pick (the shipped tables) instead of the rule, with at "
                         "most --simt-worst on any layer")
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
        for fmt, bucket, (k, n), cfg, layers in suggest(args.suggest):
            tile = {key: cfg[key] for key in ("R", "U", "KS", "PF", "ZSUM") if key in cfg}
            print(f"{fmt} {bucket} ({k}, {n}) {tile}: " + ", ".join(f"{kk}x{nn} {d:.2f} -> {t:.2f}"
                                                                   for kk, nn, d, t in layers))
        return
    dtype = getattr(torch, args.dtype)
    fmts, ms = args.formats.split(","), [int(v) for v in args.ms.split(",")]
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    else:
        shapes = sorted(model_layers(list(catalog().values())), key=lambda s: s[0] * s[1])
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
                              small_m_tiles=args.small_m_tiles, simt_pack=args.simt_pack)
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
                                     small_m_tiles=args.small_m_tiles, simt_pack=args.simt_pack)
            except Exception:
                res.append({"K": k, "N": n, "fmt": fmt, "error": traceback.format_exc()[-500:]})
            torch.cuda.empty_cache()
        with open(path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "dtype": args.dtype, "res": res}, f)
        print(f"{k}x{n} {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
