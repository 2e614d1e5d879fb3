"""Fit the step-cost model of the CUDA-core GEMV on wgmma_v1 (kernels/cuda_gemv/gemv_steps.py: WgSimtStepTile,
cheapest_wg_simt_tile) to --simt-only sweeps, and say how it carries to layers left out of the fit. No GPU for the fit.

    python -m tools.bench.wg_simt_fit SWEEP.json ... [--sms 132]  (costs per family, in-sample and leave-one-out)
    python -m tools.bench.wg_simt_fit --registers OUT.json        (each tile's registers from this machine's NVRTC:
                                                                   run it where the GPUs' NVRTC version is)

SWEEP.json: `python -m tools.bench.gemv_dispatch --simt-only --ms 1 --formats w4s,w4z,w8 [--dtype bfloat16] --shapes
...` on one GPU (GGUF's groups of 32: w4s32, w4o32, w8s32); a family is a format and an activation dtype. The model
counts rounds of resident blocks from gemv_steps.WG_SIMT_REGISTERS (the table --registers prints). Each family's
costs start equal and move by coordinate descent (three starts) to the smallest geometric mean of the chosen tile's
time over the fastest measured tile's; with every layer left out in turn, the costs fitted on the others choose its
tile (the held-out figure tuning.gemv_steps.WG_SIMT quotes).
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import fields

import torch

from mixgemm.kernels.cuda.gemv_launch import _ACT
from mixgemm.kernels.cuda_gemv.gemv_steps import (
    WG_SIMT_CLASSES,
    WG_SIMT_REGISTERS,
    StepCosts,
    WgSimtStepTile,
    wg_simt_tile_shape,
    wg_simt_tiles,
)
from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_packs
from tools.bench.gemv_steps_fit import descend
from tools.bench.gemv_tables import FORMATS, SIMT_GRID, geomean

KEYS = tuple(f.name for f in fields(WgSimtStepTile))
MULTIPLIERS = (0.3, 0.6, 0.8, 0.9, 0.95, 1.05, 1.1, 1.25, 1.6, 3.0)


def layers_of(path: str, num_sms: int) -> list[dict]:
    """The swept cases: {K, N, family: (fmt, dtype), times: {WgSimtStepTile: us}, shapes: {WgSimtStepTile:
    TileShape}, best}, for the formats and activation dtype whose builds gemv_steps.WG_SIMT_REGISTERS counts. Each tile
    as the dispatcher runs it (zero point / offset: PACK where PF is on); a sweep's other PACK (--simt-pack) is left
    out."""
    with open(path) as f:
        sweep = json.load(f)
    dtype = sweep.get("dtype", "float16")
    act = _ACT[getattr(torch, dtype)]
    out = []
    for r in sweep["res"]:
        if "rows" not in r:
            continue
        bits, group, mode = FORMATS[r["fmt"]]
        g32 = int(group == 32)
        if (bits, mode, act, g32) not in WG_SIMT_REGISTERS:
            continue
        times = {}
        for rec in r["rows"].get(SIMT_GRID, []):
            tile = WgSimtStepTile(*(rec["cfg"][k] for k in KEYS))
            if rec["us"] is not None and rec["cfg"].get("PACK", 0) == wg_simt_packs(tile.config(), mode).get("PACK", 0):
                times[tile] = rec["us"]
        if times:
            shapes = {t: wg_simt_tile_shape(t, r["N"], r["K"], bits, mode, num_sms, act, g32) for t in times}
            out.append({"K": r["K"], "N": r["N"], "family": (r["fmt"], dtype), "times": times, "shapes": shapes,
                        "best": min(times.values())})
    return out


def pick(layer: dict, costs: StepCosts) -> WgSimtStepTile:
    return min(layer["times"], key=lambda t: costs.cost(layer["shapes"][t], t))


def score(layers: list[dict], costs: StepCosts) -> float:
    return geomean([lay["times"][pick(lay, costs)] / lay["best"] for lay in layers])


def fit(layers: list[dict], starts: int = 3, seed: int = 0) -> tuple[StepCosts, float]:
    """The best of ``starts`` coordinate descents (gemv_steps_fit.descend, the KS term too): from equal step costs, then
    from random ones."""
    rng, best = random.Random(seed), None
    for s in range(starts):
        step = {c: 1.0 if s == 0 else rng.uniform(0.5, 1.5) for c in WG_SIMT_CLASSES}
        got = descend(StepCosts(step, 1.0, "fit", 0.1), lambda c: score(layers, c), MULTIPLIERS, 8,
                      ("round", "per_log2_ks"), 1e-7)
        if best is None or got[1] < best[1]:
            best = got
    return best


def registers(path: str) -> None:
    """Each tile's registers for every (bits, mode, act, g32) of gemv_steps.WG_SIMT_REGISTERS (fp16 scales), as the tile
    runs (zero point / offset: PACK where PF is on), from this machine's NVRTC, keyed "bits mode act g32 RT U PF KS
    RG"."""
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_registers

    out = {}
    for bits, mode, act, g32 in WG_SIMT_REGISTERS:
        for t in wg_simt_tiles(1 << 12):
            cfg = {**wg_simt_packs(t.config(), mode), **({"G32": 1} if g32 else {})}
            out[f"{bits} {mode} {act} {g32} " + " ".join(map(str, (getattr(t, key) for key in KEYS)))] = (
                wg_simt_registers(bits, act, 0, mode, tuple(sorted(cfg.items()))))
    with open(path, "w") as f:
        json.dump(out, f, indent=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="*")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--registers", metavar="OUT_JSON")
    args = ap.parse_args()
    if args.registers:
        registers(args.registers)
        return
    layers = [lay for p in args.sweeps for lay in layers_of(p, args.sms)]
    for family in sorted({lay["family"] for lay in layers}):
        fam = [lay for lay in layers if lay["family"] == family]
        costs, s = fit(fam)
        held = [lay["times"][pick(lay, fit([o for o in fam if o is not lay])[0])] / lay["best"] for lay in fam]
        print(f"{' '.join(family)}: {len(fam)} layers, in sample {s:.3f}x the fastest tile, held out "
              f"{geomean(held):.3f}x (worst {max(held):.3f}x)")
        print(f"  step {{{', '.join(f'{c}: {v:.3g}' for c, v in costs.step.items())}}}, round {costs.round:.3g}, "
              f"per_log2_ks {costs.per_log2_ks:.3g}")


if __name__ == "__main__":
    main()
