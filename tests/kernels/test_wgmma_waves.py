"""The wgmma GEMM's wave model (mixgemm.kernels.cuda_wgmma.wgmma_waves): tile and cluster split from the wave count,
checked
on the CPU against a described H100 (no GPU needed)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import mixgemm
from described_gpus import H100, H200
from mixgemm.formats.weight import QuantConfig, QuantizedWeight
from mixgemm.kernels.cuda_wgmma import wave_cost as _wave_cost
from mixgemm.kernels.cuda_wgmma import wgmma_waves as W
from mixgemm.kernels.cuda_wgmma.gemm_wgmma import tile_error
from mixgemm.kernels.registry import DeviceInfo
from mixgemm.tuning import load_table

pytestmark = pytest.mark.usefixtures("isolated_tuning")  # NVRTC reported available, no user tuning cache

W4 = W.WeightBytes(bits=4, scale_bytes=2, mode="zero_point", group32=False)


def _layer(n: int, k: int, bits: int = 4, group_size: int = 128) -> QuantizedWeight:
    """A zero-point weight of this shape for the dispatcher, which reads only its shape and format (uninitialised
    buffers: quantizing a 28672 x 8192 weight on the CPU per case would cost seconds)."""
    ng = k // group_size
    return QuantizedWeight(torch.empty(n, k * bits // 8, dtype=torch.uint8), torch.empty(n, ng, dtype=torch.float16),
                           torch.empty(n, ng, dtype=torch.uint8), None,
                           QuantConfig(bits=bits, group_size=group_size, mode="zero_point"), (n, k))


def _wgmma_config(k: int, n: int, m: int, device: DeviceInfo = H100):
    qw = _layer(n, k)
    with mixgemm.kernel_options(force="cuda_wgmma"):
        return mixgemm.explain(torch.empty(m, k, dtype=torch.float16), qw, device=device)


def _clusters_fit(cfg: dict, n: int, m: int, cost: W.WaveCost) -> bool:
    tiles = math.ceil(n / (64 * cfg["NWG"])) * math.ceil(m / cfg["BM"])
    return cfg["SPLIT"] == 1 or tiles <= cost.slots(cfg["SPLIT"], 132) * W.MAX_CTAS_PER_SM


@pytest.mark.parametrize("table", ["h100", "h200"])
def test_tables_carry_a_sourced_wave_model(table):
    cost = _wave_cost(table)
    assert cost is not None and cost.source and cost.from_m >= 1 and cost.margin >= 1
    for t in cost.tiles:
        assert tile_error({**t.config, "SPLIT": 1}) is None
        assert t.step_us > 0 and t.shared_step_us > 0
    assert set(cost.cluster_slots) == {2, 3, 4}
    assert _wave_cost("default") is None  # GPUs without measured constants keep the table / kernel rule


def test_parse_rejects_a_section_without_source():
    raw = dict(load_table("h100")["wgmma_waves"])
    raw.pop("source")
    with pytest.raises(ValueError, match="source"):
        W.WaveCost.parse(raw, "test")
    raw = dict(load_table("h100")["wgmma_waves"], cluster_slots={"9": 1})
    with pytest.raises(ValueError, match="cluster_slots"):
        W.WaveCost.parse(raw, "test")


@pytest.mark.parametrize("k,n,m", [(896, 896, 256), (1536, 256, 512), (4096, 1024, 256), (2048, 2048, 512),
                                   (4864, 896, 1024), (3584, 512, 300)])
def test_few_tile_layers_get_tiles_that_fill_the_gpu(k, n, m):
    """A layer whose table tile makes a handful of CTAs gets a smaller tile and / or a cluster split, a legal one whose
    clusters fit on the GPU at once."""
    cost = _wave_cost("h100")
    choice = _wgmma_config(k, n, m)
    cfg = choice.config
    table_ctas = math.ceil(n / 128) * math.ceil(m / 256)
    ctas = math.ceil(n / (64 * cfg["NWG"])) * math.ceil(m / cfg["BM"]) * cfg["SPLIT"]
    assert ctas > table_ctas
    assert tile_error(cfg) is None
    assert cfg["SPLIT"] == 1 or cfg["CLUSTER"] == 1
    assert _clusters_fit(cfg, n, m, cost)
    assert "wave model" in choice.config_source


@pytest.mark.parametrize("k,n", [(4096, 14336), (8192, 28672), (28672, 8192), (14336, 4096), (5120, 27648)])
@pytest.mark.parametrize("m", [4096, 16384])
def test_many_wave_problems_keep_the_table_tile(k, n, m):
    cfg = _wgmma_config(k, n, m).config
    assert (cfg["BM"], cfg["NWG"], cfg["SPLIT"]) == (256, 2, 1)
    big = next(t for t in _wave_cost("h100").tiles if t.key == (256, 2))
    got = W.tail_split(m, n, k, big, _wave_cost("h100"), 132)
    assert cfg["TAIL"] == (got[0] if got is not None else 0)  # the table's TAIL "auto", made the model's split


def test_tune_candidates_try_every_tail_split():
    """Where a partial last wave follows a whole one, mixgemm tune also times one launch and every TAIL split beside
    the model's pick (tuning can only improve on it); without one, no TAIL variants."""
    from mixgemm.kernels.cuda_wgmma import candidates as _wgmma_candidates
    from mixgemm.kernels.linear_common import linear_problem

    p = linear_problem(1024, _layer(5120, 13824), torch.float16, H100)  # 160 tiles: 28 past one wave
    got = {c.get("TAIL") for c in _wgmma_candidates(p) if c.get("SPLIT") == 1 and c.get("BM") == 256}
    default = _wgmma_config(13824, 5120, 1024).config["TAIL"]
    assert {0, *W.TAIL_SPLITS} - {default} <= got
    p = linear_problem(1024, _layer(128 * 132 // 4, 4096), torch.float16, H100)  # 4 x 33 tiles: one whole wave
    assert len({c.get("TAIL") for c in _wgmma_candidates(p)}) == 1  # the base's TAIL (none applies) throughout


def test_tail_split_follows_the_partial_wave():
    """TAIL's split: none without a partial wave after a whole one; otherwise the split of TAIL_SPLITS the model ranks
    first among those whose clusters all fit at once -- more slices for a few tail tiles over a long K, 2 where the
    slices get short (the reduction costs more than they save) or more clusters would not fit."""
    cost = _wave_cost("h100")
    big = next(t for t in cost.tiles if t.key == (256, 2))
    assert W.tail_split(1024, 128 * 132, 4096, big, cost, 132) is None  # 4 whole waves
    assert W.tail_split(256, 4096, 4096, big, cost, 132) is None  # less than a wave
    few_long = W.tail_split(1024, 5120, 13824, big, cost, 132)  # 160 tiles: 28 in the partial wave, 216 steps
    assert few_long is not None and few_long[0] == max(W.TAIL_SPLITS)
    assert cost.slots(few_long[0], 132) >= 28
    assert W.tail_split(1024, 5120, 1024, big, cost, 132)[0] == 2  # the same tiles over 16 steps
    many = W.tail_split(2048, 5120, 13824, big, cost, 132)  # 56 tail tiles: only pairs fit at once
    assert many is not None and many[0] == 2 and cost.slots(3, 132) < 56
    s, t = few_long  # the estimate: one round of the slice's steps plus (s - 1) reductions of the tile's partials
    steps = W.split_steps(13824, s, 1)[1]
    assert t == pytest.approx(steps * big.step_us + cost.reduce_us * (s - 1) * 256 * 128 / 1024)
    # the call's estimate takes the tail launch in place of a last round of whole tiles
    auto = W.TileCost({**big.config, "TAIL": "auto"}, big.step_us, big.shared_step_us)
    assert W.estimate_us(1024, 5120, 13824, auto, 1, 1, cost, 132) < W.estimate_us(1024, 5120, 13824, big, 1, 1, cost,
                                                                                     132)


def test_below_from_m_the_model_is_not_applied():
    cost = _wave_cost("h100")
    choice = _wgmma_config(896, 896, cost.from_m // 2)
    assert "wave model" not in choice.config_source


def test_estimate_follows_the_waves():
    cost = _wave_cost("h100")
    big = next(t for t in cost.tiles if t.key == (256, 2))
    per_sm = W.ctas_per_sm(big.config, W4)
    one_tile = [W.estimate_us(256, 128, 8192, big, s, per_sm, cost, 132) for s in (1, 2, 4)]
    assert one_tile[0] > one_tile[1] > one_tile[2]  # one tile: every split shortens the only CTA's K
    # one more CTA than a wave costs a second round
    n_full = 132 * 128
    t_full = W.estimate_us(256, n_full, 4096, big, 1, per_sm, cost, 132)
    t_over = W.estimate_us(256, n_full + 128, 4096, big, 1, per_sm, cost, 132)
    assert t_over > 1.5 * t_full


def test_split_steps_match_the_launch():
    # gemm_wgmma._prepare_launch cuts K in whole stages of KT 64-k tiles
    assert W.split_steps(896, 4, 2) == (4, 4)  # 14 tiles: 4 per slice (KT 2) -> 4 slices
    assert W.split_steps(896, 3, 2) == (3, 6)
    assert W.split_steps(256, 8, 1) == (4, 1)


def test_small_tiles_share_an_sm():
    cost = _wave_cost("h100")
    per_sm = {t.key: W.ctas_per_sm(t.config, W4) for t in cost.tiles}
    assert per_sm[(256, 2)] == 1 and per_sm[(64, 1)] == 2
    w8 = W.WeightBytes(bits=8, scale_bytes=2, mode="sym", group32=False)
    assert all(W.ctas_per_sm(t.config, w8) <= per_sm[t.key] for t in cost.tiles)


def test_stream_k_and_serial_table_configs_are_left_alone():
    cost = _wave_cost("h100")
    for key in ("SK", "SERIAL", "WS"):
        base = {"BM": 256, "NWG": 2, "STAGES": 5, key: 1}
        assert W.choose(512, 896, 896, base, W4, cost, 132) is None


@pytest.mark.parametrize("k,n,m,persistent", [
    (896, 9728, 16384, True),    # a wave's stores: 0.31 of its 14-step main loop
    (896, 9728, 4096, True),
    (896, 4864, 16384, True),
    (896, 9728, 512, False),     # fewer than min_waves waves of tiles
    (1536, 8960, 16384, False),  # 24 steps: the stores are 0.18 of the loop
    (4096, 14336, 16384, False),
])
def test_store_bound_layers_run_persistent_whole_tiles(k, n, m, persistent):
    """Where a wave's output stores are a large share of its main loop and the tiles make several waves, the BM 256
    tile runs as persistent whole tiles (SK 2, stores in flight under the next tile; no TAIL); elsewhere as before."""
    cost = _wave_cost("h100")
    choice = _wgmma_config(k, n, m)
    cfg = choice.config
    big = next(t for t in cost.tiles if t.key == (256, 2))
    share = cost.persistent.share(big, math.ceil(k / 64), 132)
    assert (share >= cost.persistent.store_share and math.ceil(n / 128) * math.ceil(m / 256) >= 4 * 132) == persistent
    assert (int(cfg.get("SK", 0)) == 2) == persistent
    if persistent:
        assert (cfg["BM"], cfg["NWG"], cfg["SPLIT"], cfg["TAIL"]) == (256, 2, 1, 0)
        assert tile_error(cfg) is None
        assert "persistent whole tiles" in choice.config_source


def test_store_share_follows_the_copy_bandwidth():
    """The H200 copies faster, so the same layer's stores are a smaller share of its main loop there."""
    h100, h200 = _wave_cost("h100"), _wave_cost("h200")
    big = next(t for t in h100.tiles if t.key == (256, 2))
    assert h200.persistent.share(big, 14, 132) < h100.persistent.share(big, 14, 132)
    raw = dict(load_table("h100")["wgmma_waves"])
    raw["persistent"] = {k: v for k, v in raw["persistent"].items() if k != "source"}
    with pytest.raises(ValueError, match="persistent needs a 'source'"):
        W.WaveCost.parse(raw, "test")


# ------------------------------------------------------------------------------------------------ token tiles
def _tokens() -> W.TokenTiles:
    tokens = _wave_cost("h100").token_tiles
    assert tokens is not None and tokens.source and tokens.margin >= 1
    return tokens


@pytest.mark.parametrize("k,n,m,bm", [
    (896, 4864, 1024, 176),  # 152 BM 256 CTAs: two rounds of 14 steps; 6 x 38 = 228 BM 176 CTAs also take two
    (3072, 3072, 1024, 208),  # 96 CTAs on 132 SMs: 120 of BM 208 still fit one round
    (2048, 2560, 2048, 160),  # 160 CTAs in two rounds (TAIL 2); 260 of BM 160 in two shorter ones
    (4096, 4608, 512, 176),  # 72 CTAs of BM 256 in one round; 108 of BM 176 in one shorter one
    (4096, 14336, 384, 192),  # 224 CTAs either way: BM 192's two token tiles are full, BM 256's second half empty
])
def test_token_tile_fills_the_rounds(k, n, m, bm):
    """Where BM 256 tiles leave a round mostly idle, a smaller BM of the token tiles' list runs in as many rounds or
    fewer, at its own round cost; one launch (no TAIL), the tile's pipeline kept; explain says why."""
    got = _wgmma_config(k, n, m)
    cfg = got.config
    assert (cfg["BM"], cfg["NWG"], cfg["SPLIT"], cfg["TAIL"]) == (bm, 2, 1, 0)
    assert (cfg["STAGES"], cfg["INFLIGHT"]) == (5, 2) and tile_error(cfg) is None
    assert f"token tile BM {bm}" in got.config_source
    tokens = _tokens()
    assert tokens.estimate_us(m, n, k, 4, bm, 0, 132) * tokens.margin <= tokens.estimate_us(m, n, k, 4, 256, 0, 132)


@pytest.mark.parametrize("k,n,m", [
    (8192, 28672, 4096),  # 3584 CTAs: 27.2 waves, the partial one a small share
    (4096, 14336, 1024),  # 3.4 waves, the last as a TAIL split
    (5120, 13824, 2048),  # 8.4 waves
    (4096, 4096, 512),  # the wave model's cluster split 2 (128 CTAs): not a one-launch BM 256 tile
])
def test_token_tile_keeps_bm_256_where_the_rounds_are_full(k, n, m):
    got = _wgmma_config(k, n, m)
    assert got.config["BM"] == 256 and "token tile" not in got.config_source


def test_token_tile_on_the_h200_reads_its_own_table():
    """The H200 table holds its own token tiles (the H100's costs, checked on the H200 down to M = 384): at M = 384
    both GPUs take BM 192 on 4096x14336 (BM 256's second token tile half empty); below the H200 table's from_m the
    wave model's tile stays (a table whose from_m is raised to 512 keeps BM 256 at M = 384)."""
    tokens = _wave_cost("h200").token_tiles
    assert tokens is not None and tokens.source and tokens.from_m <= 384
    assert _wgmma_config(4096, 14336, 384).config["BM"] == 192
    got = _wgmma_config(4096, 14336, 384, H200)
    assert got.config["BM"] == 192 and "token tile BM 192" in got.config_source
    got = _wgmma_config(896, 4864, 1024, H200)
    assert got.config["BM"] < 256 and f"token tile BM {got.config['BM']}" in got.config_source
    base = dict(BM=256, NWG=2, STAGES=5, INFLIGHT=2, TMA=1, GROUP_M=8, SPLIT=1, TAIL=0)
    assert W.token_tile(384, 14336, 4096, base, 4, tokens, 132) is not None
    later = dataclasses.replace(tokens, from_m=512)
    assert W.token_tile(384, 14336, 4096, base, 4, later, 132) is None


def test_token_tile_counts_the_tail_launch():
    """A TAIL split runs BM 256's partial wave as split-K clusters: that wave costs fixed + step x steps / split +
    tail_us, not a whole round; so a layer whose TAIL already evens out the rounds keeps it (3584x4608 int4 at M =
    1024: 144 CTAs, 12 past one wave, TAIL 3)."""
    tokens = _tokens()
    fixed, step = tokens.round_us[4][256]
    m, n, k = 1024, 4608, 3584
    one = fixed + step * 56
    assert tokens.estimate_us(m, n, k, 4, 256, 0, 132) == pytest.approx(2 * one)
    assert tokens.estimate_us(m, n, k, 4, 256, 3, 132) == pytest.approx(one + fixed + step * 56 / 3 + tokens.tail_us)
    cfg = _wgmma_config(k, n, m).config
    assert (cfg["BM"], cfg["TAIL"]) == (256, 3)
    assert W.token_tile(m, n, k, dict(cfg, TAIL=0), 4, tokens, 132) is not None  # without TAIL it would move


def test_token_tile_leaves_other_tiles_alone():
    tokens = _tokens()
    base = dict(BM=256, NWG=2, STAGES=5, INFLIGHT=2, TMA=1, GROUP_M=8, SPLIT=1, TAIL=0)
    assert W.token_tile(1024, 4864, 896, base, 4, tokens, 132) is not None
    for other in (dict(SPLIT=2, CLUSTER=1), dict(SK=2), dict(NWG=4), dict(BM=128), dict(SERIAL=1)):
        assert W.token_tile(1024, 4864, 896, {**base, **other}, 4, tokens, 132) is None
    assert W.token_tile(1024, 4864, 896, base, 2, tokens, 132) is None  # no costs for that width


@pytest.mark.parametrize("change,match", [
    (lambda t: t.pop("source"), "source"),
    (lambda t: t["round_us"]["int4"].pop("256"), "BM 256"),
    (lambda t: t["round_us"]["int4"].update({"100": {"fixed_us": 1, "step_us": 0.5}}), "multiples of 8"),
    (lambda t: t["round_us"].update({"int3": {}}), "int4"),
])
def test_token_tiles_section_is_checked(change, match):
    import copy

    raw = copy.deepcopy(load_table("h100")["wgmma_waves"])
    change(raw["token_tiles"])
    with pytest.raises(ValueError, match=match):
        W.WaveCost.parse(raw, "test")


def test_tune_candidates_take_the_token_tiles():
    from mixgemm.kernels.cuda_wgmma import candidates as _wgmma_candidates
    from mixgemm.kernels.linear_common import linear_problem

    p = linear_problem(1024, _layer(4864, 896), torch.float16, H100)
    bms = {c["BM"] for c in _wgmma_candidates(p) if c.get("NWG") == 2 and c.get("SPLIT") == 1}
    assert set(_tokens().round_us[4]) <= bms | {_wgmma_config(896, 4864, 1024).config["BM"]}
