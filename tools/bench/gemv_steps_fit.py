"""Fit the CUDA-core GEMV's step-cost model (kernels/cuda_gemv/gemv_steps.py) to lanes-per-row sweeps, and say how it
carries to layers it was not fitted on. No GPU.

    python -m tools.bench.gemv_steps_fit --train LIST.json [--test OFF.json] [--sms 132]
    python -m tools.bench.gemv_steps_fit --eval SWEEP.json ...    (the shipped costs on these layers)
    python -m tools.bench.gemv_steps_fit --prune SWEEP.json ... [--gpu H200]   (gemv_m1.STEP_MODEL_SERVES of a GPU)

LIST.json / OFF.json: `python -m tools.bench.gemv_dispatch --lw-grid --ms 1 --formats w4s,w4z,w8 [--shapes ...]`
files (of one GPU; a layer in several files takes each tile's fastest time). For each weight family the fit keeps
the step costs whose choice of tile is fastest over the training layers (geometric mean of the chosen tile's time
over the fastest measured tile's, coordinate descent from equal costs); it prints that ratio on the training layers
and, with --test, on the test layers beside the sweep's own default (the dispatch of the day), then the costs fitted
on all the files in tuning.gemv_steps' format.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, replace

from mixgemm.kernels.cuda.gemv_launch import chunks_per_row
from mixgemm.kernels.cuda_gemv.gemv_steps import LaneTile, cheapest_tile, lane_tiles, tile_shape
from mixgemm.tuning.gemv_steps import StepCosts, step_family
from tools.bench.gemv_tables import FORMATS, geomean

SPACE = frozenset(lane_tiles(10 ** 6))  # every tile of the model's space (a row long enough for all of them)
STEP_CLASSES = sorted({t.step_class for t in SPACE})
MULTIPLIERS = (0.6, 0.8, 0.9, 0.95, 1.05, 1.1, 1.25, 1.5)


@dataclass
class Layer:
    """One swept layer of one format: every measured lane tile with its ZSUM {(LaneTile, ZSUM): us} (as a bucket entry
    ran it) and the sweep's default time."""

    k: int
    n: int
    fmt: str
    entry_times: dict
    default_us: float

    @property
    def times(self) -> dict:
        """{LaneTile: us} of the tiles as the model runs them (no ZSUM)."""
        return {t: us for (t, z), us in self.entry_times.items() if not z}

    @property
    def best_us(self) -> float:
        return min(self.times.values())


def _tile(cfg: dict, zsum_ok: bool = False) -> LaneTile | None:
    """The LaneTile of a swept config, None for tiles outside the model's space (PF, bulk ring, KS 7 ...) and, unless
    zsum_ok, for ZSUM tiles, which the model's tiles never run (a zero-point sweep took ZSUM from the layer's bucket
    entry; on the model's tiles it took 1.077x their time, H100: docs/kernels/cuda_gemv.md)."""
    if any(cfg.get(key, 0) for key in ("PF", "XS", "LITE", "BULK", "MINB")):
        return None
    if cfg.get("ZSUM", 0) and not zsum_ok:
        return None
    t = LaneTile(cfg["R"], cfg["U"], cfg["KS"], cfg.get("LW", 32))
    return t if t in SPACE and cfg["RG"] == 8 // cfg["KS"] else None


def load(paths: list[str]) -> list[Layer]:
    """The layers of sweep files where the CUDA-core GEMV serves M = 1 (the sweep's default_entry), one per (K, N,
    format): a layer in several files (a later sweep of more tiles) takes each tile's fastest time and the first
    file's default."""
    out: dict = {}
    for path in paths:
        with open(path) as f:
            sweep = json.load(f)
        for r in sweep["res"]:
            if "rows" not in r or r.get("default_entry") != "cuda_gemv":
                continue
            key = (r["K"], r["N"], r["fmt"])
            entry_times = out[key].entry_times if key in out else {}
            default_us = None
            for row in r["rows"].get("cuda_gemv", []):
                if row.get("default"):
                    default_us = row["us"]
                t = _tile(row["cfg"], zsum_ok=True)
                if t is not None:
                    z = int(row["cfg"].get("ZSUM", 0))
                    entry_times[t, z] = min(row["us"], entry_times.get((t, z), math.inf))
            if key not in out and entry_times and default_us is not None:
                out[key] = Layer(r["K"], r["N"], r["fmt"], entry_times, default_us)
    return [lay for lay in out.values() if lay.times]  # (a layer swept only with ZSUM holds no tile the model runs)


def chosen_ratio(layer: Layer, costs: StepCosts, num_sms: int) -> float:
    """The model's tile's time over the fastest measured tile's, among the tiles measured on the layer."""
    bits, _, mode = FORMATS[layer.fmt]
    kc = chunks_per_row(bits, layer.k)
    legal = set(lane_tiles(kc))
    pick = min((t for t in layer.times if t in legal),
               key=lambda t: costs.cost(tile_shape(t, layer.n, kc, bits, mode, num_sms), t))
    return layer.times[pick] / layer.best_us


def descend(costs: StepCosts, score, multipliers=MULTIPLIERS, passes: int = 6, keys=("round",),
            tol: float = 1e-6) -> tuple[StepCosts, float]:
    """Coordinate descent on a model's costs: each step class, then each of ``keys`` (StepCosts fields: "round",
    "per_log2_ks"), scaled by each of ``multipliers``, a trial kept where ``score`` (smaller is better) drops by more
    than ``tol``; at most ``passes`` passes, fewer once a pass moves nothing. Returns (costs, score)."""
    best = score(costs)
    for _ in range(passes):
        moved = False
        for key in [*costs.step, *keys]:
            for mult in multipliers:
                if key in keys:
                    trial = replace(costs, **{key: getattr(costs, key) * mult})
                else:
                    trial = replace(costs, step={**costs.step, key: costs.step[key] * mult})
                s = score(trial)
                if s < best - tol:
                    best, costs, moved = s, trial, True
        if not moved:
            break
    return costs, best


def fit(layers: list[Layer], num_sms: int, source: str = "") -> tuple[StepCosts, float]:
    """Coordinate descent (descend) on the step costs and the round's, from equal costs, minimizing the geometric mean
    of chosen_ratio over ``layers``."""
    return descend(StepCosts({c: 1.0 for c in STEP_CLASSES}, 0.3, source),
                   lambda c: geomean([chosen_ratio(lay, c, num_sms) for lay in layers]))


def family(fmt: str) -> str:
    """The cost family (tuning.gemv_steps.step_family) of a sweep format."""
    bits, _, mode = FORMATS[fmt]
    return step_family(bits, mode)


def evaluate(layers: list[Layer], num_sms: int) -> None:
    """The shipped costs' choice on each family's layers: chosen / fastest against the sweep's default, and the layers
    where it is over 1.05x."""
    from mixgemm.tuning.gemv_steps import step_costs

    for fam in sorted({family(lay.fmt) for lay in layers}):
        lays = [lay for lay in layers if family(lay.fmt) == fam]
        bits, _, mode = FORMATS[lays[0].fmt]
        costs = step_costs("", bits, mode)
        ratios = [chosen_ratio(lay, costs, num_sms) for lay in lays]
        print(f"{fam}: {len(lays)} layers, shipped costs {geomean(ratios):.3f} the fastest tile's time (the sweep's "
              f"default {geomean([lay.default_us / lay.best_us for lay in lays]):.3f})")
        for lay, r in zip(lays, ratios, strict=True):
            if r > 1.05:
                print(f"    {lay.k}x{lay.n}: {r:.3f} (default {lay.default_us / lay.best_us:.3f})")


def prune(layers: list[Layer], num_sms: int, gpu: str = "H100", worst: float = 1.02,
          protocol_worst: float = 1.0) -> dict:
    """{(gpu, sym?): {bits: [measured (K, N), ...]}}: the gemv_m1 entries of ``gpu`` (all measured, gemv_m1.MEASURED)
    the shipped costs serve as well: the tile the model dispatches (cheapest_tile) within ``worst`` of the entry's on
    every swept layer the entry serves (and on at least one), and, for an entry measured on a protocol layer, within
    ``protocol_worst`` on that layer itself (the protocol shapes are what the project's before / after compares).
    Entries whose tile, or whose layers' model tiles, the sweeps did not time stay."""
    from mixgemm.bench.cli import PRESETS
    from mixgemm.kernels.cuda.gemv_launch import chunks_per_row
    from mixgemm.kernels.cuda_gemv.host import m1_tile_serves
    from mixgemm.tuning import gemv_m1
    from mixgemm.tuning.buckets import ShapeBucket, find
    from mixgemm.tuning.gemv_steps import step_costs

    fmts = {(True, 4): "w4s", (False, 4): "w4z", (True, 8): "w8"}
    out: dict = {}
    for (g, sym), table in gemv_m1.MEASURED.items():
        for bits, entries in table.items():
            fmt = fmts.get((sym, bits))
            if g != gpu or fmt is None:
                continue
            for e in entries:
                t = e.value
                tile = _tile({"R": t.R, "U": t.U, "KS": t.KS, "RG": t.RG or 8 // t.KS, "PF": t.PF, "LW": t.LW,
                              "ZSUM": t.ZSUM, "MINB": t.MINB, "BULK": t.BULK, "LITE": t.LITE}, zsum_ok=True)
                mine = [lay for lay in layers if lay.fmt == fmt and find((e,), ShapeBucket.of(lay.k, lay.n))
                        and chunks_per_row(bits, lay.k) >= min(t.LW * t.U * t.KS, chunks_per_row(bits, e.measured[0]))
                        and m1_tile_serves(t, lay.n, num_sms)]
                mode = FORMATS[fmt][2]
                costs = step_costs(gpu, bits, mode)
                picks = {(lay.k, lay.n): cheapest_tile(lay.n, chunks_per_row(bits, lay.k), bits, mode, num_sms, costs)
                         for lay in mine}
                if (tile is None or not mine or any((tile, t.ZSUM) not in lay.entry_times
                                                    or picks[lay.k, lay.n] not in lay.times for lay in mine)):
                    continue
                ratios = {(lay.k, lay.n): lay.times[picks[lay.k, lay.n]] / lay.entry_times[tile, t.ZSUM]
                          for lay in mine}
                protocol = e.measured in PRESETS["protocol"]
                on_own = ratios.get(e.measured, math.inf) <= protocol_worst
                if max(ratios.values()) <= worst and (not protocol or on_own):
                    out.setdefault((g, sym), {}).setdefault(bits, []).append(e.measured)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", nargs="+", default=[])
    ap.add_argument("--eval", nargs="+", default=[], metavar="JSON",
                    help="only evaluate the shipped costs (tuning.gemv_steps) on these sweep files")
    ap.add_argument("--test", nargs="*", default=[])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--prune", nargs="+", default=[], metavar="JSON",
                    help="print the gemv_m1 entries of --gpu the shipped costs serve within 2%% on every swept layer")
    ap.add_argument("--gpu", default="H100", choices=("H100", "H200"), help="--prune: whose gemv_m1 entries")
    args = ap.parse_args()
    if args.prune:
        for key, by_bits in prune(load(args.prune), args.sms, args.gpu).items():
            for bits, shapes in sorted(by_bits.items()):
                print(f"{key} W{bits}: {sorted(shapes)}")
        return
    if args.eval:
        evaluate(load(args.eval), args.sms)
        return
    if not args.train:
        ap.error("give --train (with --test), --eval or --prune sweep files")
    train, test = load(args.train), load(args.test)
    fitted = {}
    for fam in sorted({family(lay.fmt) for lay in train}):
        tr = [lay for lay in train if family(lay.fmt) == fam]
        te = [lay for lay in test if family(lay.fmt) == fam]
        costs, score = fit(tr, args.sms)
        fitted[fam] = costs
        line = (f"{fam}: {len(tr)} training layers, chosen / fastest {score:.3f} (the sweep's default "
                f"{geomean([lay.default_us / lay.best_us for lay in tr]):.3f})")
        if te:
            line += (f"; {len(te)} test layers {geomean([chosen_ratio(lay, costs, args.sms) for lay in te]):.3f} "
                     f"(default {geomean([lay.default_us / lay.best_us for lay in te]):.3f}, worst "
                     f"{max(chosen_ratio(lay, costs, args.sms) for lay in te):.3f})")
        print(line)
        every, score_all = fit(tr + te, args.sms)
        steps = ", ".join(f"{c}: {v:.3g}" for c, v in sorted(every.step.items()))
        print(f"    fitted on all {len(tr) + len(te)} layers ({score_all:.3f}): step={{{steps}}}, "
              f"round={every.round:.3g}")
    # the model's pick on each test layer against the fastest (a check by eye)
    for lay in test:
        bits, _, mode = FORMATS[lay.fmt]
        kc = chunks_per_row(bits, lay.k)
        fam_costs = fitted[family(lay.fmt)]
        pick = cheapest_tile(lay.n, kc, bits, mode, args.sms, fam_costs)
        print(f"  {lay.fmt} {lay.k}x{lay.n}: model {pick} {chosen_ratio(lay, fam_costs, args.sms):.3f}")


if __name__ == "__main__":
    main()
