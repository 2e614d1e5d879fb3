"""tools/bench/gemv_dispatch.py's candidates, and --suggest / --suggest-simt (tools/bench/gemv_tables.py): which M = 1
bucket entries a sweep file supports (no GPU needed)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from described_gpus import H100, H200
from tools.bench.gemv_tables import SIMT_GRID, simt_generalization, suggest, suggest_simt

BASE = {"R": 4, "U": 1, "KS": 2, "RG": 4, "PF": 0}
FAST = {**BASE, "R": 2}
SLOW = {**BASE, "U": 2}


def _layer(k, n, fmt, default_us, times):
    rows = [{"cfg": BASE, "us": default_us, "default": True}]
    rows += [{"cfg": cfg, "us": us, "default": False} for cfg, us in times]
    return {"K": k, "N": n, "fmt": fmt, "M": 1, "default_entry": "cuda_gemv", "rows": {"cuda_gemv": rows}}


def test_suggest_needs_the_gain_on_every_layer_of_the_bucket(tmp_path):
    res = [
        # bucket k24/n24: FAST is >= 5% faster on both layers, SLOW on neither
        _layer(4096, 4096, "w4s", 10.0, [(FAST, 9.0), (SLOW, 11.0)]),
        _layer(3584, 4096, "w4s", 10.0, [(FAST, 9.4), (SLOW, 12.0)]),
        # bucket k26/n26: FAST wins on one layer only (3% on the other): no entry
        _layer(8192, 8192, "w4s", 20.0, [(FAST, 15.0), (SLOW, 21.0)]),
        _layer(7168, 8192, "w4s", 20.0, [(FAST, 19.4), (SLOW, 21.0)]),
        # another format in the k24/n24 bucket is its own entry; a failed config (us None) is ignored
        _layer(4096, 4096, "w8", 10.0, [(FAST, None), (SLOW, 9.0)]),
        {"K": 1, "N": 1, "fmt": "w4s", "error": "a layer that failed"},
        # a layer another entry serves (here the tensor-core GEMV) does not count against the bucket
        {**_layer(4608, 4096, "w4s", 10.0, [(FAST, 11.0), (SLOW, 12.0)]), "default_entry": "cuda_gemv_mma"},
    ]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"gpu": "test", "res": res}))
    out = suggest([str(path)])
    # MAXB: the layers' blocks per SM (FAST: 8 rows a block, 4096 rows -> 512 blocks, 4 per SM on 132 SMs; SLOW 16)
    assert [(fmt, bucket, cfg) for fmt, bucket, _, cfg, _ in out] == [("w4s", "k24/n24", {**FAST, "MAXB": 4}),
                                                                     ("w8", "k24/n24", {**SLOW, "MAXB": 2})]
    assert suggest([str(path)], num_sms=64)[0][3]["MAXB"] == 8
    (_, _, measured, _, layers) = out[0]
    assert measured == (4096, 4096) and [t for *_, t in layers] == [9.0, 9.4]


def test_split_rt_grid_configs_are_legal(isolated_tuning):
    """--split-rt-grid: the GEMV's row-tile variants fit its k-slice reduction and keep two k-tiles per slice; the wgmma
    GEMM's cluster splits are legal tiles, without stream-K."""
    import torch

    from mixgemm.formats.weight import quantize_weight
    from mixgemm.kernels import cuda_gemv_mma, linear_common
    from mixgemm.kernels.cuda_gemv_mma.host import mma_k_tiles, mma_reduction_fits
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import tile_error
    from tools.bench.gemv_dispatch import candidates, split_rt_grid

    for bits, group, k, n in ((4, 128, 1024, 4608), (8, -1, 384, 2048)):
        qw = quantize_weight(torch.randn(n, k) * 0.02, bits=bits, group_size=group, mode="sym")
        p = linear_common.linear_problem(16, qw, torch.float16, H200)
        mma = cuda_gemv_mma.choose_config(p)
        gemv, gemm = split_rt_grid(p, mma, mma_k_tiles(bits, k))
        assert gemv and all(mma_reduction_fits(c) and mma_k_tiles(bits, k) >= 2 * c["KS"] for c in gemv)
        assert {c["RT"] for c in gemv} <= {2, 4}
        assert {c["SPLIT"] for c in gemm} == {2, 3, 4} and all(tile_error(c) is None and c["SK"] == 0 for c in gemm)
        labels = candidates(p, 16, bits, k, split_rt=True)
        assert all(c in labels["cuda_wgmma"] for c in gemm)


def test_small_m_tiles_times_both_gemv_layouts_against_the_small_m_family(isolated_tuning):
    """--small-m-tiles: at M > 1 the tensor-core GEMV's default on each layout, then the wgmma GEMM's default and the
    16 legal small-M tiles (NWG 2 / 1 x KT 2 / 4 x cluster split 1 / 2 / 4 / 8), without stream-K."""
    import torch

    from mixgemm.formats.weight import quantize_weight
    from mixgemm.kernels import cuda_gemv_mma, cuda_wgmma, linear_common
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import tile_error
    from tools.bench.gemv_dispatch import candidates

    qw = quantize_weight(torch.randn(4608, 1024) * 0.02, bits=4, group_size=128, mode="zero_point")
    p = linear_common.linear_problem(16, qw, torch.float16, H200)
    labels = candidates(p, 16, 4, 1024, small_m_tiles=True)
    assert list(labels) == ["cuda_gemv_mma", "cuda_gemv_mma/compact", "cuda_wgmma"]
    assert labels["cuda_gemv_mma"] == [cuda_gemv_mma.choose_config(p)] and labels["cuda_gemv_mma/compact"][0]["WG"] == 1
    family = labels["cuda_wgmma"][1:]
    assert len(family) == 16 and all(tile_error(c) is None and c["SK"] == 0 for c in family)
    assert {(c["NWG"], c["KT"], c["SPLIT"]) for c in family} == {(w, t, s) for w in (1, 2) for t in (2, 4)
                                                                  for s in (1, 2, 4, 8)}
    assert "cuda_gemv_mma/compact" not in candidates(linear_common.linear_problem(1, qw, torch.float16, H200),
                                                     1, 4, 1024,
                                                      small_m_tiles=True)
    # the baseline GEMM config is the one without the table's family, also in a bucket the family takes (H100)
    wide = dataclasses.replace(linear_common.linear_problem(16, qw, torch.float16, H100), k=4096, n=14336)
    assert "wgmma_small_m_family" in cuda_wgmma.choose_config(wide).source
    first = candidates(wide, 16, 4, 4096, small_m_tiles=True)["cuda_wgmma"][0]
    assert "wgmma_small_m_family" not in getattr(first, "source", "")


def test_crossover_times_the_gemv_on_wgmma_v1_against_the_gemm(isolated_tuning):
    """--crossover: at M > 1 only the compacted weight's two choices, the tensor-core GEMV's default on wgmma_v1 and the
    wgmma GEMM's default; M = 1 keeps the usual families."""
    import torch

    from mixgemm.formats.weight import quantize_weight
    from mixgemm.kernels import cuda_wgmma, linear_common
    from tools.bench.gemv_dispatch import candidates

    qw = quantize_weight(torch.randn(256, 1024) * 0.02, bits=8, group_size=-1, mode="sym")
    p = dataclasses.replace(linear_common.linear_problem(4, qw, torch.float16, H100), k=3584, n=18944)
    labels = candidates(p, 4, 8, 3584, crossover=True)
    assert list(labels) == ["cuda_gemv_mma/compact", "cuda_wgmma"]
    assert [len(v) for v in labels.values()] == [1, 1] and labels["cuda_gemv_mma/compact"][0]["WG"] == 1
    assert labels["cuda_wgmma"][0] == cuda_wgmma.choose_config(dataclasses.replace(p, resident="wgmma_v1"))
    assert "cuda_gemv" in candidates(dataclasses.replace(p, m=1), 1, 8, 3584, crossover=True)


def test_mma_pack_times_each_layouts_default_with_pf_and_pack(isolated_tuning):
    """--mma-pack: at M > 1 each tensor-core GEMV family's default (plain codes; with --compact-only also wgmma_v1)
    first, then the other three (PF, PACK) combinations; M = 1 keeps its own families."""
    import torch

    from mixgemm.formats.weight import quantize_weight
    from mixgemm.kernels import cuda_gemv_mma, linear_common
    from tools.bench.gemv_dispatch import candidates

    qw = quantize_weight(torch.randn(4608, 1024) * 0.02, bits=4, group_size=128, mode="zero_point")
    p = linear_common.linear_problem(16, qw, torch.float16, H100)
    labels = candidates(p, 16, 4, 1024, compact_only=True, mma_pack=True)
    assert list(labels) == ["cuda_gemv_mma", "cuda_gemv_mma/compact"]
    defaults = {"cuda_gemv_mma": cuda_gemv_mma.choose_config(p),
                "cuda_gemv_mma/compact": cuda_gemv_mma.choose_config(dataclasses.replace(p, resident="wgmma_v1"))}
    for label, cfgs in labels.items():
        base = cfgs[0]
        assert base == dict(defaults[label]) and base.get("WG", 0) == (label != "cuda_gemv_mma")
        combos = {(c.get("PF", 0), c.get("PACK", 0)) for c in cfgs}
        assert len(cfgs) == 4 and combos == {(0, 0), (0, 1), (1, 0), (1, 1)}
        assert all({**c, "PF": 0, "PACK": 0} == {**base, "PF": 0, "PACK": 0} for c in cfgs)
    assert list(candidates(p, 16, 4, 1024, mma_pack=True)) == ["cuda_gemv_mma"]
    m1 = linear_common.linear_problem(1, qw, torch.float16, H100)
    assert "cuda_gemv" in candidates(m1, 1, 4, 1024, compact_only=True, mma_pack=True)


def test_compact_only_m1_times_both_kernels_on_wgmma_v1(isolated_tuning):
    """--compact-only at M = 1: the compacted weight's CUDA-core GEMV on wgmma_v1 (its own entry), the tensor-core GEMV
    on wgmma_v1 (the compacted weight's config and the plain codes' tile there), and with --wg-simt both kernels'
    grids; every CUDA-core tile a config of its entry."""
    import torch

    from mixgemm.formats.weight import quantize_weight
    from mixgemm.kernels import cuda_gemv_wg_simt, linear_common
    from mixgemm.kernels.cuda_gemv_wg_simt.config import GemvWgSimtConfig
    from tools.bench.gemv_dispatch import candidates

    qw = quantize_weight(torch.randn(4096, 1024) * 0.02, bits=4, group_size=128, mode="zero_point")
    p = linear_common.linear_problem(1, qw, torch.float16, H100)
    labels = candidates(p, 1, 4, 1024, compact_only=True, simt_grid=True)
    assert list(labels) == ["cuda_gemv", "cuda_gemv_mma", "cuda_gemv_wg_simt", "cuda_gemv_mma/compact", SIMT_GRID]
    assert labels["cuda_gemv_wg_simt"] == [
        dict(cuda_gemv_wg_simt.choose_config(dataclasses.replace(p, resident="wgmma_v1")))]
    assert all(c["WG"] == 1 for c in labels["cuda_gemv_mma/compact"])
    for c in labels["cuda_gemv_wg_simt"] + labels[SIMT_GRID]:
        GemvWgSimtConfig.from_dict(c)


def _simt_layer(k, n, fmt, times):
    rows = [{"cfg": {"RT": t[0], "U": t[1], "PF": t[2], "KS": t[3], "RG": t[4]}, "us": us, "default": False}
            for t, us in times]
    return {"K": k, "N": n, "fmt": fmt, "M": 1, "default_entry": "cuda_gemv",
            "rows": {"cuda_gemv": [{"cfg": {}, "us": 1.0, "default": True}], SIMT_GRID: rows}}


def ONE_BLOCK(tile, bits):  # noqa: N802 - a stand-in for simt_resident_blocks (which compiles the tile)
    return 1


def test_suggest_simt_keeps_a_tile_that_beats_the_rule_across_its_bucket(tmp_path):
    """A bucket gets the tile that is fastest over its layers (both int4 modes together) where it takes <= 0.97x the
    rule's time by geometric mean and at most 1.05x on each layer; a bucket where the rule is as fast gets none."""
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_rule

    def rule(k, n, bits):
        c = wg_simt_rule(n, k, bits, 132)
        return (c["RT"], c["U"], c["PF"], c["KS"], c["RG"])

    other = (4, 2, 0, 8, 1)
    r1, r2 = rule(4096, 4096, 4), rule(8192, 8192, 4)
    assert other not in (r1, r2)
    res = [
        # k24/n24: `other` 0.90x the rule on sym, 0.93x on zero point -> kept
        _simt_layer(4096, 4096, "w4s", [(r1, 10.0), (other, 9.0)]),
        _simt_layer(4096, 4096, "w4z", [(r1, 10.0), (other, 9.3)]),
        # k26/n26: faster on one layer, 1.10x on the other -> no entry
        _simt_layer(8192, 8192, "w4s", [(r2, 20.0), (other, 16.0)]),
        _simt_layer(8192, 8192, "w4z", [(r2, 20.0), (other, 22.0)]),
    ]
    path = tmp_path / "simt.json"
    path.write_text(json.dumps({"gpu": "test", "res": res}))
    out = suggest_simt([str(path)], resident=ONE_BLOCK)
    assert [(bits, bucket, kn, t) for bits, bucket, kn, t, _ in out] == [(4, "k24/n24", (4096, 4096), (*other, 0))]
    assert [(f, ru, tu) for *_, f, ru, tu in out[0][4]] == [("w4s", 10.0, 9.0), ("w4z", 10.0, 9.3)]


def test_suggest_simt_takes_the_fastest_tile_that_qualifies(tmp_path):
    """Where the fastest tile over the bucket's layers loses > 5% to the rule on one of them, the next fastest that
    beats the rule on every layer is kept instead of no entry."""
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_rule

    c = wg_simt_rule(4096, 4096, 4, 132)
    rule = (c["RT"], c["U"], c["PF"], c["KS"], c["RG"])
    fastest, steady = (4, 2, 0, 8, 1), (2, 2, 0, 8, 1)
    assert rule not in (fastest, steady)
    res = [
        # `fastest`: 0.70x and 1.10x the rule (geometric mean over the best 0.97x); `steady`: 0.90x and 0.95x
        _simt_layer(4096, 4096, "w4s", [(rule, 10.0), (fastest, 7.0), (steady, 9.0)]),
        _simt_layer(4096, 4096, "w4z", [(rule, 10.0), (fastest, 11.0), (steady, 9.5)]),
    ]
    path = tmp_path / "simt.json"
    path.write_text(json.dumps({"gpu": "test", "res": res}))
    out = suggest_simt([str(path)], resident=ONE_BLOCK)
    assert [(bits, bucket, t) for bits, bucket, _, t, _ in out] == [(4, "k24/n24", (*steady, 0))]


def test_simt_generalization_leaves_each_shape_out(tmp_path):
    """A bucket measured on two shapes keeps its tile when either is left out (held out = in sample); a bucket of one
    shape has no table without it, so its held-out choice is the rule."""
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_rule

    def rule(k, n):
        c = wg_simt_rule(n, k, 4, 132)
        return (c["RT"], c["U"], c["PF"], c["KS"], c["RG"])

    other = (4, 2, 0, 8, 1)
    res = []
    for k, n in ((4096, 4096), (4096, 4608)):  # one bucket (k24/n24), two shapes: `other` 0.8x the rule on both
        assert rule(k, n) != other
        res += [_simt_layer(k, n, fmt, [(rule(k, n), 10.0), (other, 8.0)]) for fmt in ("w4s", "w4z")]
    assert rule(8192, 8192) != other  # a bucket of its own (k26/n26): `other` 0.5x the rule
    res += [_simt_layer(8192, 8192, fmt, [(rule(8192, 8192), 20.0), (other, 10.0)]) for fmt in ("w4s", "w4z")]
    path = tmp_path / "simt.json"
    path.write_text(json.dumps({"gpu": "test", "res": res}))
    out = simt_generalization([str(path)], resident=ONE_BLOCK)
    assert list(out) == ["4-16 MiB", ">= 16 MiB", "all"]
    mid, big = out["4-16 MiB"], out[">= 16 MiB"]
    assert mid["cases"] == 4 and mid["rule"] == pytest.approx(1.25) and mid["table"] == mid["held_out"] == 1.0
    assert big["cases"] == 2 and big["rule"] == pytest.approx(2.0) and big["table"] == 1.0
    assert big["held_out"] == pytest.approx(2.0)


def test_suggest_simt_limits_a_tile_to_the_rounds_it_was_kept_for(tmp_path):
    """A tile that wins where a layer's blocks fit on the SMs at once but loses where they need a second round serves
    only the layers that fit (BPS = the blocks an SM holds); the others keep the rule, in the table
    (simt_generalization's pick) as in kernels.cuda_gemv_wg_simt.host.wg_simt_config."""
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_blocks_per_sm, wg_simt_rule
    from tools.bench.gemv_tables import _simt_layers, _simt_pick, _simt_table

    def rule(k, n):
        c = wg_simt_rule(n, k, 4, 132)
        return (c["RT"], c["U"], c["PF"], c["KS"], c["RG"])

    wide = (4, 2, 0, 8, 1)  # 64 rows a block: N 14336 -> 2 blocks per SM, N 18944 -> 3
    assert (wg_simt_blocks_per_sm(14336, 4, 1, 132), wg_simt_blocks_per_sm(18944, 4, 1, 132)) == (2, 3)
    res = []
    for fmt in ("w4s", "w4z"):  # bucket k24/n28: 0.9x the rule on 4096x14336, 1.25x on 3584x18944
        res += [_simt_layer(4096, 14336, fmt, [(rule(4096, 14336), 10.0), (wide, 9.0)]),
                _simt_layer(3584, 18944, fmt, [(rule(3584, 18944), 12.0), (wide, 15.0)])]
    path = tmp_path / "simt.json"
    path.write_text(json.dumps({"gpu": "test", "res": res}))
    two = lambda tile, bits: 2  # noqa: E731 - two blocks of the tile per SM
    out = suggest_simt([str(path)], resident=two)
    assert [(bucket, kn, t) for _, bucket, kn, t, _ in out] == [("k24/n28", (4096, 14336), (*wide, 2))]
    assert {(k, n) for k, n, *_ in out[0][4]} == {(4096, 14336)}
    cases = _simt_layers([str(path)], 132)
    table = _simt_table(cases, 0.97, 1.05, resident=two)
    assert {(c[2], _simt_pick(table, c)) for c in cases} == {(4096, wide), (3584, rule(3584, 18944))}
    # with every block resident at once the tile loses on 3584x18944 too: no entry
    assert suggest_simt([str(path)], resident=lambda tile, bits: 4) == []


def test_suggest_simt_zero_point_table_against_todays_pick(tmp_path):
    """--simt-formats w4z --simt-shipped: only the zero-point cases, measured against what wg_simt_config picks today
    on the swept GPU (here none of the tables: the rule, packed as its PF says), tiles with PACK in the grid; the entry
    says PACK explicitly (0 as well: its default would follow PF), and the sym cases of the file are not read."""
    from mixgemm.kernels.cuda_gemv_wg_simt.host import wg_simt_config
    from tools.bench.gemv_tables import _simt_tile

    def today(k, n):
        return _simt_tile(wg_simt_config(n, k, 4, 132, "test", "zero_point"))

    def layer(k, n, fmt, times):
        out = _simt_layer(k, n, fmt, [(t[:5], us) for t, us in times])
        for row, (t, _) in zip(out["rows"][SIMT_GRID], times, strict=True):
            if len(t) > 5 and t[5]:
                row["cfg"]["PACK"] = 1
        return out

    unpacked_pf, packed = (2, 1, 1, 8, 1), (4, 2, 0, 8, 1, 1)
    a, b = today(4096, 4096), today(8192, 8192)
    assert a[5:] == b[5:] == (1,) and a[2] == 1  # the rule double buffers, so today packs
    res = [
        layer(4096, 4096, "w4z", [(a, 10.0), (unpacked_pf, 9.0), (packed, 9.9)]),  # k24/n24: unpacked PF tile wins
        layer(4096, 4096, "w4s", [(a[:5], 10.0), (unpacked_pf, 5.0)]),  # a sym case: not read
        layer(8192, 8192, "w4z", [(b, 20.0), (unpacked_pf, 21.0), (packed, 18.0)]),  # k26/n26: the packed tile
    ]
    path = tmp_path / "simt.json"
    path.write_text(json.dumps({"gpu": "test", "res": res}))
    out = suggest_simt([str(path)], resident=ONE_BLOCK, fmts=("w4z",), shipped=True, max_worst=1.02)
    assert [(bucket, t) for _, bucket, _, t, _ in out] == [("k24/n24", (*unpacked_pf, 0, 0)),
                                                           ("k26/n26", (*packed[:5], 0, 1))]
    assert {f for *_, layers in out for _, _, f, _, _ in layers} == {"w4z"}
