"""The tile tables a gemv_dispatch.py sweep supports (no GPU): reading its JSON files, which M = 1 bucket entries of the
CUDA-core GEMV (tuning.gemv_m1's tables) and of the CUDA-core GEMV on wgmma_v1 (WG_SIMT_M1, WG_SIMT_M1_ZP) they
support, and how those tables carry to layer shapes left out of them. Reached through gemv_dispatch.py's --suggest,
--suggest-simt and --simt-held-out.
"""

from __future__ import annotations

import functools
import json
import statistics

# a sweep's weight formats: name -> (bits, group size, mode); GGUF blocks of 32: w4s32 q4_0, w4o32 q4_1 / Q4_K (scale
# and offset per 32), w8s32 q8_0
FORMATS = {"w4s": (4, 128, "sym"), "w4z": (4, 128, "zero_point"), "w8": (8, -1, "sym"),
           "w4s32": (4, 32, "sym"), "w4o32": (4, 32, "offset"), "w8s32": (8, 32, "sym")}
# a sweep's label of the CUDA-core GEMV on wgmma_v1's tile grid (gemv_dispatch.py --wg-simt / --simt-only)
SIMT_GRID = "cuda_gemv_wg_simt/grid"


def suggest(paths: list[str], min_gain: float = 0.05, num_sms: int = 132) -> list[tuple]:
    """Bucket entries for the M = 1 tile tables (mixgemm.tuning.gemv_m1) from sweep files: per (format, bucket), the
    CUDA-core GEMV tile that was at least ``min_gain`` faster than the default on every measured layer of the bucket
    that the CUDA-core GEMV serves (the sweep's ``default_entry``; the fastest by the geometric mean of its ratios where
    several qualify), with MAXB the most blocks per SM (of ``num_sms``) of those layers (kernels.cuda_gemv.host.
    m1_tile_serves). Returns [(fmt, bucket key, (K, N) of a measured layer, tile, [(K, N, default us, tile us),
    ...])]."""
    from mixgemm.kernels.cuda.gemv_launch import WARPS
    from mixgemm.kernels.cuda_gemv.host import blocks_per_sm
    from mixgemm.tuning.buckets import ShapeBucket

    by_bucket: dict = {}
    for path in paths:
        with open(path) as f:
            for r in json.load(f)["res"]:
                if r.get("M") != 1 or "rows" not in r or r.get("default_entry", "cuda_gemv") != "cuda_gemv":
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
            tile = {**cfg, "RG": cfg.get("RG") or WARPS // cfg["KS"]}
            cfg["MAXB"] = max(blocks_per_sm(n, tile, num_sms) for _, n, _, _ in layers)
            out.append((fmt, bucket, layers[0][:2], cfg, [(k, n, d, t[best[1]]) for k, n, d, t in layers]))
    return out


def geomean(values: list[float]) -> float:
    """The geometric mean of ``values`` (statistics.geometric_mean), nan for none: the tools' summary lines."""
    return statistics.geometric_mean(values) if values else float("nan")


def _beats_rule(ratios: list[float], max_geomean: float, max_worst: float) -> bool:
    return statistics.geometric_mean(ratios) <= max_geomean and max(ratios) <= max_worst


def _simt_tile(c: dict) -> tuple:
    """(RT, U, PF, KS, RG), and a sixth element 1 for a tile with PACK."""
    return (c["RT"], c["U"], c["PF"], c["KS"], c["RG"]) + ((1,) if c.get("PACK", 0) else ())


def _simt_layers(paths: list[str], num_sms: int, fmts: tuple[str, ...] = (), shipped: bool = False) -> list[tuple]:
    """[(bits, bucket key, K, N, fmt, {tile: us}, baseline tile)] of the M = 1 cases (of the formats ``fmts``, all
    when empty) of --simt-only sweep files that timed the baseline's tile: the rule's, or with ``shipped`` what
    kernels.cuda_gemv_wg_simt.host.wg_simt_config picks now on the swept GPU (the tables of tuning.gemv_m1)."""
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_config, wg_simt_rule
    from mixgemm.tuning.buckets import ShapeBucket

    out = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for r in data["res"]:
            grid = {_simt_tile(c["cfg"]): c["us"] for c in r.get("rows", {}).get(SIMT_GRID, []) if c["us"]}
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
    from mixgemm.kernels.cuda_gemv.gemv_steps import resident_blocks
    from mixgemm.kernels.cuda_gemv_wg_simt.host import SIMT_SOURCE, simt_defines_for

    rt, u, pf, ks, rg = tile[:5]
    cfg = {"RT": rt, "U": u, "PF": pf, "KS": ks, "RG": rg, "PACK": tile[5] if len(tile) > 5 else 0}
    regs = max(nvrtc.build_registers(SIMT_SOURCE, tuple(sorted(simt_defines_for(bits, 0, 0, mode, cfg).items())),
                                     "sm_90") for mode in modes)
    return resident_blocks(regs, rg * ks)


def _simt_table(cases: list[tuple], max_geomean: float, max_worst: float, num_sms: int = 132,
                resident=simt_resident_blocks) -> dict:
    """{(bits, bucket key): (tile, blocks per SM it serves up to (BPS), [the cases it serves])} by suggest_simt's
    selection."""
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_serves

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
    per SM are within the entry's BPS (kernels.cuda_gemv_wg_simt.host.wg_simt_config), else the rule's."""
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_serves

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
    (kernels.cuda_gemv_wg_simt.host.wg_simt_rule) by geometric mean and at most ``max_worst`` on every layer they
    serve, the one with the smallest geometric mean over the bucket's layers of the time it gives (the tile's or the
    rule's) over each layer's best (the int4 modes together: one entry serves both); no entry where none qualifies.
    ``fmts`` keeps only those formats' cases (the zero-point table: ("w4z",)); ``shipped`` measures against today's
    pick (_simt_layers) instead of the rule, for a table looked up before the shipped ones.
    Returns [(bits, bucket key, (K, N) of a layer it serves, (RT, U, PF, KS, RG, BPS[, PACK]), [(K, N, fmt, rule us,
    tile us), ...] of the layers it serves)]."""
    out = []
    table = _simt_table(_simt_layers(paths, num_sms, fmts, shipped), max_geomean, max_worst, num_sms, resident)
    for (bits, bucket), (best, bps, layers) in table.items():
        k, n = min((c[2], c[3]) for c in layers)
        # PACK explicit for a zero-point table (its default follows PF: kernels.cuda_gemv_wg_simt.host.wg_simt_packs)
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
