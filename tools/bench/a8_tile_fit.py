"""Fit a GPU's ``a8_tiles`` section (mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8.TokenTileCosts) from BM sweeps of
the int8 wgmma GEMM, and report how its choice does.

Input: JSON files of ``python -m tools.bench.wgmma_a8 --formats w8pc,w4g128qt --bm-grid 256,...,128 --ms 1024,...
--out F`` (GEMM only, one row per layer, M and format, every BM timed). Each (cost family, MC, BM) gets the geometric
mean of time / (rounds x K / 1024), rounds = ceil(CTAs / SMs) (whole rounds: a partial last wave costs a whole
one). The choice is then scored per case against the fastest BM timed and against default_config's tile, in sample
and with each layer left out of the fit.

Usage: PYTHONPATH=src python -m tools.bench.a8_tile_fit SWEEP.json... [--sms 132] [--margin 1.08] [--from-m 1024]
       [--tail-round 0.15] [--source TEXT] [--cases]

The sweep times GEMMs without TAIL, so the scores here leave it out; margin and tail_round were set on whole calls
(mixgemm bench before / after, docs/kernels/cuda_wgmma_a8.md).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import TokenTileCosts, column_tiles, default_config, token_tile


def family(row: dict) -> str | None:
    """The cost family of a sweep row: int8 per channel, or int4 g128 (the sweep's w4g128qt: integer scales, per-token
    activations, the QS tile)."""
    if row["bits"] == 8 and row["group"] == -1:
        return "w8 per channel"
    if row["bits"] == 4 and row.get("fmt", "w4g128qt") == "w4g128qt":
        return "w4 qs"
    return None


def samples(paths: list[str], sms: int) -> list[dict]:
    """One dict per timed (layer, M, format, KT 2 config): its family, MC, BM, rounds and time."""
    out = []
    for path in paths:
        for row in json.loads(Path(path).read_text())["rows"]:
            fam = family(row)
            if fam is None:
                continue
            for t, cfg, _err in row["cuda"]:
                if int(cfg.get("KT", 2)) != 2 or int(cfg.get("NWG", 2)) != 2:
                    continue
                ctas = -(-row["m"] // cfg["BM"]) * column_tiles(row["n"], 2)
                out.append(dict(k=row["k"], n=row["n"], m=row["m"], bits=row["bits"], fam=fam, mc=int(cfg.get("MC", 1)),
                                bm=int(cfg["BM"]), rounds=math.ceil(ctas / sms), us=t))
    return out


def fit(rows: list[dict]) -> dict[tuple[str, int], dict[int, float]]:
    logs = defaultdict(list)
    for r in rows:
        logs[(r["fam"], r["mc"], r["bm"])].append(math.log(r["us"] / (r["rounds"] * r["k"] / 1024)))
    costs: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    for (fam, mc, bm), v in sorted(logs.items()):
        costs[(fam, mc)][bm] = round(math.exp(statistics.fmean(v)), 3)
    return dict(costs)


def ratios(rows: list[dict], costs: TokenTileCosts, sms: int, show: bool = False) -> tuple[list[float], list[float]]:
    """Per case, the chosen tile's time over the fastest BM timed and over default_config's tile (a case whose
    default or choice was not timed is skipped)."""
    cases = defaultdict(dict)
    for r in rows:
        cases[(r["k"], r["n"], r["m"], r["fam"])][r["bm"]] = r
    regret, gain = [], []
    for (k, n, m, fam), by_bm in sorted(cases.items()):
        bits, qs = (4, True) if fam == "w4 qs" else (8, False)
        base = default_config(m, n, k, k if bits == 8 else 128, bits, qs=qs)
        chosen = token_tile(m, n, bits, bits == 8, qs, base, costs, sms)
        if base["BM"] not in by_bm or chosen["BM"] not in by_bm:
            continue
        t = by_bm[chosen["BM"]]["us"]
        regret.append(t / min(r["us"] for r in by_bm.values()))
        gain.append(t / by_bm[base["BM"]]["us"])
        if show:
            print(f"  {k}x{n} M={m} {fam}: BM {base['BM']} -> {chosen['BM']}: {by_bm[base['BM']]['us']:.1f} -> "
                  f"{t:.1f} us (fastest BM {min(by_bm, key=lambda b: by_bm[b]['us'])})")
    return regret, gain


def summary(regret: list[float], gain: list[float]) -> str:
    def gm(v):
        return math.exp(statistics.fmean(map(math.log, v)))

    return (f"{len(gain)} cases, {sum(g != 1.0 for g in gain)} moved; chosen / fastest BM {gm(regret):.3f} (worst "
            f"{max(regret):.3f}); chosen / default {gm(gain):.3f} (best {min(gain):.3f}, worst {max(gain):.3f})")


def section(costs: dict, from_m: int, margin: float, source: str, tail_round: float = 0.0) -> dict:
    round_us: dict = defaultdict(dict)
    for (fam, mc), by_bm in sorted(costs.items()):
        round_us[fam][f"mc{mc}"] = {str(b): v for b, v in sorted(by_bm.items())}
    return dict(from_m=from_m, margin=margin, tail_round=tail_round, round_us=dict(round_us), source=source)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweeps", nargs="+")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--margin", type=float, default=1.08)
    ap.add_argument("--tail-round", type=float, default=0.15,
                    help="what a TAIL split's partial wave costs beyond 1 / split of a round (whole calls: the sweep "
                         "times no TAIL)")
    ap.add_argument("--from-m", type=int, default=1024)
    ap.add_argument("--source", default="(fill in: the GPU, the sweep and this tool's scores)")
    ap.add_argument("--cases", action="store_true", help="print every case's choice")
    args = ap.parse_args()
    rows = samples(args.sweeps, args.sms)
    sec = section(fit(rows), args.from_m, args.margin, args.source, args.tail_round)
    costs = TokenTileCosts.parse(sec, "fit")
    print("in sample:", summary(*ratios(rows, costs, args.sms, args.cases)))
    regret, gain = [], []
    for layer in sorted({(r["k"], r["n"]) for r in rows}):
        rest = [r for r in rows if (r["k"], r["n"]) != layer]
        one = [r for r in rows if (r["k"], r["n"]) == layer]
        c = TokenTileCosts.parse(section(fit(rest), args.from_m, args.margin, "held out"), "fit")
        r, g = ratios(one, c, args.sms)
        regret += r
        gain += g
    print("each layer held out of the fit:", summary(regret, gain))
    print(json.dumps({"a8_tiles": sec}, indent=1))


if __name__ == "__main__":
    main()
