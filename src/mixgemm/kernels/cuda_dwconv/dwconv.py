"""Depthwise conv2d on the CUDA cores (dwconv.cu, compiled by NVRTC): the dispatcher's "dw_cuda" path.

``dwconv_cuda(x, qw, bias, out, stride, padding, dilation, lo, hi, config=None)`` writes
``clamp(conv2d(x, dequant(qw), bias, groups=C) , lo, hi)`` into ``out`` and returns it:

* x: float16 / bfloat16 [B, C, H, W] on a CUDA device, channels_last-contiguous, C even, the data 4-byte aligned
  (``dwconv_supported`` checks all of it; the Triton kernel serves everything else).
* qw: QuantizedConvWeight [C, 1, Kh, Kw] (one input channel per output channel, channel multiplier 1), int8 or
  int4, per-channel (group_size -1), any mode. The Triton conv layout (packed code rows, fp32 scale / shift) is reused.
* bias: None or float16 / bfloat16 / float32 [C], unit stride. lo, hi: output clamp (+-inf for none).
* out: [B, C, HO, WO] in x's dtype, channels_last, same alignment rules.
Launched on torch.cuda.current_stream(); no synchronization, no allocation (CUDA-graph capturable after the first
call compiled the kernel for this geometry).
"""

from __future__ import annotations

import ctypes
from dataclasses import MISSING, dataclass

import torch

from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.kernel_config import KernelConfig, knob

SOURCE = "cuda_dwconv/dwconv.cu"
KERNEL = "mixgemm_dwconv"
THREADS = 128
_ACT = {torch.float16: 0, torch.bfloat16: 1}
# shared memory of one block's dequantized weights (fp32): taps x channels x 4 bytes <= 48 KB
_SMEM_LIMIT = 48 * 1024


@dataclass(frozen=True)
class DwCudaConfig(KernelConfig):
    """The CUDA depthwise conv's tile (dwconv.cu)."""

    pixels_per_thread: int = knob("TW", "output pixels per thread along W: the sliding window's length, 1..32",
                                  define="DW_TW", default=MISSING)
    channels_per_block: int = knob("CB", "channels per block: even, dividing 256, <= 256",
                                   define="DW_CB", default=MISSING)

    derived = {"DW_KH": "kernel height", "DW_KW": "kernel width", "DW_SW": "stride along W",
               "DW_DW": "dilation along W", "DW_ACT": "activation dtype: 0 fp16, 1 bf16", "DW_BITS": "weight bits",
               "DW_AFFINE": "1: mode 'offset' (w = q * s + m), 0: w = (q - z) * s"}


def _even(*vals: int) -> bool:
    return all(v % 2 == 0 for v in vals)


def dwconv_supported(x: torch.Tensor, qw, groups: int, out: torch.Tensor | None = None) -> bool:
    """True when this kernel runs the problem (else the Triton depthwise kernel does)."""
    c = x.shape[1]
    kh, kw = qw.kernel_size
    ok = (
        x.is_cuda
        and x.dtype in _ACT
        and qw.in_channels_per_group == 1
        and groups == c
        and qw.out_channels == c
        and qw.matrix.bits in (4, 8)
        and qw.matrix.num_groups == 1
        and x.is_contiguous(memory_format=torch.channels_last)  # so the output is channels_last too (ops.conv)
        and _even(c, x.data_ptr() // x.element_size())
        and kh * kw * 2 * 4 <= _SMEM_LIMIT
        and nvrtc.nvrtc_available()
    )
    if ok and out is not None:
        ok = out.is_contiguous(memory_format=torch.channels_last) and _even(out.data_ptr() // out.element_size())
    return bool(ok)


def default_config(c: int, runs_per_tw1: int, wo: int, taps: int, sms: int) -> DwCudaConfig:
    """tw: the longest window (4..32, below 2 x WO) that still gives the GPU sms x 256 threads (thin grids at batch 1
    take short windows); cb: 16 channels per block (32 with the 32-pixel window), or the largest power of two that
    divides C. Measured on the H200 (docs/kernels/cuda_dwconv.md; ConvNeXt 7x7, batch 32 / 1, us):
    96 @ 56 b32 32x32 63.2 (16x16 69.1, 32x16 69.2); 384 @ 14 b32 16x16 21.0; 96 @ 56 b1 4x16 6.9;
    384 @ 14 b1 4x16 6.0."""
    tw = 32
    while tw > 4 and (tw >= 2 * wo or (c // 2) * (-(-runs_per_tw1 // tw)) < sms * 256):
        tw //= 2
    cb = 32 if tw == 32 else 16
    while cb > 2 and (c % cb or taps * cb * 4 > _SMEM_LIMIT):
        cb //= 2
    return DwCudaConfig(pixels_per_thread=tw, channels_per_block=cb)


def dwconv_cuda(x, qw, bias, out, stride, padding, dilation, lo: float, hi: float,
                config: DwCudaConfig | None = None) -> torch.Tensor:
    from mixgemm.kernels.triton.conv_common import conv_layout

    lay = conv_layout(qw.matrix)
    b, c, h, w = x.shape
    _, _, ho, wo = out.shape
    kh, kw = qw.kernel_size
    props = torch.cuda.get_device_properties(x.device)
    cfg = config or default_config(c, b * ho * wo, wo, kh * kw, props.multi_processor_count)
    tw, cb = cfg.pixels_per_thread, cfg.channels_per_block
    if cb % 2 or not 2 <= cb <= 2 * THREADS or (2 * THREADS) % cb or kh * kw * cb * 4 > _SMEM_LIMIT:
        raise ValueError(f"dwconv_cuda: bad channel block cb={cb} for a {kh}x{kw} kernel")
    if not 1 <= tw <= 32:
        raise ValueError(f"dwconv_cuda: window tw={tw} must be in 1..32")
    defs = {"DW_KH": kh, "DW_KW": kw, "DW_SW": stride[1], "DW_DW": dilation[1], **cfg.defines(),
            "DW_ACT": _ACT[x.dtype], "DW_BITS": lay.bits, "DW_AFFINE": int(lay.affine)}
    fn = nvrtc.get_function(SOURCE, KERNEL, defs, x.device)
    runs_w = -(-wo // tw)  # windows per output row: a run never crosses rows
    runs = b * ho * runs_w
    per_block = THREADS // (cb // 2)
    cblocks = -(-c // cb)
    if cblocks >= 65536 or h * w * c >= 2**31:
        raise ValueError(f"dwconv_cuda: {c} channels of {h}x{w} pixels are too many for one image")
    # the blocks loop over their runs (grid stride): two waves of resident blocks, so each block's weight prologue
    # (KH x KW x cb dequantized weights) serves many runs
    waves = 2 * nvrtc.resident_blocks(fn, THREADS) * props.multi_processor_count
    grid = (max(1, min(-(-runs // per_block), -(-waves // cblocks))), cblocks, 1)
    i32 = ctypes.c_int
    args = [
        ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(lay.weight.data_ptr()), i32(lay.weight.shape[1] * 4),
        ctypes.c_void_p(lay.scale.data_ptr()), ctypes.c_void_p(lay.shift.data_ptr()), ctypes.c_void_p(out.data_ptr()),
        i32(c), i32(h), i32(w), i32(ho), i32(wo), i32(stride[0]), i32(dilation[0]), i32(padding[0]),
        i32(padding[1]), i32(runs_w), i32(runs),
        *nvrtc.bias_clamp_args(bias, lo, hi),
    ]
    with torch.cuda.device(x.device):
        nvrtc.launch(fn, grid, (THREADS, 1, 1), args, torch.cuda.current_stream(x.device).cuda_stream)
    return out
