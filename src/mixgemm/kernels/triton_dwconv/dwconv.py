"""``triton_dwconv``'s kernel: depthwise convolution (Ci_g == 1, per-channel weights) with a block-quantized INT4 / INT8
kernel. Depthwise has no GEMM worth the name (N = 1 per group): ``_dwconv_kernel`` is a direct CUDA-core kernel over
[pixels, channels] tiles, run-time loops over the kernel taps, reading the shared ``conv_triton_v1`` layout
(mixgemm.kernels.triton.conv_common).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass

import torch
import triton
import triton.language as tl

from mixgemm.formats.conv import QuantizedConvWeight
from mixgemm.kernels.kernel_config import KernelConfig, knob
from mixgemm.kernels.triton.conv_common import _pow2_at_least, conv_epilogue, conv_layout, out_pixels


@triton.jit(do_not_specialize=["M", "H", "W", "HO", "WO"])
def _dwconv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    m_ptr,
    bias_ptr,
    out_ptr,
    M,
    H,
    W,
    HO,
    WO,
    CO,
    CO_G,
    KB,
    sxb,
    sxc,
    sxh,
    sxw,
    sob,
    soc,
    soh,
    sow,
    lo,
    hi,
    KH: tl.constexpr,
    KW: tl.constexpr,
    SH: tl.constexpr,
    SW: tl.constexpr,
    PH: tl.constexpr,
    PW: tl.constexpr,
    DH: tl.constexpr,
    DW: tl.constexpr,
    AFFINE: tl.constexpr,
    BITS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Depthwise (Ci_g = 1, per-channel weights): out[m, c] = sum_taps x[m @ tap, c // CO_G] * w[c, tap]."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_m = offs_m < M
    mask_c = offs_c < CO
    bb, oh, ow = out_pixels(offs_m, HO, WO)
    ih0 = oh * SH - PH
    iw0 = ow * SW - PW
    cin = offs_c // CO_G
    # 1-D row / column offsets, combined into a 2-D pointer tile only at each load: a [BLOCK_M, BLOCK_C] tile of
    # 64-bit pointers kept live across the tap loop cost 2 registers per element and made ptxas spill
    row0 = bb.to(tl.int64) * sxb
    col = cin.to(tl.int64) * sxc
    sc = tl.load(s_ptr + offs_c, mask=mask_c, other=0.0)
    sh = tl.load(m_ptr + offs_c, mask=mask_c, other=0.0)
    wrow = w_ptr + offs_c.to(tl.int64) * KB
    acc = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    # run-time tap loops (not unrolled). With the 49 taps of a 7x7 unrolled, the sm_90 build (triton 3.6,
    # cuobjdump -res-usage) spilled 5-11 KB per thread for the 64x64 / 128x32 / 64x32 tiles -- the tiles that ran
    # 25-40x slower on the H200 -- and used 255 registers for 32x128; run-time loops: 118 registers, no spill
    # (32x128), i.e. 4 CTAs per SM to hide the load latency. The loop overhead is a few scalar ops per tap.
    for kh in range(KH):
        ih = ih0 + kh * DH
        okh = mask_m & (ih >= 0) & (ih < H)
        for kw in range(KW):
            iw = iw0 + kw * DW
            ok = okh & (iw >= 0) & (iw < W)
            tap = kh * KW + kw
            if BITS == 8:
                q = tl.load(wrow + tap, mask=mask_c, other=0).to(tl.float32)
            else:
                byt = tl.load(wrow + tap // 2, mask=mask_c, other=0)
                q = ((byt >> (4 * (tap % 2))) & 0xF).to(tl.float32)
            wv = q * sc + sh if AFFINE else (q - sh) * sc
            xv = tl.load(x_ptr + (row0 + ih * sxh + iw * sxw)[:, None] + col[None, :],
                         mask=ok[:, None] & mask_c[None, :], other=0.0)
            acc += xv.to(tl.float32) * wv[None, :]
    conv_epilogue(acc, out_ptr, bias_ptr, offs_c, mask_c, bb, oh, ow, mask_m, sob, soc, soh, sow, lo, hi, HAS_BIAS)


@dataclass(frozen=True)
class DwConfig(KernelConfig):
    """Tiles of the depthwise kernel: output pixels x channels per program (Triton constexprs: no -D macros)."""

    block_m: int = knob("BM", "output pixels per program (<= 32 measured fastest)", default=MISSING)
    block_c: int = knob("BC", "channels per program (the contiguous channels_last run)", default=MISSING)
    num_warps: int = knob("num_warps", "warps per program", default=4)


def dw_conv2d(
    x: torch.Tensor,
    qw: QuantizedConvWeight,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    stride,
    padding,
    dilation,
    groups: int,
    lo: float,
    hi: float,
    block_m: int | None = None,
    block_c: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """Depthwise conv (Ci_g == 1, per-channel weights) into ``out``."""
    lay = conv_layout(qw.matrix)
    if lay.num_groups != 1:
        raise ValueError("depthwise conv needs per-channel quantization (group_size=-1)")
    b, _, h, w = x.shape
    _, co, ho, wo = out.shape
    kh, kw = qw.kernel_size
    m = b * ho * wo
    # tiles of <= 32 pixels x 128 channels: measured on the H200 (ConvNeXt 7x7 dw at batch 32),
    # every tile with 64+ pixels (64x64, 128x32, 128x64, 256x32) ran 25-40x slower than 32x128 / 16x128 (146 vs
    # 4300-5800 us): keep the pixel tile short and the (contiguous, channels_last) channel run long
    block_c = block_c or min(128, _pow2_at_least(co, 16))
    # 16 pixels up to 4096 of them (batch 1): ConvNeXt 7x7 dw at batch 1, 96 @ 56 / 384 @ 14 channels, 16.7 -> 15.3 /
    # 16.4 -> 15.2 us (H200, CONV_SWEEP=dw); at batch 32 (6272+ pixels) 32 stays faster (34.6 vs 39.8 us)
    block_m = block_m or (32 if m > 4096 else 16)
    bias_t = bias if bias is not None else lay.scale
    _dwconv_kernel[(triton.cdiv(m, block_m), triton.cdiv(co, block_c))](
        x,
        lay.weight.view(torch.uint8),
        lay.scale,
        lay.shift,
        bias_t,
        out,
        m,
        h,
        w,
        ho,
        wo,
        co,
        co // groups,
        lay.weight.shape[1] * 4,
        *x.stride(),
        *out.stride(),
        lo,
        hi,
        KH=kh,
        KW=kw,
        SH=stride[0],
        SW=stride[1],
        PH=padding[0],
        PW=padding[1],
        DH=dilation[0],
        DW=dilation[1],
        AFFINE=lay.affine,
        BITS=lay.bits,
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m,
        BLOCK_C=block_c,
        num_warps=num_warps,
    )
    return out
