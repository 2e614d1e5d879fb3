"""The wgmma GEMM at small M (mixgemm.kernels.cuda_wgmma.wgmma_waves small-M split model, a table's ``wgmma_small_m``)
and
the GEMVs' wave-fill rule that hands it M 9..16 (``gemv_min_wave_fill``), checked on the CPU against a described
H200 and H100 (no GPU needed); the GPU test runs the chosen configs against the float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

import mixgemm
from described_gpus import H100, H200
from mixgemm.formats.weight import QuantConfig, QuantizedWeight, quantize_weight
from mixgemm.kernels.cuda_gemv_mma import host as gemv_mma_host
from mixgemm.kernels.cuda_wgmma import small_m_cost as _small_m_cost
from mixgemm.kernels.cuda_wgmma import wgmma_waves as W
from mixgemm.kernels.cuda_wgmma.gemm_wgmma import output_tiles, tile_error
from mixgemm.kernels.registry import DeviceInfo
from mixgemm.reference.matmul import matmul as ref_matmul
from mixgemm.tuning import load_table

W4 = W.WeightBytes(bits=4, scale_bytes=2, mode="zero_point", group32=False)
W8 = W.WeightBytes(bits=8, scale_bytes=2, mode="sym", group32=False)


def _layer(n: int, k: int, bits: int, mode: str = "zero_point", group_size: int = 128) -> QuantizedWeight:
    """A weight of this shape and format for the dispatcher, which reads only those (uninitialised buffers)."""
    if bits == 8:
        mode, group_size = "sym", -1
    ng = 1 if group_size == -1 else k // group_size
    zeros = torch.empty(n, ng, dtype=torch.uint8) if mode == "zero_point" else None
    return QuantizedWeight(torch.empty(n, k * bits // 8, dtype=torch.uint8), torch.empty(n, ng, dtype=torch.float16),
                           zeros, None, QuantConfig(bits=bits, group_size=group_size, mode=mode), (n, k))


def _explain(k: int, n: int, m: int, bits: int, device: DeviceInfo = H200, **options):
    x = torch.empty(m, k, dtype=torch.float16)
    with mixgemm.kernel_options(**options):
        return mixgemm.explain(x, _layer(n, k, bits), device=device)


# ------------------------------------------------------------------------------------------------ CPU


@pytest.mark.usefixtures("isolated_tuning")
@pytest.mark.parametrize("table", ["h100", "h200"])
def test_tables_carry_a_sourced_small_m_model(table):
    cost = _small_m_cost(table)
    assert cost is not None and cost.source and cost.m_range == (5, 16)
    assert 0 < cost.max_table_tiles_per_sm <= 1
    assert 1 in cost.splits and 3 not in cost.splits
    for s in cost.splits:
        assert tile_error({**cost.tile, "SPLIT": s, "CLUSTER": int(s > 1)}) is None
    for bits, c in cost.coef.items():
        assert min(c.launch_us, c.step_us, c.split_us, c.shared_step_us) > 0
        assert set(cost.clusters[bits]) == {s for s in cost.splits if s > 1}
    assert _small_m_cost("default") is None  # not measured there
    assert load_table("h100").get("gemv_min_wave_fill") is None  # measured, not kept (docs/kernels/cuda_wgmma.md)


def test_parse_rejects_an_incomplete_section():
    raw = dict(load_table("h200")["wgmma_small_m"])
    with pytest.raises(ValueError, match="source"):
        W.SmallMCost.parse({k: v for k, v in raw.items() if k != "source"}, "test")
    with pytest.raises(ValueError, match="cluster counts"):
        W.SmallMCost.parse(dict(raw, clusters={"4": {"2": 198}, "8": {"2": 132}}), "test")
    with pytest.raises(ValueError, match="cluster counts"):
        W.SmallMCost.parse(dict(raw, splits=[2, 4]), "test")


@pytest.mark.parametrize("w,k,n,split", [
    # the fastest NWG 2 KT 2 split of the H200 sweep behind the section (M = 8 and 16)
    (W4, 13824, 5120, 8), (W4, 4096, 11008, 4), (W4, 8192, 10240, 4), (W4, 17920, 5120, 8),
    (W8, 36864, 4608, 4), (W8, 3584, 18944, 1), (W8, 4096, 4608, 4), (W8, 9216, 2304, 8), (W8, 1536, 17920, 1),
])
@pytest.mark.parametrize("m", [8, 16])
def test_model_picks_the_measured_split(w, k, n, split, m):
    got = W.choose_small_m(m, n, k, w, _small_m_cost("h200"), 132)
    assert got.config["SPLIT"] == split and got.config["CLUSTER"] == int(split > 1) and got.config["SK"] == 0
    assert got.config["BM"] == 16 and "est." in got.note


def test_estimate_counts_rounds_of_clusters():
    cost = _small_m_cost("h200")
    at_once = cost.clusters[8][4] * 4  # clusters of 4 held at once, in CTAs
    tiles = at_once // 4  # output tiles of 128 rows whose split-4 CTAs just fit
    t_fit = W.small_m_estimate_us(16, tiles * 128, 4096, 4, W8, cost, 132)
    t_over = W.small_m_estimate_us(16, (tiles + 1) * 128, 4096, 4, W8, cost, 132)
    assert t_over > 1.5 * t_fit  # one more tile costs a second round
    assert output_tiles(16, tiles * 128, 16, 2) * 4 <= at_once
    with pytest.raises(ValueError, match="not a split"):
        W.small_m_estimate_us(16, 4096, 4096, 3, W8, cost, 132)
    assert W.choose_small_m(4, 4096, 4096, W8, cost, 132) is None  # below the measured M
    assert W.choose_small_m(17, 4096, 4096, W8, cost, 132) is None


def test_every_slice_keeps_two_stages():
    cost = _small_m_cost("h200")
    for k in (256, 512, 896, 1536, 4096, 14336):
        got = W.choose_small_m(16, 8192, k, W4, cost, 132)
        split, steps = W.split_steps(k, got.config["SPLIT"], 2)
        assert split == got.config["SPLIT"] and (split == 1 or steps >= 4)


def test_gemv_wave_fill():
    cfg = {"KS": 16, "RG": 1, "U": 1}
    assert gemv_mma_host.mma_wave_fill(cfg, 4608, 132) == (288, pytest.approx(288 / 528))  # 2 blocks of 16 warps per SM
    assert gemv_mma_host.mma_wave_fill(cfg, 4096, 132) == (256, pytest.approx(256 / 264))
    # 1 block at RT 2
    assert gemv_mma_host.mma_wave_fill({**cfg, "RT": 2}, 4608, 132) == (144, pytest.approx(144 / 264))
    assert gemv_mma_host.mma_wave_fill({"KS": 8, "RG": 1}, 5120, 132) == (320, pytest.approx(320 / 528))
    assert gemv_mma_host.MMA_WG_BLOCKS_PER_SM == {1: 4, 2: 3}


@pytest.mark.usefixtures("isolated_tuning")
def test_underfilled_gemv_hands_m_9_to_16_to_the_gemm():
    c = _explain(4096, 4608, 16, 8)  # 288 blocks of 16 warps: 55% of two waves
    assert c.kernel == "cuda_wgmma"
    why = dict(c.declined)["cuda_gemv_mma"]
    assert "gemv_min_wave_fill" in why and "55%" in why
    assert c.config["BM"] == 16 and c.config["CLUSTER"] == 1 and "wgmma_small_m" in c.config_source
    assert _explain(4096, 4608, 9, 8).kernel == "cuda_wgmma"
    assert _explain(4096, 4608, 8, 8).kernel == "cuda_gemv_mma"  # M = 8 keeps the GEMV
    assert _explain(4096, 4096, 16, 8).kernel == "cuda_gemv_mma"  # 256 blocks fill 97% of one wave
    assert _explain(4096, 11008, 12, 4).kernel == "cuda_wgmma"  # W4: 688 blocks of 8 warps, 65%
    assert _explain(4096, 12288, 16, 4).kernel == "cuda_gemv_mma"  # 768 blocks, 73%: at the bar, measured even
    assert _explain(14336, 4096, 16, 4).kernel == "cuda_gemv_mma"
    assert _explain(2048, 2048, 16, 4).kernel == "cuda_gemv_mma"  # under 16 MiB: the GEMV's latency wins
    assert _explain(2048, 4608, 16, 8).kernel == "cuda_gemv_mma"  # 9 MiB at 55%
    assert _explain(4096, 4608, 16, 8, device=H100).kernel == "cuda_gemv_mma"  # no rule in the H100 table
    # where the table's own crossover already sends M to the GEMM, it is the reason given (W8, N >= 8192: from M = 2)
    wide = _explain(4096, 11008, 16, 8)
    assert wide.kernel == "cuda_wgmma" and "crossover" in dict(wide.declined)["cuda_gemv_mma"]
    assert _explain(4096, 4608, 16, 8, disable="cuda_wgmma").kernel == "cuda_gemv_mma"


@pytest.mark.usefixtures("isolated_tuning")
def test_small_m_gemm_configs_on_the_h200():
    c = _explain(4096, 11008, 16, 4, force="cuda_wgmma")
    assert {k: c.config[k] for k in ("BM", "NWG", "KT", "SPLIT", "CLUSTER")} == dict(BM=16, NWG=2, KT=2, SPLIT=4,
                                                                                       CLUSTER=1)
    assert _explain(8192, 8192, 16, 4, force="cuda_wgmma").config.get("SK") == 1  # the table's stream-K stays
    # the table's tile already makes a tile per SM or more: it stays
    assert "wgmma_small_m" not in _explain(4096, 14336, 16, 8, force="cuda_wgmma").config_source
    assert "wgmma_small_m" not in _explain(3584, 28672, 16, 4, force="cuda_wgmma").config_source
    assert "wgmma_small_m" not in _explain(4096, 11008, 32, 4, force="cuda_wgmma").config_source
    # the H100: only under half a tile per SM (the table's KT 4 tile stays at 128 tiles outside the tile family's
    # buckets), and its stream-K configs give way
    assert "wgmma_small_m" not in _explain(3072, 16384, 16, 4, device=H100, force="cuda_wgmma").config_source
    c = _explain(17920, 5120, 16, 4, device=H100)
    assert c.kernel == "cuda_wgmma" and "wgmma_small_m" in c.config_source and c.config["SPLIT"] == 8
    assert "wgmma_small_m" in _explain(36864, 4608, 16, 8, device=H100, force="cuda_wgmma").config_source
    assert "wgmma_small_m" not in _explain(36864, 4608, 16, 8, force="cuda_wgmma").config_source  # H200: stream-K


def _family_raw(**over) -> dict:
    raw = dict(load_table("h100")["wgmma_small_m_family"])
    return {**raw, **over}


def test_small_m_family_section_parses_and_says_what_is_wrong():
    base = load_table("h100")["wgmma_small_m"]
    fam = W.SmallMFamily.parse(_family_raw(), base, "test")
    assert fam.source and fam.m_range == (9, 16) and len(fam.tiles) == 4
    assert {(t.tile["NWG"], t.tile["KT"]) for t in fam.tiles} == {(2, 2), (2, 4), (1, 2), (1, 4)}
    for t in fam.tiles:
        assert t.tile["BM"] == base["tile"]["BM"] and min(vars(t.coef[4]).values()) >= 0
        for s in t.splits:
            assert tile_error({**t.tile, "SPLIT": s, "CLUSTER": int(s > 1)}) is None
    with pytest.raises(ValueError, match="source"):
        W.SmallMFamily.parse(_family_raw(source=""), base, "test")
    bucket = {"bits": 4, "region": {"k": [24, 24], "n": [28, 28]}, "source": "x"}
    with pytest.raises(ValueError, match="8-bit"):
        W.SmallMFamily.parse(_family_raw(buckets=[{**bucket, "bits": 8}]), base, "test")
    with pytest.raises(ValueError):  # two entries over one bucket
        W.SmallMFamily.parse(_family_raw(buckets=[bucket, bucket]), base, "test")
    with pytest.raises(ValueError, match="source"):
        W.SmallMFamily.parse(_family_raw(buckets=[{**bucket, "source": ""}]), base, "test")
    assert fam.covers(16, 4, 4096, 14336) and fam.covers(9, 4, 3584, 18944)
    assert not fam.covers(8, 4, 4096, 14336) and not fam.covers(17, 4, 4096, 14336)
    assert not fam.covers(16, 8, 4096, 14336) and not fam.covers(16, 4, 8192, 8192)


def test_small_m_family_takes_the_variant_its_models_rank_first():
    base = load_table("h100")["wgmma_small_m"]
    fam = W.SmallMFamily.parse(_family_raw(), base, "test")
    for k, n in ((4096, 14336), (2048, 22016), (27648, 5120), (8192, 10240)):
        got = W.choose_small_m_family(16, n, k, W4, fam, 132)
        ests = [(e[0], (int(t.tile["NWG"]), int(t.tile["KT"]), e[1])) for t in fam.tiles
                if (e := W.rank_small_m(16, n, k, W4, t, 132))]
        assert (got.config["NWG"], got.config["KT"], got.config["SPLIT"]) == min(ests)[1]
        assert got.config["CLUSTER"] == int(got.config["SPLIT"] > 1) and got.config["SK"] == 0
        assert f"est. {min(ests)[0]:.1f} us" in got.note
    # a variant made slow everywhere is never picked
    slow = [{**t, "coef": {"4": {**t["coef"]["4"], "launch_us": 1000.0}}} if t["NWG"] == 1 else t
            for t in _family_raw()["tiles"]]
    fam2 = W.SmallMFamily.parse(_family_raw(tiles=slow), base, "test")
    assert W.choose_small_m_family(16, 22016, 2048, W4, fam2, 132).config["NWG"] == 2


@pytest.mark.usefixtures("isolated_tuning")
def test_small_m_family_takes_m_9_to_16_on_its_buckets_of_the_h100():
    for k, n in ((4096, 14336), (2048, 22016), (27648, 5120), (4096, 11008)):
        c = _explain(k, n, 16, 4, device=H100)
        assert c.kernel == "cuda_wgmma" and "wgmma_small_m_family" in c.config_source, str(c)
        assert c.config["BM"] == 16 and "small-M tile family" in dict(c.declined).get("cuda_gemv_mma", "") + \
            c.config_source
        assert _explain(k, n, 9, 4, device=H100).config == c.config
        assert _explain(k, n, 8, 4, device=H100).kernel == "cuda_gemv_mma"  # M 8: the GEMV, as before
    why = dict(_explain(2048, 22016, 12, 4, device=H100).declined)["cuda_gemv_mma"]
    assert "small-M tile family" in why and "k22/n29" in why
    # outside its buckets, for int8 weights, on the H200 and with the GEMM disabled: as before
    assert "family" not in _explain(8192, 8192, 16, 4, device=H100).config_source
    assert _explain(8192, 8192, 16, 4, device=H100).kernel == "cuda_gemv_mma"
    assert "family" not in _explain(8192, 28672, 16, 4, device=H100).config_source
    assert "family" not in _explain(4096, 14336, 16, 8, device=H100, force="cuda_wgmma").config_source
    assert "family" not in _explain(2048, 22016, 16, 4).config_source
    assert _explain(2048, 22016, 16, 4, device=H100, disable="cuda_wgmma").kernel == "cuda_gemv_mma"


@pytest.mark.usefixtures("isolated_tuning")
def test_small_m_family_takes_m_9_to_16_on_its_buckets_of_the_h200():
    """The H200's own section (its sweep and fit): its measured layers take the family at M 9..16, the layers of the
    buckets it left out keep the GEMV or the table's tile."""
    for k, n in ((3072, 16384), (4096, 22016), (5120, 13824), (5120, 15360), (8192, 10240)):
        c = _explain(k, n, 16, 4, device=H200)
        assert c.kernel == "cuda_wgmma" and "h200.json wgmma_small_m_family" in c.config_source, str(c)
        assert _explain(k, n, 9, 4, device=H200).config == c.config
        assert "family" not in _explain(k, n, 8, 4, device=H200).config_source
    for k, n in ((4096, 14336), (3584, 18944), (8192, 8192), (28672, 8192)):  # buckets left out
        assert "family" not in _explain(k, n, 16, 4, device=H200).config_source


# ------------------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm_90 GPU")
@pytest.mark.parametrize("m", [2, 5, 8, 9, 13, 16])
@pytest.mark.parametrize("bits,gs,mode,n,k", [(8, -1, "sym", 4608, 4096), (4, 128, "zero_point", 11008, 4096),
                                              (4, 32, "sym", 11000, 4128), (8, 64, "offset", 5000, 4096),
                                              (4, 64, "offset", 12288, 4096), (4, 128, "sym", 3584, 27648)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_small_m_dispatch_matches_the_reference(m, bits, gs, mode, n, k, dtype):
    """Through mixgemm.matmul on this GPU (on an H200 the wave-fill rule sends these layers to the GEMM's small-M
    cluster split at M 9..16; at M 2..8 the int8 GEMV's one-wave k-split; on an H100 the small-M tile family takes the
    int4 layers at M 9..16: NWG 1 KT 4 on 4096 x 11008 / 12288, NWG 2 KT 2 at cluster split 8 on 27648 x 3584), fresh
    data, against the float64 reference on the same quantized weight."""
    torch.manual_seed(m * 7 + bits)
    qw = quantize_weight(torch.randn(n, k, device="cuda") * 0.02, bits=bits, group_size=gs, mode=mode)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    choice = mixgemm.explain(x, qw)
    if "H200" in torch.cuda.get_device_name() and gs in (-1, 128) and m >= 9:
        assert choice.kernel == "cuda_wgmma" and choice.config["BM"] == 16, str(choice)
    if "H100" in torch.cuda.get_device_name() and bits == 4 and m >= 9:
        assert choice.kernel == "cuda_wgmma" and "wgmma_small_m_family" in choice.config_source, str(choice)
    if m <= 8 and bits == 8 and n == 4608 and "H200" in torch.cuda.get_device_name():  # gemv.one_wave_k_split
        assert choice.kernel == "cuda_gemv_mma" and choice.config["KS"] == 8, str(choice)
    y = mixgemm.matmul(x, qw)
    ref = ref_matmul(x.double(), qw, None, None, out_dtype=torch.float64)
    tol = 2e-3 if dtype == torch.float16 else 1e-2
    assert y.dtype == dtype and y.shape == (m, n)
    assert float((y.double() - ref).norm() / ref.norm()) < tol
    assert math.isfinite(float(y.float().abs().max()))


def test_int8_k_slices_stop_at_the_layers_64_k_tiles():
    """int8 on wgmma_v1 at M 2..8: no more k-slices than the layer has 64-k tiles (K = 896: 14 tiles, so 8 slices, not
    the 16 the rule's 32-k units give); other K, M = 1 / 16, int4 and gemv_mma_v1 keep the rule's split."""
    assert gemv_mma_host.int8_k_slices({"KS": 16, "RG": 1, "U": 2, "PF": 1}, 896) == {"KS": 8, "RG": 1, "U": 2, "PF": 1}
    assert gemv_mma_host.int8_k_slices({"KS": 16, "RG": 1, "U": 2}, 960)["KS"] == 8  # 15 tiles
    assert gemv_mma_host.int8_k_slices({"KS": 4, "RG": 2, "U": 2}, 192) == {"KS": 2, "RG": 4, "U": 2}  # 3 tiles
    assert gemv_mma_host.int8_k_slices({"KS": 16, "RG": 1, "U": 2}, 1024)["KS"] == 16  # 16 tiles: one a slice
    for m, ks in ((1, 16), (2, 8), (8, 8), (16, 16)):
        assert gemv_mma_host.mma_config(m, 4864, 896, 8, -1, 132,
                                        wg=1)["KS"] == ks, m
    # gemv_mma_v1's own 32-k tiles: 28 of them
    assert gemv_mma_host.mma_config(2, 4864, 896, 8, -1, 132,
                                    wg=0)["KS"] == 16
    host = gemv_mma_host
    assert host.mma_config(2, 4864, 896, 4, 128, 132)["KS"] == host.choose_mma_config(1, 4864, 14, 132, 4)["KS"]
    assert _explain(896, 4864, 2, 8, device=H100).config["KS"] == 8  # through the registry, both GPUs
    assert _explain(896, 128, 8, 8).config["KS"] == 8


@pytest.mark.usefixtures("isolated_tuning")
def test_one_wave_k_split_at_m_2_to_8():
    """KS 16 -> 8 at M 2..8 where KS 16's blocks spill into a second wave of at most half the slots (int8, N
    4224..6336)."""
    base = {"KS": 16, "RG": 1, "U": 2}
    assert gemv_mma_host.one_wave_k_split(base, 4608, 132, 1.5)["KS"] == 8  # 288 blocks: 1.09 waves -> 0.55
    assert gemv_mma_host.one_wave_k_split(base, 4096, 132, 1.5)["KS"] == 16  # 256 blocks: one wave
    assert gemv_mma_host.one_wave_k_split(base, 7168, 132, 1.5)["KS"] == 16  # 448 blocks: 1.7 waves
    assert gemv_mma_host.one_wave_k_split({**base, "RT": 2}, 4608, 132, 1.5)["RT"] == 2  # only RT 1 grids
    spill = float(load_table("h200")["gemv_one_wave_k_split"]["max_spill"])
    for m, ks in ((1, 16), (2, 8), (8, 8), (9, 16), (16, 16)):
        assert gemv_mma_host.mma_config(m, 4608, 4096, 8, -1, 132, one_wave_max_spill=spill)["KS"] == ks
    assert gemv_mma_host.mma_config(8, 4096, 4096, 8, -1, 132, one_wave_max_spill=spill)["KS"] == 16
    assert gemv_mma_host.mma_config(8, 4608, 4096, 8, -1, 132)["KS"] == 16  # off without a table's bound
    assert gemv_mma_host.mma_waves({"KS": 8, "RG": 1}, 4608, 132) == (288, pytest.approx(288 / 528))
    assert _explain(4096, 4608, 8, 8).config["KS"] == 8  # through the registry on the H200
    assert _explain(4096, 4608, 8, 8, device=H100).config["KS"] == 16  # the H100 was not measured
