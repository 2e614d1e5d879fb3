"""The wgmma GEMM's small-M tile family (a tuning table's ``wgmma_small_m_family`` section) from a sweep: the variants'
small-M model constants, fitted to their timings, and the buckets where the family's pick beat both the GEMV and the
GEMM without the family on every measured layer.

    PYTHONPATH=src python -m tools.bench.gemv_dispatch --small-m-tiles --formats w4s,w4z --ms 16 --out $OUT  # GPU
    PYTHONPATH=src:. python -m tools.bench.small_m_family SWEEP.json --table h100 [--ctas 2=3,1=4]          # anywhere

The model (kernels/cuda_wgmma/wgmma_waves.py, small M) is linear in its four constants, so each variant's are the
non-negative least squares fit of its timings (relative error) over the sweep's layers and cluster splits; the CTAs
one SM holds per NWG come from --ctas (the driver's count where measured), the clusters held at once are the table's
wgmma_small_m counts scaled by them. Printed: each variant's constants and rms log error, how the family's pick
compares with the sweep's fastest family config per case (in sample, and with the case's layer left out of the fit),
then per bucket the pick against the faster of the GEMV and the GEMM without the family, and the section to paste.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

from mixgemm import tuning
from mixgemm.kernels.cuda_wgmma import wgmma_waves as W
from mixgemm.tuning.buckets import ShapeBucket, pow2_at_least

COEF_KEYS = ("launch_us", "step_us", "split_us", "shared_step_us")
MODES = {"w4s": "sym", "w4z": "zero_point"}  # the sweep's formats: W4 g128, fp16 scales


def _key(cfg: dict) -> tuple[int, int, int]:
    return int(cfg["NWG"]), int(cfg["KT"]), int(cfg["SPLIT"])


def cases(paths: list[str]) -> list[dict]:
    """The sweep's M > 1 cases: K, N, M, fmt, the baseline (the faster of the tensor-core GEMV's default and the wgmma
    GEMM's config without the family: the first row of each) and its time, {(NWG, KT, split): us} of the family (the
    wgmma rows after the first)."""
    out = []
    for path in paths:
        with open(path) as f:
            for r in json.load(f)["res"]:
                rows = r.get("rows", {})
                if r.get("fmt") not in MODES or len(rows.get("cuda_wgmma", ())) < 2:
                    continue
                base = [(rows[e][0]["us"], e) for e in ("cuda_gemv_mma", "cuda_wgmma")
                        if rows.get(e, [{}])[0].get("us")]
                fam = {_key(c["cfg"]): c["us"] for c in rows["cuda_wgmma"][1:] if c.get("us")}
                if base and fam:
                    us, entry = min(base)
                    out.append(dict(K=r["K"], N=r["N"], M=r["M"], fmt=r["fmt"], entry=entry, default_us=us, family=fam))
    return out


def section_tiles(base: dict, ctas: dict[int, int], coefs: dict | None = None) -> list[dict]:
    """The section's tiles: NWG 2 / 1 x KT 2 / 4, CTAs per SM from ``ctas`` (by NWG), clusters scaled from the base
    section's (W4), constants from ``coefs`` ({(NWG, KT): {name: value}}; zeros when None)."""
    base_ctas, base_cl = int(base["ctas_per_sm"]["4"]), base["clusters"]["4"]
    out = []
    for nwg in (2, 1):
        for kt in (2, 4):
            c = ctas[nwg]
            coef = (coefs or {}).get((nwg, kt), dict.fromkeys(COEF_KEYS, 0.0))
            out.append({"NWG": nwg, "KT": kt, "ctas_per_sm": {"4": c},
                        "clusters": {"4": {s: max(1, int(v) * c // base_ctas) for s, v in base_cl.items()}},
                        "coef": {"4": {key: round(float(coef[key]), 3) for key in COEF_KEYS}}})
    return out


def _family(base: dict, tiles: list[dict], buckets: list[dict] | None = None) -> W.SmallMFamily:
    any_bucket = [{"bits": 4, "region": {}, "source": "fit"}]
    raw = {"m": base["m"], "tiles": tiles, "buckets": buckets or any_bucket, "source": "fit"}
    return W.SmallMFamily.parse(raw, base, "fit")


def _features(case: dict, cost: W.SmallMCost, split: int, sms: int) -> list[float] | None:
    """The model's four terms for one timing (estimates with one constant 1 and the others 0), or None where the
    model does not run this split (K's stages make another)."""
    w = W.WeightBytes(4, 2, MODES[case["fmt"]], False)
    got, _ = W.split_steps(case["K"], split, int(cost.tile["KT"]))
    if got != split or split not in cost.splits:
        return None
    feats = []
    for key in COEF_KEYS:
        unit = W.SmallMCoef(**{c: float(c == key) for c in COEF_KEYS})
        one = W.SmallMCost(cost.tile, cost.m_range, cost.splits, cost.ctas_per_sm, cost.clusters, {4: unit},
                           cost.sms, cost.source)
        feats.append(W.small_m_estimate_us(case["M"], case["N"], case["K"], split, w, one, sms))
    return feats


def _nonneg_lstsq(a, b):
    """Least squares with every coefficient >= 0: the columns whose coefficient comes out negative are dropped (set to
    0) one at a time, most negative first, and the rest refitted (enough for the model's four terms)."""
    import numpy as np

    active = list(range(a.shape[1]))
    while True:
        x = np.zeros(a.shape[1])
        x[active] = np.linalg.lstsq(a[:, active], b, rcond=None)[0]
        if x.min() >= 0 or len(active) == 1:
            return np.clip(x, 0, None)
        active.remove(int(np.argmin(x)))


def fit(rows: list[dict], base: dict, ctas: dict[int, int], sms: int) -> tuple[dict, dict]:
    """({(NWG, KT): constants}, {(NWG, KT): rms log error}) fitted to the cases' family timings."""
    import numpy as np

    fam = _family(base, section_tiles(base, ctas))
    coefs, errs = {}, {}
    for cost in fam.tiles:
        nwg, kt = int(cost.tile["NWG"]), int(cost.tile["KT"])
        a, t = [], []
        for c in rows:
            for (n2, k2, s), us in c["family"].items():
                f = _features(c, cost, s, sms) if (n2, k2) == (nwg, kt) else None
                if f is not None:
                    a.append(f)
                    t.append(us)
        if not a:
            continue
        a, t = np.array(a), np.array(t)
        x = _nonneg_lstsq(a / t[:, None], np.ones(len(t)))
        coefs[(nwg, kt)] = dict(zip(COEF_KEYS, x.tolist(), strict=True))
        errs[(nwg, kt)] = float(np.sqrt(np.mean(np.log(a @ x / t) ** 2)))
    return coefs, errs


def pick(c: dict, fam: W.SmallMFamily, sms: int) -> tuple[tuple[int, int, int], float] | None:
    """The family's pick for a case and its measured time, or None where it was not timed."""
    w = W.WeightBytes(4, 2, MODES[c["fmt"]], False)
    got = W.choose_small_m_family(c["M"], c["N"], c["K"], w, fam, sms)
    if got is None:
        return None
    key = _key(got.config)
    return (key, c["family"][key]) if key in c["family"] else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="+")
    ap.add_argument("--table", required=True, help="the tuning table whose wgmma_small_m section the family extends")
    ap.add_argument("--ctas", default="2=3,1=4", help="CTAs per SM by NWG (NWG=count,...)")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--min-gain", type=float, default=0.03, help="a bucket's pick must be this much faster than "
                    "the GEMV and the GEMM without the family on every measured case of it")
    ap.add_argument("--source", default="", help="the source string of the printed section")
    a = ap.parse_args(argv)
    base = tuning.load_table(a.table)["wgmma_small_m"]
    ctas = {int(k): int(v) for k, v in (p.split("=") for p in a.ctas.split(","))}
    rows = cases(a.sweeps)
    coefs, errs = fit(rows, base, ctas, a.sms)
    tiles = section_tiles(base, ctas, coefs)
    fam = _family(base, tiles)
    for t in tiles:
        print(f"NWG {t['NWG']} KT {t['KT']}: {t['ctas_per_sm']['4']} CTAs/SM, {t['coef']['4']}, rms log error "
              f"{errs.get((t['NWG'], t['KT']), float('nan')):.3f}")
    picks = [pick(c, fam, a.sms) for c in rows]
    left_out: dict[tuple[int, int], W.SmallMFamily] = {}  # per layer: the family fitted without it
    in_sample, held_out = [], []
    for c, got in zip(rows, picks, strict=True):
        best = min(c["family"].values())
        if got:
            in_sample.append(got[1] / best)
        layer = (c["K"], c["N"])
        if layer not in left_out:
            others = [r for r in rows if (r["K"], r["N"]) != layer]
            left_out[layer] = _family(base, section_tiles(base, ctas, fit(others, base, ctas, a.sms)[0]))
        got = pick(c, left_out[layer], a.sms)
        if got:
            held_out.append(got[1] / best)
    for name, v in (("in sample", in_sample), ("layer left out", held_out)):
        if v:
            print(f"pick / fastest family config, {name}: geometric mean {statistics.geometric_mean(v):.3f}, "
                  f"worst {max(v):.3f} ({len(v)} cases)")
    by_bucket: dict[tuple[int, int], list] = {}
    for c, got in zip(rows, picks, strict=True):
        b = ShapeBucket.of(c["K"], c["N"])
        by_bucket.setdefault((b.k, b.n), []).append((c, got))
    keep = []
    for (bk, bn), lst in sorted(by_bucket.items()):
        ratios = [g[1] / c["default_us"] if g else math.inf for c, g in lst]
        ok = max(ratios) <= 1 - a.min_gain
        if ok:
            keep.append({"k": [bk, bk], "n": [bn, bn]})
        print(f"k{bk}/n{bn} {'family' if ok else '------'} " + ", ".join(
            f"{c['K']}x{c['N']} {c['fmt']} {c['entry']} {c['default_us']:.1f} -> "
            + (f"{g[1]:.1f} NWG {g[0][0]} KT {g[0][1]} split {g[0][2]}" if g else "not timed") for c, g in lst))
    ms = [c["M"] for c in rows]  # the M buckets measured: from the one below the smallest (9..16 for M = 16)
    section = {"m": [pow2_at_least(min(ms)) // 2 + 1, max(ms)] if ms else base["m"], "tiles": tiles,
               "buckets": [{"bits": 4, "region": keep, "source": a.source or "see the section's source"}],
               "source": a.source}
    print(json.dumps(section))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
