"""Fused per-token, per-block int8 activation quantization (Triton), one kernel launch.

Produces, for x [M, K] (fp16 / bf16 / fp32, unit stride along K) and a block size B along K:

* q:       int8 [M, K]
* scales:  float32 [M, G]   (G = K // B)
* offsets: float32 [M, G]   (zeros for "sym")
* sums:    int32 [M, G]     (sum of q over each block: the seeds' sum_A_q, q8_1's s = d * sum)

exactly as :func:`mixgemm.formats.activation.quantize_activation` (codes and sums bit-identical, scales and
offsets the same float32 values): every float op is a single IEEE-rounded float32 op in the same order as
the reference ("sym_full" rounds its scale and quotients to the activation's dtype, _to_xt, as the reference
does). On the GPU that needs care, hence the helpers below:

* ``a / b`` in Triton lowers to the approximate ``div.full.f32``; we call ``div_rn`` (IEEE) instead.
* NVPTX contracts ``a * b + c`` into one FMA (one rounding instead of two); ``mul_rn`` is never contracted.
* round-half-to-even (torch.round) is ``rint`` (cvt.rni) on the GPU; the interpreter lacks libdevice, so
  there we use the 1.5 * 2**23 trick (exact for |y| < 2**22; our |y| <= 255.5).

Two kernels: short blocks are quantized a tile of whole blocks at a time (one read of x); long blocks
(per-channel over a long K) are walked in chunks twice per row (the second read hits L2). Where the
switch lies is LONG_BLOCK below (measured: holding a 28672-element row in registers was slower).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from mixgemm.formats.activation import ACT_MODES

# The kernels' MODE (formats.activation's schemes) and XT (the activation dtype "sym_full" rounds to)
_MODE = {"sym": 0, "asym": 1, "sym_full": 2}
_XT = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
# Long-block policy: blocks up to MAX_TILE_BLOCK elements are held whole in registers (one read of x);
# longer ones take the two-pass row kernel with ROW_CH-element chunks and ROW_WARPS warps.
# Tuned by tools/bench/int8.py (act-quant variants), see docs/kernels/triton_a8.md.
LONG_BLOCK = {"MAX_TILE_BLOCK": 4096, "ROW_CH": 8192, "ROW_WARPS": 8}


@triton.jit
def _div(a, b, GPU: tl.constexpr):
    if GPU:
        return libdevice.div_rn(a, b)  # IEEE division: Triton's '/' is the approximate div.full.f32
    else:
        return a / b


@triton.jit
def _mul(a, b, GPU: tl.constexpr):
    if GPU:
        return libdevice.mul_rn(a, b)  # never fused into an FMA with a following add
    else:
        return a * b


@triton.jit
def _rint(y, GPU: tl.constexpr):
    if GPU:
        return libdevice.rint(y)  # round half to even, like torch.round
    else:
        return (y + 12582912.0) - 12582912.0  # 1.5 * 2**23: float32 add rounds half-to-even at integers


@triton.jit
def _to_xt(v, XT: tl.constexpr, GPU: tl.constexpr):
    """float32 v (finite) rounded to nearest even in the activation dtype XT (0 fp16, 1 bf16, 2 fp32), as float32."""
    if XT == 0:
        return v.to(tl.float16, fp_downcast_rounding="rtne").to(tl.float32)
    elif XT == 1:
        if GPU:
            return v.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
        else:  # the interpreter's float32 -> bfloat16 truncates: round the bits (half to even) instead
            b = v.to(tl.uint32, bitcast=True)
            b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
            return b.to(tl.float32, bitcast=True)
    else:
        return v


@triton.jit
def _full_scale(amax, XT: tl.constexpr, GPU: tl.constexpr):
    """"sym_full": d = amax / 127.5 in the activation dtype, and the divisor x / d takes (1 where d == 0)."""
    d = _to_xt(_div(amax, 127.5, GPU), XT, GPU)
    return d, tl.where(d > 0, d, 1.0)


@triton.jit
def _full_codes(x, d, div, XT: tl.constexpr, GPU: tl.constexpr):
    """"sym_full" codes: round(clamp(x / d, -128, 127)), x / d in the activation dtype; 0 where d == 0."""
    q = _rint(tl.minimum(tl.maximum(_to_xt(_div(x, div, GPU), XT, GPU), -128.0), 127.0), GPU)
    return tl.where(d > 0, q, 0.0)


@triton.jit
def _quant_tile(x, mask, MODE: tl.constexpr, XT: tl.constexpr, GPU: tl.constexpr):
    """x: float32 [R, B] tile of R whole blocks (masked entries ignored). Returns (q int8, d, o, sum)."""
    if MODE == 2:
        amax = tl.max(tl.where(mask, tl.abs(x), 0.0), axis=1)
        d, div = _full_scale(amax, XT, GPU)
        q = _full_codes(x, d[:, None], div[:, None], XT, GPU)
        o = tl.zeros_like(d)
    elif MODE == 0:
        amax = tl.max(tl.where(mask, tl.abs(x), 0.0), axis=1)
        d = _div(amax, 127.0, GPU)
        pos = d > 0
        inv = tl.where(pos, _div(1.0, tl.where(pos, d, 1.0), GPU), 0.0)
        q = _rint(_mul(x, inv[:, None], GPU), GPU)
        q = tl.minimum(tl.maximum(q, -127.0), 127.0)
        o = tl.zeros_like(d)
    else:
        lo = tl.min(tl.where(mask, x, float("inf")), axis=1)
        hi = tl.max(tl.where(mask, x, -float("inf")), axis=1)
        d = _div(hi - lo, 255.0, GPU)
        pos = d > 0
        o = tl.where(pos, hi - _mul(127.0, d, GPU), hi)  # constant block: o = max, q = 0
        d = tl.where(pos, d, 1.0)
        q = _rint(_div(x - o[:, None], d[:, None], GPU), GPU)
        q = tl.minimum(tl.maximum(q, -128.0), 127.0)
    q = tl.where(mask, q, 0.0)
    s = tl.sum(q.to(tl.int32), axis=1)
    return q.to(tl.int8), d, o, s


@triton.jit
def _act_quant_tile_kernel(x_ptr, q_ptr, s_ptr, o_ptr, sum_ptr, K, G, stride_xm, stride_qm,
                           B: tl.constexpr, BP: tl.constexpr, R: tl.constexpr,
                           MODE: tl.constexpr, XT: tl.constexpr, GPU: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    g0 = tl.program_id(1) * R
    rg = g0 + tl.arange(0, R)
    rb = tl.arange(0, BP)
    cols = rg[:, None] * B + rb[None, :]
    mask = (rg[:, None] < G) & (rb[None, :] < B)
    x = tl.load(x_ptr + m * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    q, d, o, s = _quant_tile(x, mask, MODE, XT, GPU)
    tl.store(q_ptr + m * stride_qm + cols, q, mask=mask)
    gm = rg < G
    tl.store(s_ptr + m * G + rg, d, mask=gm)
    tl.store(o_ptr + m * G + rg, o, mask=gm)
    tl.store(sum_ptr + m * G + rg, s, mask=gm)


@triton.jit
def _act_quant_row_kernel(x_ptr, q_ptr, s_ptr, o_ptr, sum_ptr, K, G, B, stride_xm, stride_qm,
                          CH: tl.constexpr, MODE: tl.constexpr, XT: tl.constexpr, GPU: tl.constexpr):
    """One (row, block) per program for long blocks: pass 1 finds the range, pass 2 writes codes + sum."""
    m = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    base = g * B
    rc = tl.arange(0, CH)
    amax = tl.zeros([CH], dtype=tl.float32)
    lo = tl.full([CH], float("inf"), tl.float32)
    hi = tl.full([CH], -float("inf"), tl.float32)
    for k0 in range(0, B, CH):
        msk = (k0 + rc) < B
        x = tl.load(x_ptr + m * stride_xm + base + k0 + rc, mask=msk, other=0.0).to(tl.float32)
        if MODE != 1:
            amax = tl.maximum(amax, tl.where(msk, tl.abs(x), 0.0))
        else:
            lo = tl.minimum(lo, tl.where(msk, x, float("inf")))
            hi = tl.maximum(hi, tl.where(msk, x, -float("inf")))
    # max / min are exact, so the chunked reduction equals the reference's whole-block amax / amin.
    if MODE == 2:
        d, inv = _full_scale(tl.max(amax, axis=0), XT, GPU)  # (inv: the divisor)
        o = d * 0.0
    elif MODE == 0:
        d = _div(tl.max(amax, axis=0), 127.0, GPU)
        inv = tl.where(d > 0, _div(1.0, tl.where(d > 0, d, 1.0), GPU), 0.0)
        o = d * 0.0
    else:
        lo_s = tl.min(lo, axis=0)
        hi_s = tl.max(hi, axis=0)
        d = _div(hi_s - lo_s, 255.0, GPU)
        o = tl.where(d > 0, hi_s - _mul(127.0, d, GPU), hi_s)
        d = tl.where(d > 0, d, 1.0)
        inv = d
    acc = tl.zeros([CH], dtype=tl.int32)
    for k0 in range(0, B, CH):
        msk = (k0 + rc) < B
        x = tl.load(x_ptr + m * stride_xm + base + k0 + rc, mask=msk, other=0.0).to(tl.float32)
        if MODE == 2:
            q = _full_codes(x, d, inv, XT, GPU)
        elif MODE == 0:
            q = _rint(_mul(x, inv, GPU), GPU)
            q = tl.minimum(tl.maximum(q, -127.0), 127.0)
        else:
            q = _rint(_div(x - o, d, GPU), GPU)
            q = tl.minimum(tl.maximum(q, -128.0), 127.0)
        q = tl.where(msk, q, 0.0)
        acc += q.to(tl.int32)
        tl.store(q_ptr + m * stride_qm + base + k0 + rc, q.to(tl.int8), mask=msk)
    tl.store(s_ptr + m * G + g, d)
    tl.store(o_ptr + m * G + g, o)
    tl.store(sum_ptr + m * G + g, tl.sum(acc, axis=0))


def act_quant(x: torch.Tensor, block_size: int = -1, mode: str = "sym", out=None):
    """Quantize x [M, K] (fp16 / bf16 / fp32, CUDA or interpreter, unit stride along K) per token and per
    block of ``block_size`` along K (-1: whole K). mode: one of formats.activation.ACT_MODES.

    Returns (q int8 [M, K], scales f32 [M, G], offsets f32 [M, G], sums int32 [M, G]); equal to
    mixgemm.formats.activation.quantize_activation. ``out``: optional preallocated 4-tuple of the same.
    """
    if mode not in ACT_MODES:
        raise ValueError(f"activation quantization mode must be one of {ACT_MODES}, got {mode!r}")
    if x.dim() != 2:
        raise ValueError(f"activations must be 2-D [M, K], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"activations must be fp16/bf16/fp32, got {x.dtype}")
    m, k = x.shape
    b = k if block_size in (-1, None) else int(block_size)
    if b <= 0 or k % b:
        raise ValueError(f"K={k} is not divisible by the activation block size {b}")
    if x.stride(1) != 1:
        x = x.contiguous()
    g = k // b
    if out is None:
        dev = x.device
        out = (torch.empty((m, k), dtype=torch.int8, device=dev),
               torch.empty((m, g), dtype=torch.float32, device=dev),
               torch.empty((m, g), dtype=torch.float32, device=dev),
               torch.empty((m, g), dtype=torch.int32, device=dev))
    q, s, o, sm = out
    if m == 0:
        return out
    mode_id, xt = _MODE[mode], _XT[x.dtype]
    gpu = not _INTERPRET
    bp = triton.next_power_of_2(b)
    if bp <= LONG_BLOCK["MAX_TILE_BLOCK"]:
        # ~2-4K elements per program: enough bytes in flight, few registers per thread.
        r = max(1, min(triton.next_power_of_2(g), 2048 // bp))
        nw = min(16, max(4, r * bp // 512))  # <= 64 elements per thread
        _act_quant_tile_kernel[(m, triton.cdiv(g, r))](
            x, q, s, o, sm, k, g, x.stride(0), q.stride(0),
            B=b, BP=bp, R=r, MODE=mode_id, XT=xt, GPU=gpu, num_warps=nw)
    else:
        _act_quant_row_kernel[(m, g)](x, q, s, o, sm, k, g, b, x.stride(0), q.stride(0),
                                      CH=LONG_BLOCK["ROW_CH"], MODE=mode_id, XT=xt, GPU=gpu,
                                      num_warps=LONG_BLOCK["ROW_WARPS"])
    return out
