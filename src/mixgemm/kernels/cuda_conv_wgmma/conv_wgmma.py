"""Quantized-weight convolution as an implicit GEMM on the Hopper wgmma kernel (gemm_wgmma.cu with WG_CONV).

``conv_wgmma(x, qweight, bias, stride, padding, dilation, lo, hi, config=None)``:

* x: float16 / bfloat16 [B, Ci, H, W] in channels_last memory (``x.stride(1) == 1``), Ci % 64 == 0, on an sm_90 GPU.
* qweight: QuantizedConvWeight [Co, Ci, Kh, Kw] (groups 1), int4 / int8, every group size and mode the GEMM takes
  (a group divides Ci, so it never spans two taps).
* Returns [B, Co, Ho, Wo] in x's dtype, channels_last: the GEMM's [B*Ho*Wo, Co] output viewed as NCHW.

How: the GEMM view is M = B*Ho*Wo output pixels, N = Co, K = Kh*Kw*Ci in the weight's (kh, kw, ci) order. The
weights take the GEMM's path unchanged (wgmma_v1 layout, dequantized into the A registers). The activations are read
by an im2col TMA map (cuTensorMapEncodeIm2col): per 64-k tile, one TMA instruction gathers the 64 channels of one
tap for BM consecutive output pixels into the 128-byte-swizzled B atom, with zero fill where the tap falls into the
padding. No im2col buffer, and the loader is still one thread per stage.
Limits of the im2col map (checked by ``conv_wgmma_supported``): corner offsets -pad and pad - (K - 1) * dilation in
[-128, 127] (4-D maps), stride <= 8, 16-byte aligned pixel strides.
"""

from __future__ import annotations

import math

import torch

from mixgemm.formats.conv import QuantizedConvWeight
from mixgemm.kernels.conv_geometry import conv_output_size
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda_conv_wgmma.conv_waves import ConvWaves, conv_waves_of, small_m_tile
from mixgemm.kernels.cuda_wgmma import gemm_wgmma as G

CHANNELS_PER_TILE = 64  # one 64-k tile = 64 channels of one tap = one 128-byte swizzled row per pixel
_CORNER = (-128, 127)  # im2col bounding-box corner range of a 4-D tensor map
_BASE = {"TMA": 1, "GROUP_M": 8}  # every conv tile: TMA loader (the im2col map needs it), grouped raster


def conv_wgmma_supported(x: torch.Tensor, qweight: QuantizedConvWeight, stride, padding, dilation,
                         groups: int) -> bool:
    """True when conv_wgmma runs this convolution (see the module docstring); the dispatcher asks before calling."""
    if groups != 1 or x.dtype not in G._ACT or qweight.matrix.bits not in (4, 8) or not x.is_cuda:
        return False
    if x.shape[1] % CHANNELS_PER_TILE or x.stride(1) != 1 or not x.is_contiguous(memory_format=torch.channels_last):
        return False
    if x.data_ptr() % 16 or max(stride) > 8:
        return False
    (kh, kw) = qweight.kernel_size
    for k, p, d in ((kh, padding[0], dilation[0]), (kw, padding[1], dilation[1])):
        if not (_CORNER[0] <= -p <= _CORNER[1] and _CORNER[0] <= p - (k - 1) * d <= _CORNER[1]):
            return False
    if not nvrtc.nvrtc_available():
        return False
    return torch.cuda.get_device_capability(x.device) == (9, 0)


def pixel_strides(x: torch.Tensor) -> tuple[int, int, int]:
    """Elements between w, h and n neighbours of a packed channels_last x (conv_wgmma_supported checked it). PyTorch
    reports any stride for a dimension of size 1 (a 1 x 1 squeeze-excitation input: (C, 1, 1, 1)), which TMA refuses
    (strides must be multiples of 16 bytes): the packed layout's strides are given instead."""
    _, c, h, w = x.shape
    return c, w * c, h * w * c


def im2col_tensor_map(x: torch.Tensor, kernel_size, stride, padding, dilation, box_pixels: int):
    """im2col TMA descriptor of the channels_last input x for boxes of 64 channels x box_pixels output pixels (128-byte
    swizzle, zero fill outside the tensor). Bounding box of the filter's top-left corner: [-pad, dim + pad - (K - 1)
    dilation); traversal stride = the conv stride. Encoded once per (address, shape, strides, geometry, box)."""
    b, c, h, w = x.shape

    def encode():
        drv = nvrtc._driver()
        es = x.element_size()
        dt = getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{G._TMAP_DTYPES[x.dtype]}")
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel_size, stride, padding, dilation
        dims = [drv.cuuint64_t(v) for v in (c, w, h, b)]  # innermost first: (c, w, h, n)
        strides = [drv.cuuint64_t(v * es) for v in pixel_strides(x)]  # bytes between w, h and n neighbours
        err, tm = drv.cuTensorMapEncodeIm2col(
            dt, 4, x.data_ptr(), dims, strides, [-pw, -ph], [pw - (kw - 1) * dw, ph - (kh - 1) * dh],
            CHANNELS_PER_TILE, box_pixels, [drv.cuuint32_t(v) for v in (1, sw, sh, 1)],
            drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        if int(err) != 0:
            raise RuntimeError(f"cuTensorMapEncodeIm2col failed for {x.dtype} {tuple(x.shape)} strides "
                               f"{tuple(x.stride())}, kernel {kernel_size}, stride {stride}, padding {padding}, "
                               f"dilation {dilation}, box {box_pixels}: {err!r}")
        return tm

    key = ("im2col", x.data_ptr(), tuple(x.shape), tuple(x.stride()), x.dtype, kernel_size, stride, padding,
           dilation, box_pixels)
    return G.cached_tensor_map(key, encode)


def default_conv_config(m: int, co: int, k: int, sms: int = 132, waves: ConvWaves | None = None) -> dict:
    """Tiles for a layer the measured table does not hold (deterministic). Where the GPU's table has a wave model
    (``waves``, conv_waves.py) that covers the layer (small M, long K), the tile and cluster split it ranks first.
    Otherwise rules from the H200 sweeps (docs/kernels/cuda_conv_wgmma.md): the path is latency-bound per CTA, so
    shallow rings with a register cap that lets 2-3 CTAs share an SM win at large M (one CTA's epilogue and pipeline
    fill overlap another's main loop); at large M with 128 x 128 tiles for at most half the SMs and a long K, the K
    halves of each tile run as a 2-CTA cluster (split-K without a workspace); small M with a long K runs stream-K over
    16-pixel tiles with 4 k-tiles per stage (a stage's fixed cost spread over more bytes), short K one 64-pixel tile
    per CTA. Batch-1 deep layers (M <= 256, K >= 1024) run 8 K slices of each 56-pixel tile as one cluster, with the
    producer warp when a slice holds several stages."""
    if waves is not None and waves.covers(m, k):
        chosen = waves.choose(m, co, k, sms)
        if chosen is not None:
            return {**_BASE, **chosen}
    if m <= 256 and k >= 16 * CHANNELS_PER_TILE:
        cfg = small_m_tile(k)
    elif m >= 1024 and co > 64 and 2 * math.ceil(m / 128) * math.ceil(co / 128) <= sms and k >= 16 * CHANNELS_PER_TILE:
        cfg = {"BM": 128, "NWG": 2, "STAGES": 4, "KT": 2, "SPLIT": 2, "CLUSTER": 1}
    elif m >= 1024:
        if co > 64:
            cfg = {"BM": 128, "NWG": 2, "STAGES": 4, "MINB": 2}
        else:
            cfg = {"BM": 128, "NWG": 1, "STAGES": 3, "MINB": 3}
    elif k >= 16 * CHANNELS_PER_TILE:
        cfg = {"BM": 16, "NWG": 1, "STAGES": 3, "KT": 4, "SK": 1, "MINB": 4}
    else:
        cfg = {"BM": 64, "NWG": 1, "STAGES": 4, "MINB": 4}
    return {**_BASE, **cfg}


def conv_config(m: int, co: int, k: int, tuned: dict | None, sms: int = 132, waves: ConvWaves | None = None) -> dict:
    """The tile config of a layer: the conv sweep's entry (``tuned``, from triton.conv_common.tuned_wgmma_choice)
    on the base keys, else default_conv_config (with the GPU's SM count and wave model)."""
    return default_conv_config(m, co, k, sms, waves) if tuned is None else {**_BASE, **tuned}


def prepare_conv_wgmma(x: torch.Tensor, qweight: QuantizedConvWeight, stride, padding, dilation,
                       config: dict | None = None, fit: bool = True):
    """conv_wgmma prepared for inputs of x's shape, strides and dtype at any 16-byte aligned address:
    ``launch(x, bias, lo, hi) -> out``. The tile choice, the tensor maps and the kernel parameters are made here once;
    a call writes the input, output and bias addresses (the im2col map's through cuTensorMapReplaceAddress) and
    launches. Made per call, they took about 0.4 ms of host time, a hundred times a small layer's GPU time."""
    if not conv_wgmma_supported(x, qweight, stride, padding, dilation, 1):
        raise ValueError("conv_wgmma needs an sm_90 GPU, fp16 / bf16 channels_last input with Ci % 64 == 0, "
                         "groups 1, stride <= 8 and padding / dilation within the im2col map's corner range")
    b, ci, h, w = x.shape
    (kh, kw) = qweight.kernel_size
    ho, wo = conv_output_size(h, w, (kh, kw), stride, padding, dilation)
    co = qweight.out_channels
    m = b * ho * wo
    parts = []
    if m and co:
        geo = G.ConvGeometry(ci // CHANNELS_PER_TILE, kw, wo, ho * wo, stride[1], stride[0], padding[1], padding[0],
                             dilation[1], dilation[0])
        if config is None:
            from mixgemm.kernels.registry import device_info
            from mixgemm.kernels.triton.conv_common import tuned_wgmma_choice

            info = device_info(x.device)
            config = conv_config(m, co, qweight.matrix.in_features, tuned_wgmma_choice(x.device, qweight, stride, m)[1],
                                 info.sm_count, conv_waves_of(info))

        def make_map(bm: int):
            return im2col_tensor_map(x, (kh, kw), tuple(stride), tuple(padding), tuple(dilation), bm)

        # the output is a fresh caching-allocator block: 16-byte aligned, rows of Co elements
        rows = G.OutputRows(x.dtype, co, True, x.device)
        parts = G._prepare_parts(qweight.matrix, m, co, x.dtype, x.stride(0), x.shape[1], (geo, make_map), rows,
                                 config, fit, torch.cuda.get_device_properties(x.device))

    def launch(xc: torch.Tensor, bias: torch.Tensor | None, lo: float, hi: float) -> torch.Tensor:
        y = torch.empty(m, co, dtype=xc.dtype, device=xc.device)
        out = y.view(b, ho, wo, co).permute(0, 3, 1, 2)  # NCHW shape, channels_last strides
        if bias is not None:  # (copies: the kernel reads a contiguous fp16 / bf16 / fp32 bias)
            bias = (bias if bias.dtype in G._BIAS else bias.to(torch.float32)).contiguous()
        for part in parts:
            part(xc, y, bias, lo, hi)
        return out

    return launch


def conv_wgmma(x: torch.Tensor, qweight: QuantizedConvWeight, bias: torch.Tensor | None, stride, padding, dilation,
               lo: float, hi: float, config: dict | None = None, fit: bool = True) -> torch.Tensor:
    """clamp(conv2d(x, dequant(qweight), bias) , lo, hi), channels_last out (see the module docstring).
    stride / padding / dilation: (h, w) int pairs, already validated (mixgemm.ops.conv.check_conv_inputs)."""
    return prepare_conv_wgmma(x, qweight, stride, padding, dilation, config, fit)(x, bias, lo, hi)
