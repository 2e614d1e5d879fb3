"""tools/bench/small_m_family.py: the small-M tile family's constants fitted to a sweep, and its buckets (CPU only:
synthetic sweeps made from known constants)."""

from __future__ import annotations

import json

import pytest

from mixgemm.kernels.cuda_wgmma import wgmma_waves as W
from mixgemm.tuning import load_table
from tools.bench import small_m_family as T

LAYERS = ((4096, 14336), (3584, 14336), (2048, 22016), (8192, 10240), (27648, 5120), (14336, 4096), (5120, 27648),
          (8192, 8192), (4096, 28672), (36864, 4608))


def _sweep(tmp_path, default_us):
    """A --small-m-tiles sweep whose family times are the H100 section's own model estimates (W4 sym, M = 16)."""
    base = load_table("h100")["wgmma_small_m"]
    fam = W.SmallMFamily.parse(load_table("h100")["wgmma_small_m_family"], base, "test")
    w = W.WeightBytes(4, 2, "sym", False)
    res = []
    for k, n in LAYERS:
        wg = [{"cfg": {"BM": 16}, "us": 99.0, "default": True}]
        best = None
        for cost in fam.tiles:
            for s in cost.splits:
                if W.split_steps(k, s, int(cost.tile["KT"]))[0] != s:
                    continue
                us = W.small_m_estimate_us(16, n, k, s, w, cost, 132)
                wg.append({"cfg": {**cost.tile, "SPLIT": s}, "us": us, "default": False})
                best = us if best is None else min(best, us)
        res.append({"K": k, "N": n, "fmt": "w4s", "M": 16, "default_entry": "cuda_gemv_mma",
                    "rows": {"cuda_gemv_mma": [{"cfg": {}, "us": default_us(k, n, best), "default": True}],
                             "cuda_wgmma": wg}})
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "res": res}))
    return str(path), fam


def test_fit_recovers_the_constants_the_timings_came_from(tmp_path):
    path, fam = _sweep(tmp_path, lambda k, n, best: 2 * best)
    base = load_table("h100")["wgmma_small_m"]
    coefs, errs = T.fit(T.cases([path]), base, {2: 3, 1: 4}, 132)
    for cost in fam.tiles:
        key = (int(cost.tile["NWG"]), int(cost.tile["KT"]))
        assert errs[key] < 1e-6
        for name, want in vars(cost.coef[4]).items():
            assert coefs[key][name] == pytest.approx(want, rel=1e-4, abs=1e-6)


def test_buckets_keep_only_where_the_pick_beats_the_default_on_every_layer(tmp_path, capsys):
    # the default is faster than the family's best on two layers, slower elsewhere
    path, _ = _sweep(tmp_path, lambda k, n, best: best * (0.9 if (k, n) in ((8192, 8192), (14336, 4096)) else 1.2))
    T.main([path, "--table", "h100", "--source", "synthetic"])
    out = capsys.readouterr().out
    section = json.loads(out.strip().splitlines()[-1])
    kept = {(b["k"][0], b["n"][0]) for b in section["buckets"][0]["region"]}
    assert (24, 28) in kept and (22, 29) in kept and (30, 24) in kept  # 4096 / 3584 x 14336, 2048x22016, 36864x4608
    assert (26, 26) not in kept and (28, 24) not in kept  # 8192x8192, 14336x4096
    assert section["m"] == [9, 16] and section["source"] == "synthetic"
    assert "layer left out: geometric mean 1.000" in out
    W.SmallMFamily.parse(section, load_table("h100")["wgmma_small_m"], "printed")  # a section the tables accept
