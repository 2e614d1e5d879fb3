"""INT8-activation conv (mixgemm.ops.conv.conv2d_a8, kernels/triton/conv_int8.py) vs its float64 reference.

The reference quantizes the activations with mixgemm.formats.activation.quantize_activation on the channels_last
[B*H*W, Ci] view and convolves the dequantized values with the dequantized weights in float64; the kernel must
match it to output-dtype accuracy (act_quant's codes equal the reference's bit for bit). CPU: Triton interpreter.
"""

from __future__ import annotations

import pytest
import torch

from conv_cases import assert_conv_matches, make_conv_case
from mixgemm import quantize_conv_weight
from mixgemm.epilogue import clamp_bounds
from mixgemm.ops.conv import conv2d_a8, conv2d_a8_reference, cuda_conv2d_a8

pytestmark = pytest.mark.slow(seconds=19)

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"


def _check(x, qw, bias, stride, padding, dilation, groups, act, act_block, act_mode, rel_err, config=None):
    x_before = x.clone()
    lo, hi = clamp_bounds(act)
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)
    ab = act_block if act_block is not None else min(qw.in_channels_per_group, qw.matrix.group_size)
    y = cuda_conv2d_a8(x, qw, bias, pair(stride), pair(padding), pair(dilation), groups, lo, hi, ab, act_mode, config)
    ref = conv2d_a8_reference(
        x.cpu(), qw.to("cpu"), None if bias is None else bias.cpu(), pair(stride), pair(padding), pair(dilation),
        groups, act, ab, act_mode,
    )
    assert_conv_matches(y, ref, x, x_before, rel_err)
    return y


# (b, ci, h, w, co, k, stride, padding, dilation, groups)
GEOMS = {
    "3x3_s1": (2, 64, 5, 7, 24, 3, 1, 1, 1, 1),
    "3x3_s2": (1, 64, 7, 6, 40, 3, 2, 1, 1, 1),
    "1x1": (2, 64, 3, 5, 48, 1, 1, 0, 1, 1),
    "1x1_s2": (1, 64, 7, 5, 32, 1, 2, 0, 1, 1),
    "dil2_asym_kernel": (1, 32, 9, 8, 20, (3, 5), (2, 1), (2, 1), (2, 2), 1),
    "grouped_g2": (1, 128, 6, 5, 32, 3, 1, 1, 1, 2),
}


@pytest.mark.parametrize("name", sorted(GEOMS))
@pytest.mark.parametrize("act_mode", ["sym", "asym"])
def test_geometries(name, act_mode, rel_err):
    b, ci, h, w, co, k, s, p, d, g = GEOMS[name]
    x, qw, bias = make_conv_case(b, ci, h, w, co, k, g, torch.float16, name != "1x1", 4, 32, "sym", seed=len(name))
    _check(x, qw, bias, s, p, d, g, "relu", None, act_mode, rel_err)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("gs,act_block", [(32, None), (64, 32), (-1, None), (-1, 64), (128, 64)])
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
def test_formats(bits, gs, act_block, mode, rel_err):
    x, qw, bias = make_conv_case(1, 128, 5, 3, 24, 3, 1, torch.float16, True, bits, gs, mode, seed=bits + gs)
    _check(x, qw, bias, 2, 1, 1, 1, "relu6", act_block, "asym" if mode == "offset" else "sym", rel_err)


def test_fp32_and_tiles(rel_err):
    from mixgemm.kernels.triton.conv_int8 import ConvA8Config

    x, qw, bias = make_conv_case(2, 64, 5, 4, 40, 3, 1, torch.float32, False, 8, -1, "zero_point", seed=3)
    _check(x, qw, None, 1, 1, 1, 1, None, 32, "asym", rel_err)
    x, qw, bias = make_conv_case(1, 64, 6, 5, 40, 3, 1, torch.float16, True, 4, 64, "sym", seed=4)
    for cfg in (ConvA8Config(16, 16, 32), ConvA8Config(32, 64, 64), ConvA8Config(64, 32, 32, 4, 2)):
        _check(x, qw, bias, 1, 1, 1, 1, "relu", None, "sym", rel_err, config=cfg)


def test_reference_close_to_float_conv(rel_err):
    """The quantized activations + weights stay close to the float convolution (a sanity bound, not the oracle)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 64, 6, 6, generator=g)
    w = torch.randn(32, 64, 3, 3, generator=g) * 0.02
    qw = quantize_conv_weight(w, bits=8, group_size=-1)
    y = conv2d_a8(x, qw, None, 1, 1)  # CPU: the reference path
    yf = torch.nn.functional.conv2d(x.double(), w.double(), None, 1, 1)
    assert rel_err(y, yf) < 0.02


def test_errors():
    x, qw, _ = make_conv_case(1, 64, 5, 5, 16, 3, 1, torch.float16, True, 8, 32, "sym", seed=8)
    with pytest.raises(ValueError, match="act_block_size"):
        conv2d_a8(x, qw, act_block_size=48)
    with pytest.raises(ValueError, match="act_mode"):
        conv2d_a8(x, qw, act_mode="int4")
    dw = quantize_conv_weight(torch.randn(16, 1, 3, 3), bits=8, group_size=-1)
    with pytest.raises(ValueError, match="depthwise"):
        conv2d_a8(torch.randn(1, 16, 5, 5, device=DEV), dw.to(DEV), groups=16)
    # a 16-channel constant-scale run is below the int8 tensor-core K step
    with pytest.raises(ValueError, match="multiple of 32"):
        lo, hi = clamp_bounds(None)
        cuda_conv2d_a8(x, qw, None, (1, 1), (1, 1), (1, 1), 1, lo, hi, 16, "sym")


# ------------------------------------------------------------------------------------------- GPU only
@pytest.mark.gpu
@pytest.mark.parametrize(
    "layer", [(64, 64, 3, 1, 56), (256, 256, 3, 2, 28), (512, 512, 3, 1, 7), (1024, 256, 1, 1, 14)]
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bits,gs", [(8, -1), (4, 64)])
@pytest.mark.parametrize("batch", [1, 4])
def test_gpu_layers(layer, dtype, bits, gs, batch, rel_err):
    ci, co, k, s, hw = layer
    x, qw, bias = make_conv_case(batch, ci, hw, hw, co, k, 1, dtype, True, bits, gs, "sym", seed=ci + co)
    _check(x, qw, bias, s, k // 2, 1, 1, "relu", None, "sym", rel_err)
