"""conv2d with block-quantized kernels: Triton kernels vs the float64 reference.

CPU: the Triton kernels run under the interpreter (TRITON_INTERPRET=1, fp16/fp32, tiny shapes).
GPU (marked gpu): the same cases plus bf16, ResNet / ConvNeXt layer shapes and an end-to-end ResNet-50.
Geometries: every stride / padding / dilation / groups combination of ResNet-50 (7x7/2 stem on 3 channels,
3x3/1 and 3x3/2 with padding 1, 1x1/1 and 1x1/2 downsample), ConvNeXt (7x7 depthwise, padding 3, 4x4/4
patchify stem, 2x2/2 downsample) and the seeds' example (generic stride, padding, dilation), plus grouped
convolution, on odd spatial sizes.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import mixgemm
from conv_cases import assert_conv_matches, make_conv_case
from mixgemm import quantize_conv_weight, reference
from mixgemm.epilogue import clamp_bounds
from mixgemm.nn.conv import QuantConv2d, swap_conv2d
from mixgemm.ops.conv import conv2d, cuda_conv2d
from repo_paths import ROOT

pytestmark = pytest.mark.slow(seconds=36)

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"


def _check(x, qw, bias, stride, padding, dilation, groups, act, rel_err, config=None, path=None):
    x_before = x.clone()
    lo, hi = clamp_bounds(act)
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)
    y = cuda_conv2d(x, qw, bias, pair(stride), pair(padding), pair(dilation), groups, lo, hi, act, config, path)
    ref = reference.conv2d(
        x.cpu(), qw.to("cpu"), None if bias is None else bias.cpu(), stride, padding, dilation, groups, act
    )
    assert_conv_matches(y, ref, x, x_before, rel_err)
    return y


# (b, ci, h, w, co, k, stride, padding, dilation, groups): the geometries of ResNet / ConvNeXt / the seed
GEOMS = {
    "resnet_3x3_s1": (2, 32, 7, 9, 24, 3, 1, 1, 1, 1),
    "resnet_3x3_s2": (1, 32, 9, 7, 40, 3, 2, 1, 1, 1),
    "resnet_1x1_s1": (2, 64, 5, 3, 48, 1, 1, 0, 1, 1),
    "resnet_1x1_s2_down": (1, 64, 7, 5, 32, 1, 2, 0, 1, 1),
    "resnet_stem_7x7_s2": (1, 3, 13, 11, 16, 7, 2, 3, 1, 1),
    "convnext_dw7x7": (2, 24, 9, 7, 24, 7, 1, 3, 1, 24),
    "convnext_stem_4x4_s4": (1, 3, 13, 9, 24, 4, 4, 0, 1, 1),
    "convnext_down_2x2_s2": (1, 32, 7, 9, 48, 2, 2, 0, 1, 1),
    "seed_s2_p2_d2": (1, 32, 11, 10, 20, 3, 2, 2, 2, 1),
    "grouped_g2_asym": (1, 64, 6, 9, 32, (3, 5), (1, 2), (2, 1), (1, 2), 2),
    "dw_mult2_s2": (1, 16, 9, 8, 32, 3, 2, 1, 1, 16),
}


@pytest.mark.parametrize("name", sorted(GEOMS))
@pytest.mark.parametrize("channels_last", [False, True])
def test_geometries(name, channels_last, rel_err):
    b, ci, h, w, co, k, s, p, d, g = GEOMS[name]
    ci_g = ci // g
    kk = k * k if isinstance(k, int) else k[0] * k[1]
    bits = 4 if (kk * ci_g) % 2 == 0 else 8
    gs = 32 if ci_g % 32 == 0 else -1
    x, qw, bias = make_conv_case(b, ci, h, w, co, k, g, torch.float16, channels_last, bits, gs, "sym", seed=len(name))
    kernels = ("dw",) if ci_g == 1 and g > 1 else ("igemm", "smallk") if ci_g <= 8 and g == 1 else ("igemm",)
    for path in (*kernels, "dequant", None):  # the Triton kernels, dequantize + cuDNN, and what dispatch picks
        _check(x, qw, bias, s, p, d, g, "relu" if channels_last else None, rel_err, path=path)


@pytest.mark.parametrize("mode", ["sym", "zero_point"])
def test_one_by_one_conv_as_matmul(mode, rel_err):
    """Path "matmul" (the conv_as_matmul entry): the 1x1 conv as mixgemm.matmul on its [B*H*W, Ci] view, the GEMM
    mixgemm.ops.conv hands to the kernels layer (kernels.conv_as_matmul.use_gemm)."""
    x, qw, bias = make_conv_case(2, 64, 5, 3, 48, 1, 1, torch.float16, True, 4, 32, mode, seed=7)
    _check(x, qw, bias, 1, 0, 1, 1, "relu", rel_err, path="matmul")


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("gs", [32, 64, 128, 256, -1])
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
def test_formats(bits, gs, mode, rel_err):
    # Ci = 256 so every group size divides it; odd spatial size, stride 2, padding 1
    x, qw, bias = make_conv_case(1, 256, 5, 3, 24, 3, 1, torch.float16, True, bits, gs, mode, seed=bits + gs)
    for path in ("igemm", "dequant"):
        _check(x, qw, bias, 2, 1, 1, 1, "relu6", rel_err, path=path)


@pytest.mark.parametrize("dtype", [torch.float32] + ([torch.bfloat16] if GPU else []))
@pytest.mark.parametrize("channels_last", [False, True])
def test_dtypes(dtype, channels_last, rel_err):
    x, qw, bias = make_conv_case(2, 64, 7, 5, 24, 3, 1, dtype, channels_last, 4, 64, "zero_point", seed=3)
    _check(x, qw, bias, 1, 1, 1, 1, None, rel_err)
    x, qw, bias = make_conv_case(1, 16, 7, 5, 16, 3, 16, dtype, channels_last, 8, -1, "offset", seed=4)
    _check(x, qw, bias, 1, 1, 1, 16, "relu", rel_err)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
@pytest.mark.parametrize("gs,ci", [(32, 64), (64, 64), (32, 96), (-1, 64), (-1, 3)])
def test_dequantize_matrix(bits, mode, gs, ci):
    """The dequantize + cuDNN path's weights equal the format's dequantization (rounded once): groups within a tile
    (g32), a tile per group (g64), a last tile of one group (Ci 96: K = 864), per channel (one group a row) with K a
    multiple of the tile and not (the 3-channel stem: K = 27)."""
    from mixgemm.formats.weight import dequantize_weight
    from mixgemm.kernels.dequant_cudnn.dequant import dequantize_matrix

    g = torch.Generator().manual_seed(11)
    qw = quantize_conv_weight(torch.randn(40, ci, 3, 3, generator=g) * 0.02, bits=bits, group_size=gs, mode=mode)
    for dtype in (torch.float16, torch.float32):
        got = dequantize_matrix(qw.matrix.to(DEV), dtype).cpu()
        want = dequantize_weight(qw.matrix, dtype)
        if mode == "offset":
            # q * s + m in the compute dtype: two roundings of values up to qmax * s (vs one of the exact value)
            eps = 2.0**-10 if dtype == torch.float16 else 2.0**-23
            bound = eps * float(qw.matrix.scales.float().max()) * qw.matrix.config.qmax
            assert float((got.double() - want.double()).abs().max()) <= bound
        else:  # (q - z) is exact, one rounding of (q - z) * s
            assert torch.equal(got, want)


def test_split_k_and_tiles(rel_err):
    from mixgemm.kernels.triton_conv_igemm.igemm import ConvConfig

    x, qw, bias = make_conv_case(1, 64, 5, 3, 40, 3, 1, torch.float16, True, 4, 32, "sym", seed=5)
    for cfg in (
        ConvConfig(16, 32, 32, split_k=3),
        ConvConfig(32, 16, 16, split_k=5),
        ConvConfig(16, 64, 32),
        ConvConfig(32, 16, 32, swap_ab=True),
        ConvConfig(16, 32, 16, split_k=2, swap_ab=True),
    ):
        _check(x, qw, bias, 1, 1, 1, 1, "relu", rel_err, config=cfg)
    with pytest.raises(ValueError, match="block_k"):  # a K tile that straddles two quantization groups
        _check(x, qw, bias, 1, 1, 1, 1, "relu", rel_err, config=ConvConfig(16, 64, 64))
    # splits that start inside a tap and inside a quantization group (Ci = 128, group 64, BK 32: 36 steps, 9 per
    # split -> starts at steps 9 / 18 / 27): the kernel's loop-carried (kh, kw, channel, group) counters
    x, qw, bias = make_conv_case(1, 128, 5, 4, 24, 3, 1, torch.float16, True, 4, 64, "zero_point", seed=9)
    for cfg in (ConvConfig(16, 32, 32, split_k=4), ConvConfig(16, 32, 32, split_k=4, swap_ab=True)):
        _check(x, qw, bias, 1, 1, 1, 1, None, rel_err, config=cfg)
    # flat K loop (per-channel, Ci_g not a multiple of the K tile) with split-K
    x, qw, bias = make_conv_case(1, 24, 6, 5, 16, 3, 1, torch.float16, False, 8, -1, "sym", seed=6)
    _check(x, qw, bias, 1, 1, 1, 1, None, rel_err, config=ConvConfig(16, 16, 32, split_k=2))


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("bits,mode", [(8, "sym"), (4, "zero_point"), (4, "offset"), (8, "offset")])
def test_smallk_tiles_and_formats(channels_last, bits, mode, rel_err):
    """The small-K stem kernel: tiles smaller than Co and than the output (several N programs, a persistent loop of
    several output tiles per program, a partial last tile), every zero mode, dilation, and the runs of both layouts."""
    from mixgemm.kernels.triton_conv_smallk.conv_smallk import SmallKConfig

    x, qw, bias = make_conv_case(2, 3, 15, 13, 40, 7, 1, torch.float16, channels_last, bits, -1, mode, seed=bits)
    for cfg in (SmallKConfig(16, 16, 4, 1, 1), SmallKConfig(32, 32, 4, 2, 1), SmallKConfig(64, 64, 4, 2, 2)):
        _check(x, qw, bias, 2, 3, 1, 1, "relu6", rel_err, config=cfg)
    x, qw, bias = make_conv_case(1, 4, 11, 9, 24, (3, 5), 1, torch.float16, channels_last, bits, -1, mode, seed=5)
    _check(x, qw, bias, (1, 2), (2, 1), (2, 1), 1, None, rel_err, path="smallk")


@pytest.mark.parametrize("dtype", [torch.float32] + ([torch.bfloat16] if GPU else []))
def test_smallk_dtypes(dtype, rel_err):
    x, qw, bias = make_conv_case(1, 3, 12, 10, 16, 4, 1, dtype, True, 8, -1, "sym", seed=12)
    _check(x, qw, bias, 4, 0, 1, 1, "relu", rel_err, path="smallk")
    x, qw, bias = make_conv_case(1, 2, 9, 11, 16, 3, 1, dtype, False, 4, -1, "zero_point", seed=13)
    _check(x, qw, bias, 1, 1, 1, 1, None, rel_err, path="smallk")


def test_smallk_refuses_large_k():
    x, qw, bias = make_conv_case(1, 32, 5, 5, 16, 3, 1, torch.float16, True, 8, 32, "sym", seed=14)
    with pytest.raises(ValueError, match="smallk"):  # K = 288 > 256
        cuda_conv2d(x, qw, bias, (1, 1), (1, 1), (1, 1), 1, float("-inf"), float("inf"), path="smallk")


def test_no_bias_and_public_op(rel_err):
    x, qw, _ = make_conv_case(1, 32, 5, 7, 16, 3, 1, torch.float16, False, 8, 32, "sym", seed=7, bias=False)
    _check(x, qw, None, 1, 1, 1, 1, None, rel_err)
    y = conv2d(x, qw, None, 1, 1)  # public op (reference on the CPU, kernels on CUDA)
    assert y.shape == (1, 16, 5, 7)


def test_errors():
    x, qw, bias = make_conv_case(1, 32, 5, 5, 16, 3, 1, torch.float16, False, 8, 32, "sym", seed=8)
    with pytest.raises(ValueError, match="channels"):
        conv2d(x[:, :16], qw)
    with pytest.raises(TypeError, match="dtype"):
        conv2d(x.to(torch.int32), qw)
    with pytest.raises(ValueError, match="bias"):
        conv2d(x, qw, bias[:3])
    with pytest.raises(ValueError, match="too small"):
        conv2d(x[:, :, :1, :1], qw)
    with pytest.raises(TypeError, match="stride"):
        conv2d(x, qw, stride=1.5)
    with pytest.raises(ValueError, match="group_size"):
        quantize_conv_weight(torch.randn(8, 48, 3, 3), bits=8, group_size=32)


def test_quantconv2d_module(rel_err):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(64, 32, 3, stride=2, padding=1, bias=True).to(DEV)
    with pytest.warns(UserWarning, match="group_size"):
        q = QuantConv2d.from_conv(conv, bits=4, group_size=128)  # 128 does not divide 64 -> 64
    assert q.qconfig.group_size == 64
    x = torch.randn(2, 64, 7, 5, device=DEV).half().to(memory_format=torch.channels_last)
    ref = reference.conv2d(x.cpu(), q.quantized_weight().to("cpu"), conv.bias.detach().cpu(), 2, 1)
    y = q(x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    if GPU:
        assert rel_err(y.cpu(), ref) <= 2e-3
    # quantization error itself is small against the float conv
    yf = torch.nn.functional.conv2d(x.float(), conv.weight, conv.bias, 2, 1)
    assert rel_err(y.float().cpu(), yf.cpu()) < 0.1
    # state dict round trip, and a checkpoint of another format is refused
    q2 = QuantConv2d(64, 32, 3, 2, 1, bits=4, group_size=64).to(DEV)
    q2.load_state_dict(q.state_dict())
    assert torch.equal(q2(x), y)
    q3 = QuantConv2d(64, 32, 3, 2, 1, bits=8, group_size=64).to(DEV)
    with pytest.raises((ValueError, RuntimeError)):
        q3.load_state_dict(q.state_dict())
    # depthwise: the group shrinks to per-channel (warned; strict refuses), an odd K stays 4-bit
    dw = torch.nn.Conv2d(16, 16, 7, padding=3, groups=16)
    with pytest.warns(UserWarning, match="group_size=-1"):
        qd = QuantConv2d.from_conv(dw, bits=4, group_size=128)
    assert qd.qconfig.bits == 4 and qd.qconfig.group_size == -1 and qd.qweight.shape == (16, 25)
    with pytest.raises(ValueError, match="does not divide"):
        QuantConv2d.from_conv(dw, bits=4, group_size=128, strict=True)
    with pytest.raises(ValueError, match="padding_mode"):
        QuantConv2d(4, 4, 3, padding_mode="reflect")


def test_swap_conv2d_small_net(rel_err):
    torch.manual_seed(1)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, 2, 1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, 1, 1, groups=32),
        torch.nn.Conv2d(32, 64, 1),
        torch.nn.ReLU6(),
    ).eval()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        swap_conv2d(net, bits=8, group_size=32)
    assert sum(isinstance(m, QuantConv2d) for m in net.modules()) == 3
    x = torch.randn(1, 3, 9, 11)
    with torch.no_grad():
        y = net(x)
    ref = x.double()
    for m in net:
        if isinstance(m, QuantConv2d):
            ref = torch.nn.functional.conv2d(
                ref,
                m.dequantized_weight(torch.float64),
                m.bias.double(),
                m.stride,
                m.padding,
                m.dilation,
                m.groups,
            )
        else:
            ref = m(ref)
    assert rel_err(y, ref) < 1e-5


# ------------------------------------------------------------------------------------------- GPU only
RESNET_LAYERS = [  # (ci, co, k, stride, hw): ResNet-50 3x3 convs, downsample, stem; ConvNeXt dw
    (64, 64, 3, 1, 56),
    (128, 128, 3, 2, 56),
    (256, 256, 3, 1, 14),
    (512, 512, 3, 1, 7),
    (1024, 2048, 1, 2, 14),
    (256, 64, 1, 1, 56),
    (3, 64, 7, 2, 57),
]


@pytest.mark.gpu
@pytest.mark.parametrize("layer", RESNET_LAYERS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("batch", [1, 3])
def test_gpu_layers(layer, dtype, bits, batch, rel_err):
    ci, co, k, s, hw = layer
    gs = 128 if ci % 128 == 0 else -1
    bits = bits if (k * k * ci) % 2 == 0 else 8
    x, qw, bias = make_conv_case(batch, ci, hw, hw, co, k, 1, dtype, True, bits, gs, "sym", seed=ci + co)
    for path in ("igemm", None):  # the implicit-GEMM kernel, and what dispatch picks (dequant + cuDNN, matmul)
        _check(x, qw, bias, s, k // 2, 1, 1, "relu", rel_err, path=path)


@pytest.mark.gpu
@pytest.mark.parametrize("c,hw", [(96, 56), (384, 15)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_convnext_dw(c, hw, dtype, rel_err):
    x, qw, bias = make_conv_case(2, c, hw, hw, c, 7, c, dtype, True, 8, -1, "sym", seed=c)
    _check(x, qw, bias, 1, 3, 1, c, None, rel_err)


def _no_race():
    """The quantized kernels' choice alone: the dequantize + cuDNN route is raced against it on the GPU (timing: on
    these small problems either may win), so a test of which quantized kernel runs leaves it out."""
    return mixgemm.kernel_options(disable={"dequant_cudnn"})


# depthwise geometries of the CUDA kernel (b, c, h, w, k, stride, padding, dilation): ConvNeXt's 7x7, a strided 3x3
# (MobileNet), a dilated 5x5, an asymmetric kernel / stride / padding / dilation, few channels (2-channel blocks) and a
# row wider than any window (runs that end inside a row)
DW_CUDA_GEOMS = {
    "convnext_7x7": (2, 24, 9, 7, 7, 1, 3, 1),
    "mobilenet_3x3_s2": (1, 32, 9, 8, 3, 2, 1, 1),
    "dilated_5x5_d2": (1, 16, 11, 10, 5, 1, 4, 2),
    "asym_3x4_s21_p12_d12": (1, 18, 8, 9, (3, 4), (2, 1), (1, 2), (1, 2)),
    "six_channels": (3, 6, 5, 13, 3, 1, 1, 1),
    "wide_row": (1, 96, 5, 37, 7, 1, 3, 1),
    "patch_4x4": (1, 32, 10, 11, 4, 1, 2, 1),
    "down_2x2_s2": (2, 16, 9, 9, 2, 2, 0, 1),
}
_DW_FORMATS = [(8, "sym"), (8, "zero_point"), (8, "offset"), (4, "sym"), (4, "zero_point"), (4, "offset")]


# every geometry in every format (int4 with an odd number of taps: each row's last byte holds one padding nibble)
DW_CUDA_CASES = [(name, bits, mode) for name in sorted(DW_CUDA_GEOMS) for bits, mode in _DW_FORMATS]


@pytest.mark.gpu
@pytest.mark.parametrize("name,bits,mode", DW_CUDA_CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_dw_cuda(name, dtype, bits, mode, rel_err):
    from mixgemm.ops.conv import pick_path

    b, c, h, w, k, s, p, d = DW_CUDA_GEOMS[name]
    x, qw, bias = make_conv_case(b, c, h, w, c, k, c, dtype, True, bits, -1, mode, seed=c + bits)
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)
    with _no_race():
        assert pick_path(x, qw, 0, pair(s), pair(p), c, pair(d)) == "dw_cuda"
    for act, with_bias in ((None, True), ("relu6", False)):
        _check(x, qw, bias if with_bias else None, s, p, d, c, act, rel_err, path="dw_cuda")


@pytest.mark.gpu
def test_gpu_dw_cuda_configs_and_fallbacks(rel_err):
    from mixgemm.kernels.cuda_dwconv.dwconv import DwCudaConfig
    from mixgemm.ops.conv import pick_path

    x, qw, bias = make_conv_case(2, 48, 7, 23, 48, 7, 48, torch.float16, True, 8, -1, "zero_point", seed=7)
    for cfg in (DwCudaConfig(1, 2), DwCudaConfig(3, 16), DwCudaConfig(16, 64), DwCudaConfig(32, 32)):
        _check(x, qw, bias, 1, 3, 1, 48, "relu", rel_err, config=cfg)
    with pytest.raises(ValueError, match="cb="):
        _check(x, qw, bias, 1, 3, 1, 48, None, rel_err, config=DwCudaConfig(4, 6))
    # NCHW input, fp32, odd channel counts and channel multipliers stay on the Triton kernel
    xn = x.contiguous()
    with _no_race():
        assert pick_path(xn, qw, 0, (1, 1), (3, 3), 48) == "dw"
        assert pick_path(x.float(), qw, 0, (1, 1), (3, 3), 48) == "dw"
    with pytest.raises(ValueError, match="dw_cuda"):
        _check(xn, qw, bias, 1, 3, 1, 48, None, rel_err, path="dw_cuda")
    _check(xn, qw, bias, 1, 3, 1, 48, None, rel_err)
    x3, qw3, b3 = make_conv_case(1, 5, 6, 7, 5, 3, 5, torch.float16, True, 8, -1, "sym", seed=8)
    with _no_race():
        assert pick_path(x3, qw3, 0, (1, 1), (1, 1), 5) == "dw"
    _check(x3, qw3, b3, 1, 1, 1, 5, None, rel_err)
    # a sliced channels_last view is not channels_last-contiguous (its output would be NCHW): the Triton kernel
    with _no_race():
        assert pick_path(x[:, :, 1:6, 2:21], qw, 0, (1, 1), (3, 3), 48) == "dw"


def nvrtc_ok() -> bool:
    from mixgemm.kernels.cuda.nvrtc import nvrtc_available

    return nvrtc_available()


@pytest.mark.skipif(not nvrtc_ok(), reason="needs cuda-bindings + nvidia-cuda-nvrtc")
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_dw_cuda_compiles(arch):
    """The CUDA depthwise kernel compiles for the geometries the GPU tests and ConvNeXt use (CPU-side check)."""
    from mixgemm.kernels.cuda import nvrtc
    from mixgemm.kernels.cuda_dwconv.dwconv import SOURCE

    for kh, kw, sw, dw, tw, cb, act, bits, aff in ((7, 7, 1, 1, 16, 32, 0, 8, 0), (7, 7, 1, 1, 4, 64, 1, 4, 1),
                                                    (3, 3, 2, 1, 8, 16, 0, 4, 0), (3, 5, 1, 2, 3, 2, 1, 8, 1)):
        defs = dict(DW_KH=kh, DW_KW=kw, DW_SW=sw, DW_DW=dw, DW_TW=tw, DW_CB=cb, DW_ACT=act, DW_BITS=bits,
                    DW_AFFINE=aff)
        cubin = nvrtc.compile_cubin(SOURCE, tuple(sorted(defs.items())), arch)
        assert cubin[:4] == b"\x7fELF", defs


def _load_bench():
    path = ROOT / "tools" / "bench" / "conv.py"
    spec = importlib.util.spec_from_file_location("tools_bench_conv", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 8])
def test_gpu_resnet50_end_to_end(bits, rel_err):
    res = _load_bench().resnet50_check(bits=bits, batch=2)
    assert res["rel_err"] <= 1e-2, res


def test_conv_plan_is_made_once_per_input_signature(monkeypatch):
    """An eager conv walks the registry once per layer and input signature (shape, strides, alignment, dtype,
    geometry) and keeps the choice on the weight; another signature, or a kernel_options block, chooses afresh."""
    import mixgemm
    from mixgemm.ops import conv as conv_ops

    calls = []
    real = conv_ops.conv_choice
    monkeypatch.setattr(conv_ops, "conv_choice", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    g = torch.Generator().manual_seed(3)
    qw = quantize_conv_weight(torch.randn(16, 32, 3, 3, generator=g), bits=4, group_size=32, mode="sym")
    x = torch.randn(2, 32, 10, 10, generator=g)
    first = conv_ops.planned_conv_choice(x, qw, 2 * 8 * 8, (1, 1), (0, 0), 1, (1, 1))
    again = conv_ops.planned_conv_choice(x.clone(), qw, 2 * 8 * 8, (1, 1), (0, 0), 1, (1, 1))
    assert again is first and len(calls) == 1
    conv_ops.planned_conv_choice(x[:1], qw, 8 * 8, (1, 1), (0, 0), 1, (1, 1))  # another batch
    conv_ops.planned_conv_choice(x, qw, 2 * 4 * 4, (2, 2), (0, 0), 1, (1, 1))  # another stride
    conv_ops.planned_conv_choice(x.contiguous(memory_format=torch.channels_last), qw, 128, (1, 1), (0, 0), 1, (1, 1))
    assert len(calls) == 4
    with mixgemm.kernel_options(disable={"cuda_dwconv"}):
        conv_ops.planned_conv_choice(x, qw, 2 * 8 * 8, (1, 1), (0, 0), 1, (1, 1))
    assert len(calls) == 5


def test_eager_and_compiled_calls_share_one_weight_object():
    """QuantConv2d's eager path and its custom op (what torch.compile calls) find the same QuantizedWeight, so the
    kernel layouts and call plans are built once, not again by the op inside a CUDA-graph warm-up."""
    from mixgemm.ops.custom_ops import weight_from_tensors

    m = QuantConv2d.from_conv(torch.nn.Conv2d(64, 32, 3, padding=1), bits=4, group_size=32, mode="zero_point")
    c, b = m.qconfig, m._buffers
    qm = weight_from_tensors(b["qweight"], b["scales"], b["zeros"], None, c.bits, c.group_size, c.mode, 32, 9 * 64)
    assert m.quantized_weight().matrix is qm
    assert m.quantized_weight() is m.quantized_weight()
