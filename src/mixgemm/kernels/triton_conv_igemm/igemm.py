"""``triton_conv_igemm``'s kernel: Triton implicit-GEMM convolution with a block-quantized INT4/INT8 kernel.

GEMM view (per conv group g): out[m, n] = sum_k A[m, k] * W[n, k] with
  m = (b * Ho + oh) * Wo + ow            (output pixel),
  n = output channel inside group g,
  k = (kh * Kw + kw) * Ci_g + ci          (QuantizedConvWeight's K order: Ci innermost),
  A[m, k] = x[b, g * Ci_g + ci, oh * sh - ph + kh * dh, ow * sw - pw + kw * dw]  (0 outside the image).
A is never materialised (no im2col buffer): each program computes the addresses of its [BLOCK_M, BLOCK_K]
slice of A from the output-pixel indices and the tap, loads it straight from x (any strides: NCHW or
channels_last; channels_last makes the Ci run contiguous, so those loads are coalesced and vectorised), and
dequantizes its [BLOCK_K, BLOCK_N] weight tile in registers right before ``tl.dot`` (tensor cores).

Two K-loop shapes (constexpr TAP_LOOP):
* TAP_LOOP: Ci_g % BLOCK_K == 0. Each K step lies in one tap, so the spatial offsets / padding mask are
  one vector per step, and (because BLOCK_K divides the quantization group) one scale per output channel.
* flat: any Ci_g (the 3-channel stem, Ci_g = 24, ...), per-channel quantization only (a group of 32+ codes
  that divides Ci_g always allows TAP_LOOP). Tap / channel are decoded per element.

Depthwise convolutions run mixgemm.kernels.triton_dwconv instead (no GEMM worth the name: N = 1 per group).

Split-K (SPLIT_K > 1): when the output tiles alone cannot fill the GPU (batch 1, deep layers), each split
writes fp32 partial sums to a workspace and ``_splitk_reduce_kernel`` sums them and applies the epilogue
(deterministic: no atomics).

Dequantization: the weight tile is loaded as bytes of the plain packing (one contiguous k run per thread; for
4 bits tl.join splits each byte into its two codes in the same thread) and turned into values by the shared
primitive mixgemm.kernels.triton.dequant.codes_to_values (magic-number conversion, fp16 math for fp16
activations: w = (q - z) * s, or q * s + m for "offset"). The layout keeps s and z (or m) in float32 [G, Co] so
one program loads a contiguous [BLOCK_N] vector per group; per-channel sym / zero_point weights enter the dot as
exact integers q - z and the scale multiplies the accumulator once. The K loop carries (kh, kw, channel block,
group) as counters instead of dividing the step index (run-time integer division is ~25 instructions on sm_90).
Instruction counts of the sm_90 loop body per K step (triton 3.6, cuobjdump -sass, 128x128x64 tile, 4 warps):
W8 per-channel 734 -> 362, W4 g128 895 -> 538 (docs/kernels/triton_conv_igemm.md).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass

import torch
import triton
import triton.language as tl

from mixgemm.formats.conv import QuantizedConvWeight
from mixgemm.kernels.kernel_config import KernelConfig, knob
from mixgemm.kernels.triton.conv_common import (
    _TL_DTYPES,
    _dot_prec,
    _gpu_name,
    _num_sms,
    _pow2_at_least,
    conv_epilogue,
    conv_layout,
    out_pixels,
)
from mixgemm.kernels.triton.dequant import codes_to_values, group_params


# --------------------------------------------------------------------------------------------- kernels
@triton.jit
def _weight_tile(
    w_ptr,
    n_glob,
    mask_n,
    k0,
    WROWB,
    s,
    p,
    BITS: tl.constexpr,
    ZERO_MODE: tl.constexpr,
    OUT_DTYPE: tl.constexpr,
    SCALE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """W[n_glob, k0 : k0 + BLOCK_K] dequantized to OUT_DTYPE, [BLOCK_N, BLOCK_K].

    w_ptr: the packed rows as bytes (WROWB bytes per row; little-endian nibbles for 4 bits: byte j holds k = 2j in
    bits 0-3 and k = 2j + 1 in bits 4-7). The tile is loaded as bytes, not int32 words: a byte tile's coalesced
    layout gives each thread a contiguous run of k (16-byte loads), and so does the dequantized tile, which then
    goes to shared memory (wgmma's B operand) with vector stores. The word tile + 3-D [BN, words, 8] unpack it
    replaced got a layout with one code per thread (the 8 codes of a word spread over 8 threads): sm_90 SASS of
    the W4 128x128x64 tile showed 64 scalar STS.U16 per thread per K step. For 4 bits, tl.join keeps the two
    nibbles of a byte in one thread (join's new axis is always thread-local). Codes become values in the shared
    primitive mixgemm.kernels.triton.dequant.codes_to_values. s, p: [BLOCK_N, 1] from group_params.
    SCALE=False yields the exact integers q - z (the caller scales the accumulator). Codes past the row
    (padding, or the partial last step of the flat loop) meet zero activations."""
    rows = w_ptr + n_glob[:, None].to(tl.int64) * WROWB
    if BITS == 8:
        offs = k0 + tl.arange(0, BLOCK_K)
        q = tl.load(rows + offs[None, :], mask=mask_n[:, None] & (offs[None, :] < WROWB), other=0).to(tl.int32)
    elif BLOCK_K >= 32:
        HB: tl.constexpr = BLOCK_K // 2
        offs = k0 // 2 + tl.arange(0, HB)
        b = tl.load(rows + offs[None, :], mask=mask_n[:, None] & (offs[None, :] < WROWB), other=0).to(tl.int32)
        q = tl.reshape(tl.join(b & 0xF, b >> 4), (BLOCK_N, BLOCK_K))  # [.., j, 0/1] -> k = 2j, 2j + 1
    else:
        # BLOCK_K = 16 (8 bytes per row): the join + reshape above gave wrong tiles on sm_90 with triton 3.6
        # (measured: rel err 0.85 for 4-bit, BLOCK_K 16, any split); each k reads its byte and shifts instead
        kk = k0 + tl.arange(0, BLOCK_K)
        b = tl.load(rows + (kk // 2)[None, :], mask=mask_n[:, None] & ((kk // 2)[None, :] < WROWB), other=0)
        q = (b.to(tl.int32) >> ((kk % 2) * 4)[None, :]) & 0xF
    return codes_to_values(q, BITS, ZERO_MODE, s, p, OUT_DTYPE, SCALE)


# Geometry (kernel size, stride, padding, dilation, split count) is a run-time argument: one compiled
# variant serves every layer with the same tiles and format (a ResNet needs a handful of compiles, not one
# per layer); the per-step scalar arithmetic it costs is negligible next to the tile work.
@triton.jit(do_not_specialize=["M", "B", "H", "W", "HO", "WO", "SH", "SW", "PH", "PW", "DH", "DW", "SPLIT_K"])
def _igemm_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    m_ptr,
    bias_ptr,
    out_ptr,
    M,
    B,
    H,
    W,
    HO,
    WO,
    CO,
    CI_G,
    CO_G,
    K,
    WROWB,
    GS,
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
    KH,
    KW,
    SH,
    SW,
    PH,
    PW,
    DH,
    DW,
    SPLIT_K,
    BITS: tl.constexpr,
    PER_CHANNEL: tl.constexpr,
    TAP_LOOP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    USE_WS: tl.constexpr,
    DOT_PREC: tl.constexpr,
    ZERO_MODE: tl.constexpr,
    SCALE_W: tl.constexpr,
    ACT_DTYPE: tl.constexpr,
    SWAP_AB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    grp = tl.program_id(1)
    sk = tl.program_id(2)
    num_pid_n = tl.cdiv(CO_G, BLOCK_N)
    # N fastest: the programs that share one A tile (the large operand) run back to back -> L2 hits.
    pid_n = pid % num_pid_n
    pid_m = pid // num_pid_n

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    bb, oh, ow = out_pixels(offs_m, HO, WO)
    ih0 = oh * SH - PH
    iw0 = ow * SW - PW
    x_base = x_ptr + bb.to(tl.int64) * sxb + (grp * CI_G).to(tl.int64) * sxc

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < CO_G
    n_glob = grp * CO_G + offs_n
    dt = ACT_DTYPE
    if PER_CHANNEL:
        # one group = the whole K: its parameter vectors are loaded once, outside the K loop
        s_raw = tl.load(s_ptr + n_glob, mask=mask_n, other=0.0)
        sc, sh = group_params(s_raw, tl.load(m_ptr + n_glob, mask=mask_n, other=0.0), BITS, ZERO_MODE, dt)
        sc = sc[:, None]
        sh = sh[:, None]
    # SWAP_AB computes out^T = W @ A^T: the dequantized weight (made in registers) is then the left operand,
    # which Hopper's wgmma can read from registers, instead of a round trip through shared memory.
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    steps = tl.cdiv(K, BLOCK_K)
    per = tl.cdiv(steps, SPLIT_K)
    s_lo = sk * per
    s_hi = tl.minimum(s_lo + per, steps)
    offs_kk = tl.arange(0, BLOCK_K)
    cpt = CI_G // BLOCK_K  # K steps per tap (TAP_LOOP)
    if TAP_LOOP:
        # loop-invariant [BLOCK_M, BLOCK_K] pointer tile of tap (0, 0); a step adds one scalar offset to it
        a_base = x_base[:, None] + (ih0 * sxh + iw0 * sxw)[:, None] + offs_kk[None, :].to(tl.int64) * sxc
        # one unsigned compare per bound pair: a negative coordinate wraps to a huge unsigned value
        hu = H.to(tl.uint32, bitcast=True)
        wu = W.to(tl.uint32, bitcast=True)
        # (kh, kw, c0) of the split's first step; later steps advance them as loop-carried counters (the
        # run-time divisions i // cpt, tap // KW cost ~25 instructions each per step on sm_90: I2F / MUFU.RCP / F2I)
        tap = s_lo // cpt
        c0 = (s_lo - tap * cpt) * BLOCK_K
        kh = tap // KW
        kw = tap - kh * KW
    if not PER_CHANNEL:
        g = (s_lo * BLOCK_K) // GS  # quantization group of the current step (loop-carried, no division per step)
        gj = s_lo * BLOCK_K - g * GS
    for i in range(s_lo, s_hi):
        k0 = i * BLOCK_K
        if TAP_LOOP:
            # the whole step lies in one tap: one spatial offset / padding mask per output pixel
            dh = kh * DH
            dw = kw * DW
            ok = (
                mask_m
                & ((ih0 + dh).to(tl.uint32, bitcast=True) < hu)
                & ((iw0 + dw).to(tl.uint32, bitcast=True) < wu)
            )
            a = tl.load(a_base + (dh * sxh + dw * sxw + c0 * sxc).to(tl.int64), mask=ok[:, None], other=0.0)
            c0 += BLOCK_K  # next step: next channel block, or the next tap
            nxt = c0 >= CI_G
            c0 = tl.where(nxt, 0, c0)
            kw = tl.where(nxt, kw + 1, kw)
            nxt = kw >= KW
            kw = tl.where(nxt, 0, kw)
            kh = tl.where(nxt, kh + 1, kh)
        else:
            kk = k0 + offs_kk
            tap = kk // CI_G
            ci = kk - tap * CI_G
            kh = tap // KW
            kw = tap - kh * KW
            ih = ih0[:, None] + (kh * DH)[None, :]
            iw = iw0[:, None] + (kw * DW)[None, :]
            ok = mask_m[:, None] & (kk < K)[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            a = tl.load(x_base[:, None] + ih * sxh + iw * sxw + ci[None, :].to(tl.int64) * sxc, mask=ok, other=0.0)
        if not PER_CHANNEL:
            # BLOCK_K divides the group size: one group per step
            sc, sh = group_params(
                tl.load(s_ptr + g * CO + n_glob, mask=mask_n, other=0.0),
                tl.load(m_ptr + g * CO + n_glob, mask=mask_n, other=0.0),
                BITS,
                ZERO_MODE,
                dt,
            )
            sc = sc[:, None]
            sh = sh[:, None]
            gj += BLOCK_K
            nxg = gj >= GS
            gj = tl.where(nxg, 0, gj)
            g = tl.where(nxg, g + 1, g)
        wt = _weight_tile(
            w_ptr, n_glob, mask_n, k0, WROWB, sc, sh, BITS, ZERO_MODE, dt, SCALE_W, BLOCK_K, BLOCK_N
        )  # [BLOCK_N, BLOCK_K]
        if SWAP_AB:
            acc = tl.dot(wt, tl.trans(a), acc, input_precision=DOT_PREC)
        else:
            acc = tl.dot(a, tl.trans(wt), acc, input_precision=DOT_PREC)

    if SWAP_AB:
        acc = tl.trans(acc)
    if not SCALE_W:
        acc = acc * s_raw[None, :]
    if not USE_WS:
        conv_epilogue(acc, out_ptr, bias_ptr, n_glob, mask_n, bb, oh, ow, mask_m, sob, soc, soh, sow, lo, hi,
                       HAS_BIAS)
    else:
        # workspace [SPLIT_K, M, CO] float32
        o_ptrs = out_ptr + (sk * M).to(tl.int64) * CO + offs_m[:, None].to(tl.int64) * CO + n_glob[None, :]
        tl.store(o_ptrs, acc, mask=mask_m[:, None] & mask_n[None, :])


@triton.jit(do_not_specialize=["M", "HO", "WO"])
def _splitk_reduce_kernel(
    ws_ptr,
    bias_ptr,
    out_ptr,
    M,
    HO,
    WO,
    CO,
    sob,
    soc,
    soh,
    sow,
    lo,
    hi,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < M)[:, None] & (offs_n < CO)[None, :]
    idx = offs_m[:, None].to(tl.int64) * CO + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * M.to(tl.int64) * CO + idx, mask=mask, other=0.0)
    bb, oh, ow = out_pixels(offs_m, HO, WO)
    conv_epilogue(acc, out_ptr, bias_ptr, offs_n, offs_n < CO, bb, oh, ow, offs_m < M, sob, soc, soh, sow, lo, hi,
                   HAS_BIAS)


# --------------------------------------------------------------------------------------------- launch
@dataclass(frozen=True)
class ConvConfig(KernelConfig):
    """The implicit GEMM's tile (Triton constexprs and launch settings: no -D macros); the conv sweep's table entries
    list the fields in this order."""

    block_m: int = knob("BM", "output pixels per program", default=MISSING)
    block_n: int = knob("BN", "output channels per program", default=MISSING)
    block_k: int = knob("BK", "K per step: 16, 32 or 64, dividing the group (one scale per step)", default=MISSING)
    split_k: int = knob("SPLIT_K", "K splits, their fp32 partial sums reduced by _splitk_reduce_kernel", default=1)
    num_warps: int = knob("num_warps", "warps per program", default=4)
    num_stages: int = knob("num_stages", "software pipeline stages of the K loop", default=3)
    swap_ab: bool = knob("SWAP_AB", "the dequantized weights as the MMA's register operand and M as its N (small M)",
                         default=False)


def pick_block_k(ci_g: int, group_size: int, per_channel: bool, k: int) -> tuple[int, bool]:
    """(BLOCK_K, TAP_LOOP). BLOCK_K must divide the quantization group (one scale per step)."""
    limit = 64 if per_channel else min(64, group_size)
    for bk in (64, 32, 16):
        if bk <= limit and ci_g % bk == 0:
            return bk, True
    if not per_channel:  # unreachable for valid QuantizedConvWeight (group | Ci_g, group >= 32)
        raise ValueError(f"group_size={group_size} with Ci_g={ci_g}: no K tile fits; use per-channel")
    return (32 if k >= 32 else 16), False


def _bk_fits(bk: int, ci_g: int, group_size: int, per_channel: bool) -> bool:
    """A K tile inside one tap and one quantization group (TAP_LOOP)."""
    return ci_g % bk == 0 and (per_channel or group_size % bk == 0)


def pick_config(
    m: int, n: int, k: int, ci_g: int, group_size: int, per_channel: bool, groups: int, device
) -> tuple[ConvConfig, bool]:
    """Deterministic tile choice from the problem shape (no run-time autotuning).

    Small M (<= 256, the weight-bound regime): swap_ab (dequantized weights as wgmma's register operand, M as
    the MMA's N dimension so 16..64 rows waste nothing), BLOCK_M the power of two >= M (16..64), BLOCK_N 64 or
    128 and split-K to fill the SMs -- the choices the Triton GEMM's H200 sweep made for M <= 64
    (src/mixgemm/configs/h200.json). Not yet swept for conv itself (see docs/kernels/triton_conv_igemm.md).
    """
    bk, tap_loop = pick_block_k(ci_g, group_size, per_channel, k)
    sms = _num_sms(device)
    if m <= 256:
        bm = min(64, _pow2_at_least(m, 16))
        bn = 128 if n >= 128 else 64
        if triton.cdiv(m, bm) * triton.cdiv(n, bn) * groups < sms // 2:
            bn = 64  # more programs before splitting K
        split = auto_split(m, n, k, bm, bn, bk, groups, sms)
        return ConvConfig(bm, bn, bk, split, 4, 4 if bm <= 32 else 3, swap_ab=True), tap_loop
    bn = 128 if n >= 128 else _pow2_at_least(n, 16)
    bm = 128 if m >= 4096 else 64
    # 4 warps even for 128 x 128 tiles: measured on the H200 (docs/kernels/triton_conv_igemm.md), 8 warps
    # were 15-40% slower on every batch-32 layer (more CTAs per SM hide the in-register dequantization better)
    split = auto_split(m, n, k, bm, bn, bk, groups, sms)
    return ConvConfig(bm, bn, bk, split, 4, 3 if bk == 64 else 4), tap_loop


def tuned_choice(device, qw: QuantizedConvWeight, stride, groups: int, m: int) -> tuple[str, ConvConfig | None] | None:
    """The measured (path, config) for this layer on this GPU from conv_table (None: not measured here).
    path "igemm" comes with its ConvConfig, "matmul" (1x1 through the shared GEMM) with None."""
    from mixgemm.tuning import conv_table

    hit = conv_table.lookup(_gpu_name(device), conv_table.layer_key(qw, stride, groups, m))
    if hit is None:
        return None
    path, cfg = hit
    return path, (None if cfg is None else ConvConfig(*cfg))


def default_config(device, qw: QuantizedConvWeight, stride, groups: int, m: int) -> tuple[ConvConfig, bool]:
    """(config, TAP_LOOP) the implicit GEMM uses without a forced config: the measured table's entry for this
    layer on this GPU when it has one (and its K tile fits), else pick_config's heuristic."""
    q = qw.matrix
    kh, kw = qw.kernel_size
    ci_g = qw.in_channels_per_group
    per_channel = q.num_groups == 1
    tuned = tuned_choice(device, qw, stride, groups, m)
    if tuned is not None and tuned[1] is not None and _bk_fits(tuned[1].block_k, ci_g, q.group_size, per_channel):
        return tuned[1], True
    return pick_config(m, qw.out_channels // groups, kh * kw * ci_g, ci_g, q.group_size, per_channel, groups, device)


def auto_split(m: int, n: int, k: int, bm: int, bn: int, bk: int, groups: int, sms: int) -> int:
    """Split-K factor: enough programs for ~2 waves when the output tiles alone leave SMs idle, keeping at
    least 4 K steps per split (the partial sums cost an extra fp32 round trip)."""
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn) * groups
    steps = triton.cdiv(k, bk)
    if tiles >= sms or steps < 8:
        return 1
    return max(1, min(triton.cdiv(2 * sms, tiles), steps // 4, 16))


def igemm_conv2d(
    x: torch.Tensor,
    qw: QuantizedConvWeight,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
    lo: float,
    hi: float,
    config: ConvConfig | None = None,
) -> torch.Tensor:
    """Implicit-GEMM conv into ``out`` ([B, Co, Ho, Wo], any strides, x.dtype); args checked by the caller."""
    lay = conv_layout(qw.matrix)
    b, _, h, w = x.shape
    _, co, ho, wo = out.shape
    kh, kw = qw.kernel_size
    ci_g = qw.in_channels_per_group
    co_g = co // groups
    m = b * ho * wo
    k = kh * kw * ci_g
    per_channel = lay.num_groups == 1
    if config is None:
        config, tap_loop = default_config(x.device, qw, stride, groups, m)
    else:
        bk_ok = _bk_fits(config.block_k, ci_g, lay.group_size, per_channel)
        if not per_channel and not bk_ok:
            raise ValueError(f"config.block_k={config.block_k} must divide Ci_g={ci_g} and the group size")
        tap_loop = bk_ok
    bias_t = bias if bias is not None else lay.scale
    split = config.split_k
    if split > 1:
        dst = torch.empty((split, m, co), device=x.device, dtype=torch.float32)
        dsb = (0, 0, 0, 0)
    else:
        dst = out
        dsb = out.stride()
    grid = (triton.cdiv(m, config.block_m) * triton.cdiv(co_g, config.block_n), groups, split)
    _igemm_kernel[grid](
        x,
        lay.weight.view(torch.uint8),  # the same memory as bytes (see _weight_tile)
        lay.scale,
        lay.shift,
        bias_t,
        dst,
        m,
        b,
        h,
        w,
        ho,
        wo,
        co,
        ci_g,
        co_g,
        k,
        lay.weight.shape[1] * 4,
        lay.group_size,
        *x.stride(),
        *dsb,
        lo,
        hi,
        kh,
        kw,
        stride[0],
        stride[1],
        padding[0],
        padding[1],
        dilation[0],
        dilation[1],
        split,
        BITS=lay.bits,
        PER_CHANNEL=per_channel,
        TAP_LOOP=tap_loop,
        HAS_BIAS=bias is not None,
        USE_WS=split > 1,
        DOT_PREC=_dot_prec(x.dtype),
        ZERO_MODE=lay.zero_mode,
        SCALE_W=lay.scale_in_tile,
        ACT_DTYPE=_TL_DTYPES[x.dtype],
        SWAP_AB=config.swap_ab,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if split > 1:
        rbm, rbn = 32, min(128, _pow2_at_least(co, 16))
        _splitk_reduce_kernel[(triton.cdiv(m, rbm), triton.cdiv(co, rbn))](
            dst,
            bias_t,
            out,
            m,
            ho,
            wo,
            co,
            *out.stride(),
            lo,
            hi,
            SPLIT_K=split,
            HAS_BIAS=bias is not None,
            BLOCK_M=rbm,
            BLOCK_N=rbn,
            num_warps=4,
        )
    return out
