"""Implicit-GEMM convolution on the Hopper wgmma kernel (kernels/cuda_conv_wgmma/conv_wgmma.py, gemm_wgmma.cu WG_CONV).

CPU: which convolutions the path takes (conv_wgmma_supported), its default tiles, its errors; the NVRTC compile
checks of the WG_CONV builds are in test_gemm_wgmma.py. GPU (sm_90, marked gpu): every format (int4 / int8, every
group size, sym / zero_point / offset), fp16 / bf16, the ResNet geometries (1x1, 1x1/2, 3x3, 3x3/2, 7x7 with padding
3) plus dilation, asymmetric stride / padding and odd spatial sizes, M tails, every tile kind (BM, NWG, stream-K,
split-K, multi-tile stages with FOLD) -- against the float64 reference on the same quantized weights.
"""

from __future__ import annotations

import pytest
import torch

from conv_cases import assert_conv_matches, make_conv_case
from mixgemm import quantize_conv_weight, reference
from mixgemm.epilogue import clamp_bounds
from mixgemm.kernels.cuda_conv_wgmma.conv_wgmma import conv_wgmma, conv_wgmma_supported, default_conv_config
from mixgemm.ops.conv import cuda_conv2d

GPU_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_sm90 = pytest.mark.skipif(not GPU_SM90, reason="needs an sm_90 GPU")


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _check(x, qw, bias, stride, padding, dilation, act, rel_err, config=None, path="wgmma"):
    x_before = x.clone()
    lo, hi = clamp_bounds(act)
    y = cuda_conv2d(x, qw, bias, _pair(stride), _pair(padding), _pair(dilation), 1, lo, hi, act, config, path)
    ref = reference.conv2d(x.cpu(), qw.to("cpu"), None if bias is None else bias.cpu(), stride, padding, dilation, 1,
                           act)
    assert_conv_matches(y, ref, x, x_before, rel_err)
    return y


# ------------------------------------------------------------------------------------------------ CPU


def test_supported_needs_channels_last_ci64_groups1_cuda():
    g = torch.Generator().manual_seed(0)
    qw = quantize_conv_weight(torch.randn(32, 64, 3, 3, generator=g) * 0.02, bits=4, group_size=64)
    x = torch.randn(1, 64, 5, 5, generator=g).half().contiguous(memory_format=torch.channels_last)
    one = (1, 1)
    assert not conv_wgmma_supported(x, qw, one, one, one, 1)  # a CPU tensor
    if GPU_SM90:
        xc = x.cuda()
        qc = qw.to("cuda")
        assert conv_wgmma_supported(xc, qc, one, one, one, 1)
        assert not conv_wgmma_supported(xc.contiguous(), qc, one, one, one, 1)  # NCHW
        assert not conv_wgmma_supported(xc.float(), qc, one, one, one, 1)  # fp32
        assert not conv_wgmma_supported(xc, qc, one, one, one, 2)  # grouped
        assert not conv_wgmma_supported(xc, qc, one, (200, 1), one, 1)  # padding past the im2col corner range
        assert not conv_wgmma_supported(xc, qc, (9, 1), one, one, 1)  # traversal stride > 8
        q48 = quantize_conv_weight(torch.randn(32, 48, 3, 3, generator=g) * 0.02, bits=8, group_size=-1).to("cuda")
        x48 = torch.randn(1, 48, 5, 5, device="cuda").half().contiguous(memory_format=torch.channels_last)
        assert not conv_wgmma_supported(x48, q48, one, one, one, 1)  # Ci % 64 != 0


def test_default_config():
    big = default_conv_config(100352, 64, 576)
    assert big == {"TMA": 1, "GROUP_M": 8, "BM": 128, "NWG": 1, "STAGES": 3, "MINB": 3}
    assert default_conv_config(25088, 128, 1152)["NWG"] == 2
    deep = default_conv_config(49, 512, 4608)  # batch-1 deep layer: 8 K slices of one 56-pixel tile as a cluster
    assert deep["SPLIT"] == 8 and deep["CLUSTER"] == 1 and deep["BM"] == 56 and deep["WS"] == 1
    assert "WS" not in default_conv_config(49, 512, 2048)  # one stage per slice: no producer warp
    mid = default_conv_config(784, 128, 1152)  # M > 256 with a long K: stream-K over 16-pixel tiles
    assert mid["SK"] == 1 and mid["BM"] == 16 and mid["KT"] == 4
    assert "SK" not in default_conv_config(196, 1024, 256)  # short K: one tile per CTA
    few = default_conv_config(1568, 512, 4608)  # batch-32 stage 4: 52 tiles of 128 x 128, K halves as 2-CTA clusters
    assert few["SPLIT"] == 2 and few["CLUSTER"] == 1 and few["BM"] == 128
    assert "CLUSTER" not in default_conv_config(6272, 256, 1024)  # 98 tiles: no split
    assert "CLUSTER" not in default_conv_config(1568, 512, 512)  # short K: no split


def _h200_waves():
    from mixgemm.kernels.cuda_conv_wgmma.conv_waves import _table_waves

    return _table_waves("h200")


def test_wave_model_picks_by_the_wave_count():
    """The H200 table's conv_waves: a UNet batch-1 layer (M 256, N 1280, K 11520: the small-M tile would make 800
    CTAs, six waves) takes 128 x 128 tiles split 4 ways as clusters (80 CTAs); a ResNet stage-4 batch-1 layer (M 49,
    N 512) keeps the small-M tile; outside the model's range (M > 1024, K < 1024) the rules decide as before."""
    waves = _h200_waves()
    unet = default_conv_config(256, 1280, 11520, 132, waves)
    assert (unet["BM"], unet["NWG"], unet["SPLIT"], unet["CLUSTER"]) == (128, 2, 4, 1)
    old = default_conv_config(256, 1280, 11520)  # without a model (another GPU's table): the small-M tile
    assert (old["BM"], old["NWG"], old["SPLIT"]) == (56, 1, 8)
    assert default_conv_config(49, 512, 4608, 132, waves) == default_conv_config(49, 512, 4608)
    assert default_conv_config(1568, 512, 4608, 132, waves) == default_conv_config(1568, 512, 4608)
    assert default_conv_config(196, 1024, 256, 132, waves) == default_conv_config(196, 1024, 256)


def test_wave_model_tiles_are_legal():
    """Every tile the model may pick is one the launcher accepts, with at least two k-tiles a slice and at most
    MAX_WAVES waves of CTAs; an estimate grows with the waves."""
    from mixgemm.kernels.cuda_conv_wgmma import conv_waves as CW
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import tile_error

    for m, n, k in ((1, 160, 3840), (49, 2048, 1024), (256, 1280, 23040), (784, 256, 2304), (1024, 64, 1152)):
        cands = CW.candidates(m, n, k, 132)
        assert cands
        for c in cands:
            assert tile_error({"TMA": 1, "GROUP_M": 8, **c}) is None, c
            ctas = -(-m // c["BM"]) * -(-n // (64 * c["NWG"])) * c.get("SPLIT", 1)
            assert CW.MIN_CTAS <= ctas <= CW.MAX_WAVES * 132 and -(-k // 64) >= 2 * c.get("SPLIT", 1)
    waves = _h200_waves()
    tile = {"BM": 128, "NWG": 2, "KT": 2}
    assert waves.estimate_us(128, 128 * 132, 4096, tile, 132) < waves.estimate_us(128, 128 * 133, 4096, tile, 132)


def test_wave_model_section_errors():
    from mixgemm.kernels.cuda_conv_wgmma.conv_waves import ConvWaves

    good = {"launch_us": 1, "k_tile_floor_us": 0.2, "macs_per_us": 4e6, "stage_us": 0.2, "reduce_us": 0.004,
            "max_m": 1024, "min_k": 1024, "source": "a sweep"}
    assert ConvWaves.parse(good, "t").max_m == 1024
    with pytest.raises(ValueError, match="source"):
        ConvWaves.parse({k: v for k, v in good.items() if k != "source"}, "t.json conv_waves")
    with pytest.raises(ValueError, match="needs launch_us"):
        ConvWaves.parse({k: v for k, v in good.items() if k != "stage_us"}, "t.json conv_waves")
    with pytest.raises(ValueError, match=">= 0"):
        ConvWaves.parse({**good, "macs_per_us": 0}, "t.json conv_waves")


def test_pixel_strides_of_a_one_pixel_map():
    """A 1 x 1 input (a squeeze-excitation conv) reports stride 1 for its size-1 dimensions; the im2col map gets the
    packed layout's strides (TMA refuses strides that are not multiples of 16 bytes)."""
    from mixgemm.kernels.cuda_conv_wgmma.conv_wgmma import pixel_strides

    x = torch.randn(1, 3840, 1, 1).half().contiguous(memory_format=torch.channels_last)
    assert x.stride() == (3840, 1, 1, 1) and pixel_strides(x) == (3840, 3840, 3840)
    y = torch.randn(2, 64, 5, 3).contiguous(memory_format=torch.channels_last)
    assert pixel_strides(y) == (y.stride(3), y.stride(2), y.stride(0))


def test_table_entries_are_valid_wgmma_tiles():
    """Every measured entry is a tile the launcher accepts (same checks as gemm_wgmma.run, without a GPU)."""
    from mixgemm.tuning.conv_table import WGMMA_TABLES

    for table in WGMMA_TABLES.values():
        assert table
        for key, cfg in table.items():
            if cfg is None:
                continue
            assert set(cfg) <= {"BM", "NWG", "STAGES", "KT", "SK", "MINB", "INFLIGHT", "SPLIT", "FOLD", "CLUSTER",
                                "WS"}, key
            assert cfg["BM"] % 8 == 0 and 8 <= cfg["BM"] <= 256 and cfg["NWG"] in (1, 2, 4), key
            assert cfg.get("WS", 0) in (0, 1) and (not cfg.get("WS") or cfg.get("MINB", 1) == 1), key
            kt, infl = cfg.get("KT", 1), cfg.get("INFLIGHT", 1)
            assert kt in (1, 2, 4) and (kt == 1 or infl == 1) and cfg["STAGES"] >= 2 + -(-infl // kt), key


def test_unsupported_input_is_rejected_with_a_clear_error():
    g = torch.Generator().manual_seed(1)
    qw = quantize_conv_weight(torch.randn(16, 64, 1, 1, generator=g) * 0.02, bits=8, group_size=-1)
    x = torch.randn(1, 64, 4, 4, generator=g).half()
    with pytest.raises(ValueError, match="channels_last"):
        conv_wgmma(x, qw, None, (1, 1), (0, 0), (1, 1), float("-inf"), float("inf"))


# ------------------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
@pytest.mark.parametrize("bits,gs", [(4, 32), (4, 64), (4, 128), (4, 256), (4, -1), (8, 32), (8, 128), (8, -1)])
def test_formats(bits, gs, mode, dtype, rel_err):
    # Ci = 256 (every group divides it), 3x3 / stride 2 / padding 1 on an odd 9 x 7 input, batch 2, relu6
    x, qw, bias = make_conv_case(2, 256, 9, 7, 72, 3, 1, dtype, True, bits, gs, mode, seed=bits * 7 + gs)
    _check(x, qw, bias, 2, 1, 1, "relu6", rel_err)


# (b, ci, h, w, co, k, stride, padding, dilation)
GEOMS = {
    "r50_1x1": (3, 64, 7, 9, 80, 1, 1, 0, 1),
    "r50_1x1_s2_down": (2, 128, 9, 11, 48, 1, 2, 0, 1),
    "r50_3x3": (2, 64, 11, 9, 40, 3, 1, 1, 1),
    "r50_3x3_s2": (3, 128, 13, 15, 64, 3, 2, 1, 1),
    "7x7_p3": (1, 64, 12, 10, 24, 7, 1, 3, 1),
    "7x7_s2_p3": (2, 64, 17, 13, 32, 7, 2, 3, 1),
    "dilation2": (1, 64, 11, 12, 56, 3, 1, 2, 2),
    "s2_p2_d2": (2, 64, 11, 10, 20, 3, 2, 2, 2),
    "asym_k3x5_s1x2_p2x1_d1x2": (2, 64, 9, 13, 40, (3, 5), (1, 2), (2, 1), (1, 2)),
    "no_padding_3x3": (2, 128, 6, 5, 24, 3, 1, 0, 1),
    "stride4_4x4_patchify": (2, 64, 16, 12, 48, 4, 4, 0, 1),
}


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("name", sorted(GEOMS))
@pytest.mark.parametrize("bits", [4, 8])
def test_geometries(name, bits, rel_err):
    b, ci, h, w, co, k, s, p, d = GEOMS[name]
    gs = 64 if bits == 4 else -1
    x, qw, bias = make_conv_case(b, ci, h, w, co, k, 1, torch.float16, True, bits, gs, "zero_point", seed=len(name))
    _check(x, qw, bias, s, p, d, "relu", rel_err)


# configs: every tile kind; the 3x3 / 128 -> 200 conv on 2 x 17 x 13 has M = 442 (tails for every BM), N = 200 (a
# partial last 64-row warpgroup), K = 1152 = 18 k-tiles in 9 taps of 2 channel tiles
CONFIGS = [
    dict(BM=256, NWG=2, STAGES=5, INFLIGHT=2),
    dict(BM=128, NWG=2, STAGES=4),
    dict(BM=64, NWG=1, STAGES=4),
    dict(BM=8, NWG=1, STAGES=4),
    dict(BM=40, NWG=4, STAGES=3),
    dict(BM=128, NWG=2, STAGES=4, SK=1),
    dict(BM=64, NWG=1, STAGES=4, SK=1),
    dict(BM=32, NWG=2, STAGES=3, KT=4, SK=1, MINB=2),
    dict(BM=64, NWG=2, STAGES=4, SPLIT=3),
    dict(BM=32, NWG=2, STAGES=3, KT=2, SPLIT=4),
    dict(BM=64, NWG=2, STAGES=4, KT=2, FOLD=1),
    dict(BM=32, NWG=2, STAGES=3, KT=4, FOLD=1, SK=1),
    dict(BM=256, NWG=2, STAGES=5, INFLIGHT=2, SPLIT=4, CLUSTER=1),
    dict(BM=128, NWG=2, STAGES=4, SPLIT=3, CLUSTER=1),
    dict(BM=64, NWG=2, STAGES=4, KT=2, FOLD=1, SPLIT=2, CLUSTER=1),
    dict(BM=56, NWG=1, STAGES=3, KT=4, SPLIT=8, CLUSTER=1, WS=1),  # the batch-1 tile: 5 slices of 4 + 2 k-tiles
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("fmt", [(4, 64, "zero_point"), (8, -1, "sym"), (4, 128, "offset")])
def test_configs(cfg, fmt, rel_err):
    bits, gs, mode = fmt
    x, qw, bias = make_conv_case(2, 128, 17, 13, 200, 3, 1, torch.float16, True, bits, gs, mode, seed=len(cfg))
    for _ in range(2):  # twice: stream-K counters must be left at zero
        _check(x, qw, bias, 1, 1, 1, None, rel_err, config={"TMA": 1, "GROUP_M": 8, **cfg})


def _check_variant_bit_equal(x, qw, bias, stride, k, cfg, variant, rel_err):
    """The tile cfg with `variant` keys added (same sums in the same order): within tolerance of the reference and
    bit-equal to cfg alone. Padding k // 2, relu."""
    cfg = {"TMA": 1, "GROUP_M": 8, **cfg}
    y = _check(x, qw, bias, stride, k // 2, 1, "relu", rel_err, config={**cfg, **variant})
    lo, hi = clamp_bounds("relu")
    y0 = cuda_conv2d(x, qw, bias, _pair(stride), _pair(k // 2), (1, 1), 1, lo, hi, "relu", cfg, "wgmma")
    assert torch.equal(y, y0)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("layer", [(64, 256, 1, 1, 56, 8), (128, 200, 3, 2, 29, 6), (256, 64, 1, 1, 15, 16)])
@pytest.mark.parametrize("cfg", [dict(BM=128, NWG=2, STAGES=4), dict(BM=64, NWG=1, STAGES=3, MINB=2),
                                 dict(BM=128, NWG=2, STAGES=3, KT=2)], ids=str)
def test_persistent_whole_tiles(layer, cfg, rel_err):
    """SK 2 (each CTA runs every grid-th tile whole, TMA stores in flight under the next tile) on layers with many
    tiles per CTA: within tolerance of the reference and bit-equal to one CTA per tile."""
    ci, co, k, s, hw, batch = layer
    x, qw, bias = make_conv_case(batch, ci, hw, hw, co, k, 1, torch.float16, True, 4, 64, "zero_point", seed=ci + co)
    _check_variant_bit_equal(x, qw, bias, s, k, cfg, {"SK": 2}, rel_err)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("layer,cfg", [
    ((512, 512, 3, 1, 7, 32), dict(BM=104, NWG=2, STAGES=3, KT=4, SPLIT=2, CLUSTER=1)),  # im2col, cluster split-K
    ((512, 512, 3, 2, 14, 5), dict(BM=64, NWG=2, STAGES=4, KT=2)),                       # stride 2, M tail
    ((256, 1024, 1, 1, 14, 8), dict(BM=192, NWG=2, STAGES=3)),                           # BM 192, 1x1
    ((128, 200, 3, 1, 17, 3), dict(BM=128, NWG=2, STAGES=3, SK=2)),                      # persistent whole tiles
], ids=str)
def test_producer_warp(layer, cfg, rel_err):
    """WS 1 (a warp that only loads; slots released on mbarriers, no CTA barrier per stage) on the conv: within
    tolerance of the reference and bit-equal to WS 0."""
    ci, co, k, s, hw, batch = layer
    x, qw, bias = make_conv_case(batch, ci, hw, hw, co, k, 1, torch.float16, True, 4, 128 if ci >= 128 else 64,
                                 "zero_point", seed=ci + co + s)
    _check_variant_bit_equal(x, qw, bias, s, k, cfg, {"WS": 1}, rel_err)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("batch", [1, 3, 32])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layer", [(64, 64, 3, 1, 56), (128, 128, 3, 2, 28), (256, 1024, 1, 1, 14),
                                   (512, 512, 3, 1, 7), (2048, 512, 1, 1, 7), (256, 512, 1, 2, 27)])
def test_resnet_layers_default_tiles(layer, dtype, batch, rel_err):
    # batch 32 takes the table's batch-32 tiles (stage 4: split-K 2 as clusters)
    ci, co, k, s, hw = layer
    x, qw, bias = make_conv_case(batch, ci, hw, hw, co, k, 1, dtype, True, 4, 128 if ci >= 128 else 64,
                                 "zero_point", seed=ci + co + k)
    _check(x, qw, bias, s, k // 2, 1, "relu", rel_err)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("layer", [(3840, 160, 1, 1), (256, 64, 1, 2), (128, 320, 1, 3)])
def test_one_pixel_inputs(layer, rel_err):
    """1 x 1 inputs (squeeze-excitation convs; PyTorch gives their size-1 dimensions stride 1): the dispatch's pick
    and the small-M tile run them."""
    ci, co, hw, batch = layer
    x, qw, bias = make_conv_case(batch, ci, hw, hw, co, 1, 1, torch.float16, True, 4, 64, "zero_point", seed=ci)
    _check(x, qw, bias, 1, 0, 1, None, rel_err, path=None)
    _check(x, qw, bias, 1, 0, 1, None, rel_err, config={"TMA": 1, "GROUP_M": 8, "BM": 56, "NWG": 1, "STAGES": 3,
                                                         "KT": 4, "SPLIT": 8, "CLUSTER": 1, "WS": 1})


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("layer", [(1280, 1280, 3, 1, 16), (640, 1280, 3, 1, 16), (384, 768, 2, 2, 28),
                                   (256, 256, 3, 1, 28), (1024, 1024, 3, 1, 7)])
@pytest.mark.parametrize("fmt", [(4, 32, "zero_point"), (8, -1, "sym")])
def test_wave_model_tiles(layer, fmt, rel_err):
    """Batch-1 layers (M <= 1024, K >= 1024) on the tile the H200 table's wave model picks (forced: on another GPU
    too), a diffusion UNet's among them."""
    from mixgemm.kernels.conv_geometry import conv_output_size

    ci, co, k, s, hw = layer
    bits, gs, mode = fmt
    x, qw, bias = make_conv_case(1, ci, hw, hw, co, k, 1, torch.float16, True, bits, gs, mode, seed=ci + co)
    pad = (k // 2) if k % 2 else 0
    ho, wo = conv_output_size(hw, hw, (k, k), (s, s), (pad, pad), (1, 1))
    cfg = default_conv_config(ho * wo, co, ci * k * k, 132, _h200_waves())
    _check(x, qw, bias, s, pad, 1, "relu", rel_err, config=cfg)


@pytest.mark.gpu
@needs_sm90
def test_fp64_bias_and_no_bias(rel_err):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 128, 9, 8, generator=g).half().cuda().contiguous(memory_format=torch.channels_last)
    qw = quantize_conv_weight(torch.randn(40, 128, 3, 3, generator=g) * 0.02, bits=4, group_size=128).to("cuda")
    bias = torch.randn(40, generator=g, dtype=torch.float64).cuda() * 0.1
    bias0 = bias.clone()
    _check(x, qw, bias, 1, 1, 1, None, rel_err)
    assert torch.equal(bias, bias0)
    _check(x, qw, None, 1, 1, 1, "relu6", rel_err)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("cfg", [None, {"BM": 128, "NWG": 2, "STAGES": 4, "KT": 2, "SPLIT": 2, "CLUSTER": 1}],
                         ids=["default", "cluster"])
def test_pdl_dependent_chain(cfg):
    """Programmatic dependent launch: each conv reads the output of the kernel right before it (another conv or a torch
    elementwise op), eagerly and from a CUDA graph; bit-equal to the PDL-off run (kernel_options(pdl=False))."""
    from pdl_chain import assert_pdl_chain_matches  # tests/pdl_chain.py

    x0, qa, bias = make_conv_case(8, 128, 14, 14, 128, 3, 1, torch.float16, True, 4, 128, "zero_point", seed=31)
    _, qb, _ = make_conv_case(1, 128, 3, 3, 128, 1, 1, torch.float16, False, 8, -1, "sym", seed=32)

    def chain(x):
        for _ in range(3):
            x = conv_wgmma(x, qa, bias, (1, 1), (1, 1), (1, 1), 0.0, float("inf"), cfg)
            x = conv_wgmma(x, qb, None, (1, 1), (0, 0), (1, 1), -float("inf"), float("inf"), cfg)
            x = torch.tanh(x * 0.5)
        return x

    chain(x0)  # builds the layouts: the first launch after a build runs without PDL
    torch.cuda.synchronize()
    assert_pdl_chain_matches(chain, x0)
