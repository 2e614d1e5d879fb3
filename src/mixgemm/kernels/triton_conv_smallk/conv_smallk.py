"""Small-reduction conv (the 3-channel stems): the whole K of the implicit GEMM in one tile.

A conv whose reduction K = Kh * Kw * Ci is small (ResNet's 7x7/2 stem on 3 channels: K = 147; ConvNeXt's 4x4/4
patchify stem: K = 48) is not a K loop at all: its weight is a [Co, K] matrix of a few KB, and the time goes to
reading the input and writing the output (the stem's batch-32 output is 51 MB). The generic implicit GEMM
(conv.py) runs it as 5 K steps per output tile, each decoding (tap, channel) per element and dequantizing its
weight slice again for every output tile: 277 us for the ResNet-50 stem at batch 32 on an H200, 3.3x cuDNN's 83 us.

This kernel instead:
* dequantizes its [K_PAD, BLOCK_N] weight tile once per program, before the loop (it stays in registers / shared
  memory for every output tile the program runs);
* walks output tiles in a persistent loop (grid = a few programs per SM, tile t, t + grid, ...);
* gathers each output tile's whole im2col row block [BLOCK_M, K_PAD] in one masked load. The columns are ordered
  as *runs* that are contiguous in memory, so a row of the gather is a few long contiguous reads instead of K
  scattered ones: channels_last input: run = kh, run element j = kw * Ci + ci (Kw * Ci consecutive values of one
  input row); NCHW: run = (ci, kh), j = kw. Each run is padded to a power of two (RUN); padding columns have
  zero weights and a masked (zero) activation;
* one tl.dot per output tile, then the shared conv epilogue (scale, bias, clamp, store in the output's layout).

Column decode (per program, once): column c -> run r = c // RUN, j = c % RUN -> (kh, kw, ci), its element offset
ci * sxc + kh * dh * sxh + kw * dw * sxw from the output pixel's window corner, and its weight column
k = (kh * Kw + kw) * Ci + ci (QuantizedConvWeight's K order). Any strides and dilation are correct; the run order
only decides which loads coalesce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mixgemm.formats.conv import QuantizedConvWeight
from mixgemm.kernels.kernel_config import KernelConfig, knob
from mixgemm.kernels.triton.conv_common import (
    _TL_DTYPES,
    _dot_prec,
    _num_sms,
    _pow2_at_least,
    conv_epilogue,
    conv_layout,
    out_pixels,
)
from mixgemm.kernels.triton.dequant import codes_to_values, group_params

# the dispatcher sends convs with at most this many input channels per group here (stems: 3, 4); wider inputs keep
# the K-loop kernels, whose tap-aligned steps load whole channel vectors
SMALLK_MAX_CI = 8
MAX_K_PAD = 256  # the whole padded K of one tile: [BLOCK_M, 256] activations + [256, BLOCK_N] weights in registers


@dataclass(frozen=True)
class SmallKConfig(KernelConfig):
    """The whole-K kernel's tile (Triton constexprs and launch settings: no -D macros)."""

    block_m: int = knob("BM", "output pixels per program", default=128)
    block_n: int = knob("BN", "output channels per program", default=64)
    num_warps: int = knob("num_warps", "warps per program", default=8)
    num_stages: int = knob("num_stages", "software pipeline stages of the pixel loop", default=2)
    programs_per_sm: int = knob("PPS", "programs per SM of the persistent grid (over the pixel tiles)", default=2)


def run_shape(x: torch.Tensor, ci_g: int, kh: int, kw: int) -> tuple[bool, int, int]:
    """(channels-last runs, RUN, K_PAD): runs along (kw, ci) when channels are innermost in memory, else along kw."""
    cl = x.stride(1) == 1 and ci_g > 1
    run_len, runs = (kw * ci_g, kh) if cl else (kw, ci_g * kh)
    run = _pow2_at_least(run_len, 2)
    return cl, run, _pow2_at_least(runs * run, 16)


def smallk_supported(x: torch.Tensor, qweight: QuantizedConvWeight, groups: int) -> bool:
    """True when the whole padded K fits one tile (K_PAD <= MAX_K_PAD): groups 1, not depthwise."""
    if groups != 1:
        return False
    kh, kw = qweight.kernel_size
    return run_shape(x, qweight.in_channels_per_group, kh, kw)[2] <= MAX_K_PAD


@triton.jit(do_not_specialize=["M", "H", "W", "HO", "WO", "SH", "SW", "PH", "PW", "DH", "DW"])
def _smallk_conv_kernel(
    x_ptr, w_ptr, s_ptr, m_ptr, bias_ptr, out_ptr,
    M, H, W, HO, WO, CO, WROWB, GS,
    sxb, sxc, sxh, sxw, sob, soc, soh, sow, lo, hi,
    SH, SW, PH, PW, DH, DW,
    CI: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, CL: tl.constexpr, RUN: tl.constexpr,
    BITS: tl.constexpr, ZERO_MODE: tl.constexpr, SCALE_W: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT_DTYPE: tl.constexpr, DOT_PREC: tl.constexpr,
    K_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < CO

    # ---- column decode (once): run r, element j -> (kh, kw, ci), validity, input offset, weight column
    col = tl.arange(0, K_PAD)
    r = col // RUN
    j = col % RUN
    if CL:  # run = kh; j = kw * CI + ci
        kh = r
        kw = j // CI
        ci = j % CI
        valid = (r < KH) & (j < KW * CI)
    else:  # run = ci * KH + kh; j = kw
        ci = r // KH
        kh = r % KH
        kw = j
        valid = (r < CI * KH) & (j < KW)
    dh = kh * DH
    dw = kw * DW
    col_off = ci.to(tl.int64) * sxc + dh.to(tl.int64) * sxh + dw.to(tl.int64) * sxw
    k = tl.where(valid, (kh * KW + kw) * CI + ci, 0)

    # ---- the [K_PAD, BLOCK_N] weight tile, dequantized once (padding columns: 0)
    rows = w_ptr + offs_n[None, :].to(tl.int64) * WROWB
    wmask = valid[:, None] & mask_n[None, :]
    if BITS == 8:
        q = tl.load(rows + k[:, None], mask=wmask, other=0).to(tl.int32)
    else:  # little-endian nibbles: byte k // 2 holds k even in bits 0-3, k odd in bits 4-7
        q = (tl.load(rows + (k // 2)[:, None], mask=wmask, other=0).to(tl.int32) >> ((k % 2) * 4)[:, None]) & 0xF
    g = k // GS
    s_raw = tl.load(s_ptr + g[:, None] * CO + offs_n[None, :], mask=wmask, other=0.0)
    p_raw = tl.load(m_ptr + g[:, None] * CO + offs_n[None, :], mask=wmask, other=0.0)
    sc, sh = group_params(s_raw, p_raw, BITS, ZERO_MODE, ACT_DTYPE)
    wt = codes_to_values(q, BITS, ZERO_MODE, sc, sh, ACT_DTYPE, SCALE_W)
    wt = tl.where(wmask, wt, tl.zeros_like(wt))
    if not SCALE_W:  # per-channel sym / zero_point: exact integers q - z in the dot, the scale once per output
        s_out = tl.load(s_ptr + offs_n, mask=mask_n, other=0.0)

    hu = H.to(tl.uint32, bitcast=True)
    wu = W.to(tl.uint32, bitcast=True)
    tiles = tl.cdiv(M, BLOCK_M)
    for t in range(pid, tiles, nprog):
        offs_m = t * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < M
        bb, oh, ow = out_pixels(offs_m, HO, WO)
        ih0 = oh * SH - PH
        iw0 = ow * SW - PW
        # one unsigned compare per bound pair: a negative coordinate wraps to a huge unsigned value
        ok = (
            (mask_m[:, None] & valid[None, :])
            & ((ih0[:, None] + dh[None, :]).to(tl.uint32, bitcast=True) < hu)
            & ((iw0[:, None] + dw[None, :]).to(tl.uint32, bitcast=True) < wu)
        )
        corner = bb.to(tl.int64) * sxb + ih0.to(tl.int64) * sxh + iw0.to(tl.int64) * sxw
        a = tl.load(x_ptr + corner[:, None] + col_off[None, :], mask=ok, other=0.0)
        acc = tl.dot(a, wt, input_precision=DOT_PREC)
        if not SCALE_W:
            acc = acc * s_out[None, :]
        conv_epilogue(acc, out_ptr, bias_ptr, offs_n, mask_n, bb, oh, ow, mask_m, sob, soc, soh, sow, lo, hi,
                      HAS_BIAS)


def default_smallk_config(device, m: int, co: int) -> SmallKConfig:
    """Tiles from the problem size (deterministic). Measured on the H200, ResNet-50 stem (tools/bench/conv_wgmma.py
    CONV_SWEEP=smallk, docs/kernels/triton_conv_smallk.md): 128 x 64 tiles at 2 programs per SM won at batch 32
    (4 warps: 68 us; 8 warps 91, 64-pixel tiles 83, 256-pixel 80) and at batch 1 (8 warps: 7.6 us, although its 98
    tiles leave SMs idle; 64-pixel tiles 8.0, 32-pixel 13.3)."""
    bn = 64 if co >= 64 else _pow2_at_least(co, 16)
    tiles = triton.cdiv(m, 128) * triton.cdiv(co, bn)
    return SmallKConfig(block_m=128, block_n=bn, num_warps=4 if tiles >= 4 * _num_sms(device) else 8)


def smallk_conv2d(
    x: torch.Tensor,
    qw: QuantizedConvWeight,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    lo: float,
    hi: float,
    config: SmallKConfig | None = None,
) -> torch.Tensor:
    """Small-K conv into ``out`` ([B, Co, Ho, Wo], any strides, x.dtype); groups 1, ``smallk_supported``; args
    checked by the caller (ops.conv.check_conv_inputs)."""
    lay = conv_layout(qw.matrix)
    b, ci, h, w = x.shape
    _, co, ho, wo = out.shape
    kh, kw = qw.kernel_size
    cl, run, k_pad = run_shape(x, ci, kh, kw)
    if k_pad > MAX_K_PAD:
        raise ValueError(f"smallk conv: padded K {k_pad} > {MAX_K_PAD} (Kh={kh}, Kw={kw}, Ci={ci})")
    m = b * ho * wo
    cfg = config or default_smallk_config(x.device, m, co)
    n_tiles = triton.cdiv(co, cfg.block_n)
    progs = max(1, min(triton.cdiv(m, cfg.block_m), cfg.programs_per_sm * _num_sms(x.device) // n_tiles))
    _smallk_conv_kernel[(progs, n_tiles)](
        x, lay.weight.view(torch.uint8), lay.scale, lay.shift, bias if bias is not None else lay.scale, out,
        m, h, w, ho, wo, co, lay.weight.shape[1] * 4, lay.group_size,
        *x.stride(), *out.stride(), lo, hi,
        stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1],
        CI=ci, KH=kh, KW=kw, CL=cl, RUN=run,
        BITS=lay.bits, ZERO_MODE=lay.zero_mode,
        SCALE_W=lay.scale_in_tile,
        HAS_BIAS=bias is not None, ACT_DTYPE=_TL_DTYPES[x.dtype], DOT_PREC=_dot_prec(x.dtype),
        K_PAD=k_pad, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
