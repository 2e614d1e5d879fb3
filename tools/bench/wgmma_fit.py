"""Fit the wgmma wave model's constants (mixgemm.kernels.cuda_wgmma.wgmma_waves) to a grid run and print the table
section.

    PYTHONPATH=src python -m tools.bench.wgmma --table --grid --no-triton --formats w4g128 --ms 256,512,1024,2048 \
        --shapes ... --out grid.json                       # on the GPU (also measures the cluster slots)
    PYTHONPATH=src:. python -m tools.bench.wgmma_fit grid.json  # anywhere (needs scipy)

Least squares on the log of every grid config's time (the table config is left out: it is what the model replaces),
then how the model's pick compares with the fastest grid config and with the table config, per case.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

from mixgemm.kernels.cuda_wgmma import wgmma_waves as W
from tools.bench.wgmma import GRID_TILES

FIT_WEIGHT = W.WeightBytes(bits=4, scale_bytes=2, mode="zero_point", group32=False)  # the grid's w4g128 weights


def _observations(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        k, n = (int(v) for v in r["shape"].split("x"))
        for a in r["all"][1:]:  # [0] is the table config
            c = a["cfg"]
            if a["err"] > 2e-3:
                continue
            tile = next(i for i, t in enumerate(GRID_TILES) if (t["BM"], t["NWG"]) == (c["BM"], c["NWG"]))
            out.append(dict(m=r["m"], n=n, k=k, tile=tile, split=int(c["SPLIT"]), us=a["us"], shape=r["shape"]))
    return out


def _cost(p, slots: dict, sms: int, margin: float = 1.0) -> W.WaveCost:
    nt = len(GRID_TILES)
    tiles = tuple(W.TileCost(dict(t), float(p[i]), float(p[nt + i])) for i, t in enumerate(GRID_TILES))
    return W.WaveCost(tiles, float(p[2 * nt]), float(p[2 * nt + 1]), slots, sms, 0, margin, "fit")


def _measured(row: dict, cfg: dict) -> float | None:
    """The grid's time of the config ``choose`` returned: the table config's own when it is the same launch, else
    the grid config of the same tile and cluster split (a kept TAIL is timed without it)."""

    def key(c: dict) -> tuple:
        split = int(c.get("SPLIT", 1))
        return int(c["BM"]), int(c.get("NWG", 2)), split, int(c.get("CLUSTER", 0)) if split > 1 else 0

    table = row["all"][0]
    if key(table["cfg"]) == key(cfg):
        return table["us"]
    for a in row["all"][1:]:
        if key(a["cfg"]) == key(cfg):
            return a["us"]
    return None


def _estimate(cost: W.WaveCost, o: dict, sms: int) -> float:
    tile = cost.tiles[o["tile"]]
    return W.estimate_us(o["m"], o["n"], o["k"], tile, o["split"], W.ctas_per_sm(tile.config, FIT_WEIGHT), cost, sms)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("grid", help="the JSON of tools.bench.wgmma --table --grid")
    ap.add_argument("--margin", type=float, default=1.1, help="the table tile's margin (WaveCost.margin)")
    ap.add_argument("--slots", default=None, help="cluster slots 'S:N,...' (default: the run's measured ones)")
    a = ap.parse_args(argv)
    from scipy.optimize import least_squares

    with open(a.grid) as f:
        run = json.load(f)
    sms = int(run.get("sms", 132))
    slots = ({int(s): int(v) for s, v in (x.split(":") for x in a.slots.split(","))} if a.slots
             else {int(s): int(v) for s, v in run["cluster_slots"].items()})
    obs = _observations(run["rows"])
    nt = len(GRID_TILES)

    def residuals(p):
        cost = _cost(p, slots, sms)
        return [math.log(_estimate(cost, o, sms) / o["us"]) for o in obs]

    fit = least_squares(residuals, [0.4] * (2 * nt) + [1.5, 1.0], bounds=(0, 100))
    res = residuals(fit.x)
    cost = _cost(fit.x, slots, sms)
    print(f"{len(obs)} timings, rms log error {math.sqrt(statistics.fmean(r * r for r in res)):.3f}")
    chooser = _cost(fit.x, slots, sms, a.margin)
    ratios, gains = [], []
    for r in run["rows"]:
        k, n = (int(v) for v in r["shape"].split("x"))
        base = {key: v for key, v in r["all"][0]["cfg"].items() if key != "FIT"}
        got = W.choose(r["m"], n, k, base, FIT_WEIGHT, chooser, sms)
        t = _measured(r, got.config) if got is not None else r["all"][0]["us"]
        fastest = min(a["us"] for a in r["all"] if a["err"] <= 2e-3)
        if t is None:
            print(f"  {r['shape']:>11s} M={r['m']:<5d} the choice {got.config} was not timed")
            continue
        ratios.append(t / fastest)
        gains.append(r["all"][0]["us"] / t)
        print(f"  {r['shape']:>11s} M={r['m']:<5d} fastest {fastest:7.1f} us, chosen {t:7.1f} ({ratios[-1]:.2f}x the "
              f"fastest, {gains[-1]:.2f}x faster than the table config): {got.note if got else 'model not applied'}")
    print(f"chosen / fastest: mean {statistics.fmean(ratios):.3f}, max {max(ratios):.2f}; "
          f"speedup over the table config: median {statistics.median(gains):.2f}, min {min(gains):.2f}")
    section = dict(
        tiles=[dict(config=t.config, step_us=round(t.step_us, 4), shared_step_us=round(t.shared_step_us, 4))
               for t in cost.tiles],
        launch_us=round(cost.launch_us, 3), reduce_us=round(cost.reduce_us, 4),
        cluster_slots={str(s): v for s, v in slots.items()}, sms=sms)
    print(json.dumps(section, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
