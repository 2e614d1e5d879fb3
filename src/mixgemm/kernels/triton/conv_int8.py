"""INT8-activation implicit-GEMM convolution (int8 activations quantized on the fly).

y = conv2d(x, W) with x quantized per output-pixel-independent *input pixel* and per block of ``ABLK`` input
channels (mixgemm.kernels.triton.act_quant on the channels_last [B*H*W, Ci] view: x[p, c] ~= qa * sA + oA of
its (pixel, block)), and W block-quantized (INT4 / INT8, any mode), rewritten as w = c * sW + mW with the signed
code c = q - 2**(bits-1) (the int8_v1 convention, mixgemm.kernels.triton_a8.layout).

GEMM view as in triton_conv_igemm/igemm.py (m = output pixel, n = output channel, k = (kh*Kw + kw)*Ci_g + ci). The
K loop walks *fold blocks* of L channels inside one tap; L divides both the activation block and the weight
group (when the group lies inside a tap), so within a fold block sA, oA (per pixel) and sW, mW (per channel)
are constants and the block's contribution is exact integer work plus one float fold:

  sum_k x w = sA sW sum(qa c) + sA mW sum(qa) + oA sW sum(c) + oA mW L

sum(qa c): int8 x int8 -> int32 tensor-core dots (tl.dot), sum(qa), sum(c): integer row / column sums of the
same tiles. A tap that falls in the padding reads zero codes and sA = oA = 0 (masked loads), so it adds
exactly 0 (asym activations included: their zero is not code 0).

Weights are read from the plain packing as bytes (no extra layout for the codes): 8 bits c = q - 128; 4 bits
split into their two nibbles in registers, c = q - 8. Masked-off channels read code 0 (never stored).
Layout ``conv_a8_v1`` caches only sW and mW as float32 [G, Co].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mixgemm.formats.conv import QuantizedConvWeight
from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.triton.conv_common import conv_epilogue, out_pixels

LAYOUT_NAME = "conv_a8_v1"


@dataclass(frozen=True)
class ConvA8Layout:
    """codes: the plain packing, uint8 [Co, K * bits / 8]; scale, moff: float32 [G, Co] with
    w = (q - 2**(bits-1)) * scale + moff."""

    codes: torch.Tensor
    scale: torch.Tensor
    moff: torch.Tensor
    has_offset: bool
    bits: int
    group_size: int
    num_groups: int
    k: int


def build_conv_a8_layout(qw: QuantizedWeight) -> ConvA8Layout:
    s64, m64 = qw.centered_params_float64()
    codes = qw.qweight.contiguous()  # the plain packing itself (a no-copy view when already contiguous)
    return ConvA8Layout(
        codes=codes,
        scale=s64.t().float().contiguous(),
        moff=m64.t().float().contiguous(),
        has_offset=qw.mode != "sym",
        bits=qw.bits,
        group_size=qw.group_size,
        num_groups=qw.num_groups,
        k=qw.shape[1],
    )


def conv_a8_layout(qw: QuantizedWeight) -> ConvA8Layout:
    return qw.layout(LAYOUT_NAME, build_conv_a8_layout)


@triton.jit
def _signed_codes(w_ptr, n_glob, mask_n, k0, WROW, BITS: tl.constexpr, BLOCK_K: tl.constexpr):
    """Signed weight codes c = q - 2**(BITS-1) of W[n_glob, k0 : k0 + BLOCK_K] as int8 [BLOCK_N, BLOCK_K].

    w_ptr: the plain packing as bytes (WROW per row). 4 bits: byte j holds k = 2j (bits 0-3) and 2j + 1
    (bits 4-7); tl.join keeps both codes of a byte in one thread (as in triton_conv_igemm/igemm.py's _weight_tile)."""
    rows = w_ptr + n_glob[:, None].to(tl.int64) * WROW
    if BITS == 8:
        offs = k0 + tl.arange(0, BLOCK_K)
        q = tl.load(rows + offs[None, :], mask=mask_n[:, None], other=0)
        return (q.to(tl.int16) - 128).to(tl.int8)
    else:
        HB: tl.constexpr = BLOCK_K // 2
        offs = k0 // 2 + tl.arange(0, HB)
        b = tl.load(rows + offs[None, :], mask=mask_n[:, None], other=0).to(tl.int16)
        q = tl.reshape(tl.join((b & 0xF) - 8, (b >> 4) - 8), (b.shape[0], BLOCK_K))
        return q.to(tl.int8)


@triton.jit(do_not_specialize=["M", "H", "W", "HO", "WO", "SH", "SW", "PH", "PW", "DH", "DW", "NFOLD"])
def _igemm_a8_kernel(
    qa_ptr,
    sa_ptr,
    oa_ptr,
    w_ptr,
    sw_ptr,
    mw_ptr,
    bias_ptr,
    out_ptr,
    M,
    H,
    W,
    HO,
    WO,
    CO,
    CI,
    CI_G,
    CO_G,
    WROW,
    GWS,
    GA,
    ABLK,
    sob,
    soc,
    soh,
    sow,
    lo,
    hi,
    KW,
    SH,
    SW,
    PH,
    PW,
    DH,
    DW,
    NFOLD,
    FPB,
    SPF,
    BITS: tl.constexpr,
    ASYM: tl.constexpr,
    WOFF: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    grp = tl.program_id(1)
    num_pid_n = tl.cdiv(CO_G, BLOCK_N)
    pid_n = pid % num_pid_n  # N fastest: programs sharing an activation tile run back to back (L2 hits)
    pid_m = pid // num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    bb, oh, ow = out_pixels(offs_m, HO, WO)
    ih0 = oh * SH - PH
    iw0 = ow * SW - PW
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < CO_G
    n_glob = grp * CO_G + offs_n
    offs_k = tl.arange(0, BLOCK_K)
    L = SPF * BLOCK_K  # fold block: constant sA / oA / sW / mW inside
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for f in range(NFOLD):
        tap = f // FPB
        cf = (f - tap * FPB) * L  # channel offset of the fold block inside the group
        kh = tap // KW
        kw = tap - kh * KW
        ih = ih0 + kh * DH
        iw = iw0 + kw * DW
        ok = mask_m & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        pix = (bb.to(tl.int64) * H + ih) * W + iw  # row of the [B*H*W, Ci] activation view
        row = qa_ptr + pix * CI + grp * CI_G + cf
        kf = tap * CI_G + cf  # K index of the fold block in the weight matrix
        dacc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        sum_a = tl.zeros((BLOCK_M,), dtype=tl.int32)
        sum_c = tl.zeros((BLOCK_N,), dtype=tl.int32)
        for s in range(SPF):
            a = tl.load(row[:, None] + (s * BLOCK_K + offs_k)[None, :], mask=ok[:, None], other=0)
            c = _signed_codes(w_ptr, n_glob, mask_n, kf + s * BLOCK_K, WROW, BITS, BLOCK_K)
            dacc = tl.dot(a, tl.trans(c), dacc, out_dtype=tl.int32)  # int8 x int8 -> int32, exact
            if WOFF:
                sum_a += tl.sum(a.to(tl.int32), axis=1)
            if ASYM:
                sum_c += tl.sum(c.to(tl.int32), axis=1)
        ga = (grp * CI_G + cf) // ABLK
        s_a = tl.load(sa_ptr + pix * GA + ga, mask=ok, other=0.0)  # 0 in the padding: the tap adds nothing
        gw = kf // GWS
        s_w = tl.load(sw_ptr + gw * CO + n_glob, mask=mask_n, other=0.0)
        acc += (dacc.to(tl.float32) * s_w[None, :]) * s_a[:, None]
        if WOFF:
            m_w = tl.load(mw_ptr + gw * CO + n_glob, mask=mask_n, other=0.0)
            acc += (s_a * sum_a.to(tl.float32))[:, None] * m_w[None, :]
        if ASYM:
            o_a = tl.load(oa_ptr + pix * GA + ga, mask=ok, other=0.0)
            wc = s_w * sum_c.to(tl.float32)
            if WOFF:
                wc += m_w * L
            acc += o_a[:, None] * wc[None, :]
    conv_epilogue(acc, out_ptr, bias_ptr, n_glob, mask_n, bb, oh, ow, mask_m, sob, soc, soh, sow, lo, hi, HAS_BIAS)


@dataclass(frozen=True)
class ConvA8Config:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


def fold_length(ci_g: int, k: int, group_size: int, act_block: int) -> int:
    """L: the channel run with constant activation and weight parameters (divides Ci_g, act block, group).
    group_size: the weight's effective group (K, or -1, for per-channel)."""
    wg = k if group_size in (-1, k) else group_size
    fl = act_block if wg >= k else math.gcd(act_block, wg)
    return math.gcd(fl, ci_g)


def pick_a8_config(m: int, co_g: int, fl: int) -> ConvA8Config:
    bk = next(b for b in (64, 32) if fl % b == 0)
    bm = 128 if m >= 2048 else 64 if m > 16 else 16
    bn = 128 if co_g >= 128 else max(16, triton.next_power_of_2(co_g))
    return ConvA8Config(bm, bn, bk, 8 if bm * bn >= 128 * 128 else 4, 3)


def igemm_conv2d_a8(
    qa: torch.Tensor,
    sa: torch.Tensor,
    oa: torch.Tensor,
    act_block: int,
    asym: bool,
    in_hw: tuple[int, int],
    qw: QuantizedConvWeight,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    stride,
    padding,
    dilation,
    groups: int,
    lo: float,
    hi: float,
    config: ConvA8Config | None = None,
) -> torch.Tensor:
    """INT8-activation conv into ``out`` [B, Co, Ho, Wo] (any strides; dtype = the output dtype).

    qa: int8 [B*H*W, Ci] activation codes (channels_last pixel order), sa / oa: float32 [B*H*W, Ci // act_block]
    (act_quant's scales / offsets). Requirements (checked by the caller, mixgemm.ops.conv.conv2d_a8): act_block
    divides Ci/groups and the fold length (see fold_length) is a multiple of 32."""
    lay = conv_a8_layout(qw.matrix)
    h, w = in_hw
    b, co, ho, wo = out.shape
    kh, kw = qw.kernel_size
    ci_g = qw.in_channels_per_group
    co_g = co // groups
    m = b * ho * wo
    k = kh * kw * ci_g
    fl = fold_length(ci_g, k, lay.group_size, act_block)
    cfg = config or pick_a8_config(m, co_g, fl)
    if fl % cfg.block_k:
        raise ValueError(f"block_k={cfg.block_k} must divide the fold length {fl}")
    bias_t = bias if bias is not None else lay.scale
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(co_g, cfg.block_n), groups)
    _igemm_a8_kernel[grid](
        qa,
        sa,
        oa,
        lay.codes,
        lay.scale,
        lay.moff,
        bias_t,
        out,
        m,
        h,
        w,
        ho,
        wo,
        co,
        qa.shape[1],
        ci_g,
        co_g,
        lay.codes.shape[1],
        lay.group_size,  # effective group: K for per-channel (then gw = 0 throughout)
        sa.shape[1],
        act_block,
        *out.stride(),
        lo,
        hi,
        kw,
        stride[0],
        stride[1],
        padding[0],
        padding[1],
        dilation[0],
        dilation[1],
        kh * kw * (ci_g // fl),
        ci_g // fl,
        fl // cfg.block_k,
        BITS=lay.bits,
        ASYM=asym,
        WOFF=lay.has_offset,
        HAS_BIAS=bias is not None,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out
