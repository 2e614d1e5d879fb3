"""Fit the token tiles of a GPU's ``wgmma_waves`` section (mixgemm.kernels.cuda_wgmma.wgmma_waves.TokenTiles) from BM
sweeps of the weight-only wgmma GEMM, and report how the choice does.

Input: JSON files of ``python -m tools.bench.wgmma --table --bm-grid 256,240,...,128 --no-triton --formats w4g128
--ms 1024,2048,4096 --shapes ... --out F`` (GEMM only; per layer, M and format the dispatcher's config first, then the
BM 256 tile's pipeline at each BM, split 1, no TAIL). Per weight width and BM, fixed_us and step_us come from a least
squares fit of time - launch_us = rounds x (fixed_us + step_us x 64-k steps), relative errors, rounds = ceil(CTAs /
SMs). The choice (wgmma_waves.token_tile, on the dispatcher's config of the run) is scored per case against that
config's measured time, in sample and with each layer left out of the fit.

Usage: PYTHONPATH=src:. python -m tools.bench.wgmma_token_fit SWEEP.json... [--margin 1.05] [--tail-us 4]
       [--from-m 1024] [--launch-us 1.774] [--source TEXT]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

import numpy as np

from mixgemm.kernels.cuda_wgmma.gemm_wgmma import K_TILE, output_tiles
from mixgemm.kernels.cuda_wgmma.wgmma_waves import TokenTiles, token_tile
from tools.bench.wgmma import GRID_TILES


def _token_tile(cfg: dict) -> bool:
    """Whether a timed config is the BM 256 tile's pipeline at some BM, one launch (what --bm-grid times)."""
    same = all(cfg.get(key) == v for key, v in GRID_TILES[0].items() if key != "BM")
    return same and int(cfg.get("SPLIT", 1)) == 1 and not int(cfg.get("TAIL", 0)) and not int(cfg.get("SK", 0))


def cases(paths: list[str]) -> list[dict]:
    """One dict per (layer, M, format): bits, K, N, M, SMs, the dispatcher's config and time, {BM: time} of the grid."""
    out = []
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        for r in run["rows"]:
            k, n = (int(v) for v in r["shape"].split("x"))
            table, *grid = r["all"]
            if table["err"] > 2e-3:
                continue
            bms = {int(a["cfg"]["BM"]): a["us"] for a in grid if a["err"] <= 2e-3 and _token_tile(a["cfg"])}
            out.append(dict(bits=int(r["fmt"][1]), k=k, n=n, m=r["m"], sms=int(run.get("sms", 132)),
                            cfg={key: v for key, v in table["cfg"].items() if key != "FIT"}, us=table["us"], bms=bms))
    return out


def fit(data: list[dict], launch_us: float) -> dict[int, dict[int, tuple[float, float]]]:
    """{bits: {BM: (fixed_us, step_us)}} by least squares on the relative error of each timed BM."""
    out: dict[int, dict[int, tuple[float, float]]] = {}
    for bits in sorted({c["bits"] for c in data}):
        out[bits] = {}
        for bm in sorted({b for c in data if c["bits"] == bits for b in c["bms"]}):
            rows, ys = [], []
            for c in data:
                if c["bits"] == bits and bm in c["bms"]:
                    rounds = math.ceil(output_tiles(c["m"], c["n"], bm, 2) / c["sms"])
                    rows.append([rounds, rounds * math.ceil(c["k"] / K_TILE)])
                    ys.append(c["bms"][bm] - launch_us)
            a, y = np.array(rows, float), np.array(ys, float)
            (fixed, step), *_ = np.linalg.lstsq(a / y[:, None], np.ones_like(y), rcond=None)
            out[bits][bm] = (max(0.0, float(fixed)), float(step))
    return out


def score(data: list[dict], tt_of, label: str) -> None:
    """Per case the choice's measured time over the dispatcher's config's; tt_of(case) -> the TokenTiles to use."""
    ratios, moved = [], []
    for c in data:
        got = token_tile(c["m"], c["n"], c["k"], c["cfg"], c["bits"], tt_of(c), c["sms"])
        bm = got[0]["BM"] if got is not None else None
        if bm is not None and bm not in c["bms"]:
            print(f"  {c['k']}x{c['n']} M={c['m']} int{c['bits']}: BM {bm} was not timed")
            continue
        t = c["bms"][bm] if bm is not None else c["us"]
        ratios.append(t / c["us"])
        if bm is not None:
            case = f"{c['k']}x{c['n']} M={c['m']} int{c['bits']}"
            moved.append((t / c["us"], f"{case} BM {bm}: {c['us']:.1f} -> {t:.1f}"))
    gm = lambda v: math.exp(statistics.fmean(math.log(x) for x in v)) if v else 1.0  # noqa: E731
    print(f"{label}: {len(ratios)} cases, {len(moved)} moved; time / the dispatcher's: geometric mean "
          f"{gm(ratios):.4f} (moved {gm([r for r, _ in moved]):.4f}), worst {max(ratios):.3f}")
    for r, text in sorted(moved):
        print(f"  {r:.3f} {text}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweeps", nargs="+")
    ap.add_argument("--margin", type=float, default=1.05)
    ap.add_argument("--tail-us", type=float, default=4.0)
    ap.add_argument("--from-m", type=int, default=1024)
    ap.add_argument("--launch-us", type=float, default=1.774, help="the wave model's launch_us (left out of rounds)")
    ap.add_argument("--source", default="tools/bench/wgmma_token_fit.py")
    a = ap.parse_args(argv)
    data = cases(a.sweeps)

    def section(costs) -> TokenTiles:
        return TokenTiles(a.from_m, a.margin, a.tail_us, costs, a.source)

    costs = fit(data, a.launch_us)
    for bits, table in costs.items():
        print(f"int{bits}: " + ", ".join(f"BM {b} {f:.2f} + {s:.4f} x steps" for b, (f, s) in table.items()))
    whole = section(costs)
    score(data, lambda c: whole, "in sample")
    held = {}
    for layer in {(c["k"], c["n"]) for c in data}:
        held[layer] = section(fit([c for c in data if (c["k"], c["n"]) != layer], a.launch_us))
    score(data, lambda c: held[(c["k"], c["n"])], "each layer left out of the fit")
    print(json.dumps(dict(from_m=a.from_m, margin=a.margin, tail_us=a.tail_us, round_us={
        f"int{bits}": {str(b): dict(fixed_us=round(f, 3), step_us=round(s, 4)) for b, (f, s) in table.items()}
        for bits, table in costs.items()}, source=a.source), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
