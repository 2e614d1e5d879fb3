"""Integer tensor-core GEMMs for quantized activations (Triton): W8A8 / W4A8 block-wise and static INT8.

C[m, n] = sum over K-blocks i of  sA sB Cq_i + sA mB sum(qA_i) + oA sB sum(cB_i) + g oA mB

with A = qA sA + oA per (token, block), B = cB sB + mB per (channel, block) (int8_v1's signed codes, layout.py).
One kernel: int8 x int8 -> int32 ``tl.dot`` inside each K-block, folded into an fp32 accumulator with
sA*sB and the offset terms inside the K loop (the seeds' GEMM-launch + atomic dequant per block is the
reference, mixgemm.reference.block_int_gemm, not the design). The weight-side constants (s, m, and
s*sum(c) + g*m) come precomputed from the layout.

* per-channel weights with per-token activations (one block = all K): pure int32 accumulation over K and
  a single scale in the epilogue: the fast W8A8 path (|acc| <= K * 128 * 128 < 2**31 for K < 131072).
* group g (32..256): BLOCK_K divides g; each K-step's int32 partial is scaled by sA*sB and added to the
  fp32 accumulator; the offset terms are added once per group (at its first K-step).
* int4: the half-split layout turns a [H, BN] byte tile into two int8 tiles by arithmetic shifts,
  multiplied by the two contiguous halves of the activation tile (two dots, no shuffles).
* static INT8 output (MNN ConvInt8): y = clamp(rint(float(acc + fused_bias) * Mq) + zO) per channel.

Loads wrap out-of-range rows / columns (index modulo M / N) instead of masking: the loop stays mask-free
(better pipelining) and the wrapped rows are never stored.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from mixgemm.kernels.triton.act_quant import _mul, _rint
from mixgemm.kernels.triton_a8.int8_gemm_config import Int8GemmConfig

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _unpack4(p, ASM: tl.constexpr):
    """int8 tile of half-split bytes -> (16 * low codes, 16 * high codes) as int8 tiles.
    A signed nibble moved to the top of a byte reads as 16 * code: no sign extension; the 16 is folded
    into the layout's dot_scales (s / 16). ASM (GPU only): the same on four bytes per 32-bit register
    (pack=4), 2 + 1 instructions per 8 weights instead of one per byte."""
    if ASM:
        lo = tl.inline_asm_elementwise("{ .reg .b32 t; shl.b32 t, $1, 4; and.b32 $0, t, 0xF0F0F0F0; }",
                                       "=r,r", [p], dtype=tl.int8, is_pure=True, pack=4)
        hi = tl.inline_asm_elementwise("and.b32 $0, $1, 0xF0F0F0F0;", "=r,r", [p], dtype=tl.int8,
                                       is_pure=True, pack=4)
        return lo, hi
    else:
        return (p << 4).to(tl.int8), (p & -16).to(tl.int8)  # explicit casts: literals may promote to int32


@triton.jit
def _load_b4(b_ptrs, ASM: tl.constexpr):
    """[H, BN] bytes of the half-split int4 layout -> (16 * low codes, 16 * high codes)."""
    return _unpack4(tl.load(b_ptrs), ASM)


@triton.jit
def _i2f(x):
    """int32 -> float32, exact for |x| < 2**22 (a K-step's partial: <= 128 * 128 * 128 = 2**21).
    Why: cvt.rn.f32.s32 issues at 1/8 of the FP32 rate on sm_80/sm_90; an integer add into the mantissa
    of 1.5 * 2**23 plus one float subtraction run at full rate."""
    return (x + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0


@triton.jit
def _group_terms(acc, gi, rm_c, rn_c, G, N, sa_ptr, oa_ptr, suma_ptr, mb_ptr, cb_ptr, f,
                 A_ASYM: tl.constexpr, B_OFF: tl.constexpr):
    """acc += f * (sA sum(qA) mB + oA (sB sum(cB) + g mB)) for group gi (f = 1.0 at a group's first step)."""
    if B_OFF:
        sa = tl.load(sa_ptr + rm_c * G + gi)
        sua = tl.load(suma_ptr + rm_c * G + gi).to(tl.float32)
        mb = tl.load(mb_ptr + gi * N + rn_c)
        acc += (sa * sua * f)[:, None] * mb[None, :]
    if A_ASYM:
        oa = tl.load(oa_ptr + rm_c * G + gi)
        cb = tl.load(cb_ptr + gi * N + rn_c)
        acc += (oa * f)[:, None] * cb[None, :]
    return acc


@triton.jit
def _scale_fold(acc, part, gi, rm_c, rn_c, G, N, sa_ptr, sb_ptr, FAST_CVT: tl.constexpr):
    sa = tl.load(sa_ptr + rm_c * G + gi)
    sb = tl.load(sb_ptr + gi * N + rn_c)
    if FAST_CVT:
        pf = _i2f(part)
    else:
        pf = part.to(tl.float32)
    return acc + pf * (sa[:, None] * sb[None, :])


@triton.jit
def _a8_gemm_kernel(
    a_ptr, sa_ptr, oa_ptr, suma_ptr,
    b_ptr, sb_ptr, mb_ptr, cb_ptr,
    bias_ptr, c_ptr, fb_ptr, mq_ptr, ws_ptr,
    M, N, K, G, GS, KSPLIT,
    stride_am, stride_bn, stride_cm,
    lo, hi, zo,
    BITS: tl.constexpr, H: tl.constexpr, PER_CHANNEL: tl.constexpr, TWO_GROUPS: tl.constexpr,
    A_ASYM: tl.constexpr, B_OFF: tl.constexpr, HAS_BIAS: tl.constexpr, STATIC_OUT: tl.constexpr,
    EVEN_K: tl.constexpr, GPU: tl.constexpr, SPLIT: tl.constexpr, ASM: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    # Grouped launch order: GROUP_M row-tiles share each weight column-tile while it is in L2.
    width = GROUP_M * num_pid_n
    first_m = (pid // width) * GROUP_M
    gm = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % gm
    pid_n = (pid % width) // gm
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rm_c = (rm % M).to(tl.int64)
    rn_c = rn % N
    if BITS == 8:
        rk = tl.arange(0, BK)
        a_ptrs = a_ptr + rm_c[:, None] * stride_am + rk[None, :]
        b_ptrs = b_ptr + rn_c.to(tl.int64)[None, :] * stride_bn + rk[:, None]
    else:
        rh = tl.arange(0, H)
        a_ptrs = a_ptr + rm_c[:, None] * stride_am + rh[None, :]
        b_ptrs = b_ptr + rn_c.to(tl.int64)[None, :] * stride_bn + rh[:, None]
    # split-K (small M): program (., pid_k) covers K range [k_lo, k_hi), a whole number of groups
    pid_k = tl.program_id(1)
    k_lo = pid_k * KSPLIT
    k_hi = tl.minimum(K, k_lo + KSPLIT)
    a_ptrs += k_lo
    b_ptrs += k_lo // (8 // BITS)
    first = (pid_k == 0).to(tl.float32)  # per-channel offset terms: added by split 0 only

    if PER_CHANNEL:
        acc_i = tl.zeros([BM, BN], dtype=tl.int32)
        for k0 in range(k_lo, k_hi, BK):
            if BITS == 8:
                if EVEN_K:
                    a = tl.load(a_ptrs)
                    b = tl.load(b_ptrs)
                else:
                    a = tl.load(a_ptrs, mask=(k0 + rk)[None, :] < K, other=0)
                    b = tl.load(b_ptrs, mask=(k0 + rk)[:, None] < K, other=0)
                acc_i = tl.dot(a, b, acc_i, out_dtype=tl.int32)
            else:
                b_lo, b_hi = _load_b4(b_ptrs, ASM)
                acc_i = tl.dot(tl.load(a_ptrs), b_lo, acc_i, out_dtype=tl.int32)
                acc_i = tl.dot(tl.load(a_ptrs + H), b_hi, acc_i, out_dtype=tl.int32)
            a_ptrs += BK
            b_ptrs += BK // (8 // BITS)
        if STATIC_OUT:
            fb = tl.load(fb_ptr + rn_c)
            mq = tl.load(mq_ptr + rn_c)
            y = _mul((acc_i + fb[None, :]).to(tl.float32), mq[None, :], GPU)
            y = _rint(y, GPU) + zo
            y = tl.minimum(tl.maximum(y, lo), hi)
            out = y.to(tl.int8)
        else:
            acc = tl.zeros([BM, BN], dtype=tl.float32)
            acc = _scale_fold(acc, acc_i, 0, rm_c, rn_c, G, N, sa_ptr, sb_ptr, False)
            if A_ASYM or B_OFF:
                acc = _group_terms(acc, 0, rm_c, rn_c, G, N, sa_ptr, oa_ptr, suma_ptr, mb_ptr, cb_ptr, first,
                                   A_ASYM, B_OFF)
    else:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BK):
            gi = k0 // GS
            if BITS == 8:
                part = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), out_dtype=tl.int32)
                acc = _scale_fold(acc, part, gi, rm_c, rn_c, G, N, sa_ptr, sb_ptr, True)
                if A_ASYM or B_OFF:
                    f = ((k0 % GS) == 0).to(tl.float32)
                    acc = _group_terms(acc, gi, rm_c, rn_c, G, N, sa_ptr, oa_ptr, suma_ptr, mb_ptr, cb_ptr,
                                       f, A_ASYM, B_OFF)
            else:
                b_lo, b_hi = _load_b4(b_ptrs, ASM)
                if TWO_GROUPS:  # H == group size: the two halves are groups gi and gi + 1
                    p0 = tl.dot(tl.load(a_ptrs), b_lo, out_dtype=tl.int32)
                    p1 = tl.dot(tl.load(a_ptrs + H), b_hi, out_dtype=tl.int32)
                    acc = _scale_fold(acc, p0, gi, rm_c, rn_c, G, N, sa_ptr, sb_ptr, True)
                    acc = _scale_fold(acc, p1, gi + 1, rm_c, rn_c, G, N, sa_ptr, sb_ptr, True)
                    if A_ASYM or B_OFF:
                        acc = _group_terms(acc, gi, rm_c, rn_c, G, N, sa_ptr, oa_ptr, suma_ptr, mb_ptr, cb_ptr,
                                           1.0, A_ASYM, B_OFF)
                        acc = _group_terms(acc, gi + 1, rm_c, rn_c, G, N, sa_ptr, oa_ptr, suma_ptr, mb_ptr,
                                           cb_ptr, 1.0, A_ASYM, B_OFF)
                else:
                    part = tl.dot(tl.load(a_ptrs), b_lo, out_dtype=tl.int32)
                    part = tl.dot(tl.load(a_ptrs + H), b_hi, part, out_dtype=tl.int32)
                    acc = _scale_fold(acc, part, gi, rm_c, rn_c, G, N, sa_ptr, sb_ptr, True)
                    if A_ASYM or B_OFF:
                        f = ((k0 % GS) == 0).to(tl.float32)
                        acc = _group_terms(acc, gi, rm_c, rn_c, G, N, sa_ptr, oa_ptr, suma_ptr, mb_ptr, cb_ptr,
                                           f, A_ASYM, B_OFF)
            a_ptrs += BK
            b_ptrs += BK // (8 // BITS)
    if SPLIT:  # fp32 partial sums; _splitk_reduce adds the splits, bias and clamp
        w_ptrs = ws_ptr + (pid_k * M + rm.to(tl.int64))[:, None] * N + rn[None, :]
        tl.store(w_ptrs, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
    else:
        if not STATIC_OUT:
            if HAS_BIAS:
                acc += tl.load(bias_ptr + rn_c).to(tl.float32)[None, :]
            acc = tl.minimum(tl.maximum(acc, lo), hi)
            out = acc.to(c_ptr.dtype.element_ty)
        c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :]
        tl.store(c_ptrs, out, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _w8a8_tma_kernel(a_desc, b_desc, sa_ptr, sb_ptr, bias_ptr, c_ptr, M, N, K, stride_cm, lo, hi,
                     HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr):
    """Per-channel W8A8 with TMA loads (Hopper), persistent over output tiles: the acceptance fast path."""
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    num_tiles = num_pid_m * num_pid_n
    width = GROUP_M * num_pid_n
    for tile in tl.range(start, num_tiles, NUM_SMS, flatten=True):
        first_m = (tile // width) * GROUP_M
        gm = tl.minimum(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + (tile % width) % gm
        pid_n = (tile % width) // gm
        off_m = pid_m * BM
        off_n = pid_n * BN
        acc = tl.zeros([BM, BN], dtype=tl.int32)
        for k0 in range(0, K, BK):
            a = a_desc.load([off_m, k0])  # TMA: OOB rows / k are zero-filled by the hardware
            b = b_desc.load([off_n, k0])
            acc = tl.dot(a, b.T, acc, out_dtype=tl.int32)
        rm = off_m + tl.arange(0, BM)
        rn = off_n + tl.arange(0, BN)
        sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)
        sb = tl.load(sb_ptr + rn, mask=rn < N, other=0.0)
        y = acc.to(tl.float32) * (sa[:, None] * sb[None, :])
        if HAS_BIAS:
            y += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        y = tl.minimum(tl.maximum(y, lo), hi)
        c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :]
        tl.store(c_ptrs, y.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _splitk_reduce(ws_ptr, bias_ptr, c_ptr, M, N, S, stride_cm, lo, hi, HAS_BIAS: tl.constexpr,
                   BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, S):
        acc += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0)
    n = offs % N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=mask, other=0.0).to(tl.float32)
    acc = tl.minimum(tl.maximum(acc, lo), hi)
    tl.store(c_ptr + (offs // N) * stride_cm + n, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _grouped_tma_kernel(a_desc, b_desc, sa_ptr, sb_ptr, bias_ptr, c_ptr, M, N, K, G, GS, stride_cm, lo, hi,
                        BITS: tl.constexpr, H: tl.constexpr, HAS_BIAS: tl.constexpr, LAG: tl.constexpr,
                        ASM: tl.constexpr,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    """Group-wise W8A8 / W4A8 with sym activations and sym weights (no offset terms), TMA loads.
    LAG=1 folds the previous K-step's partial after issuing the current step's MMA, so the fold's CUDA-core
    work can overlap the asynchronous tensor-core work (software pipelining by hand)."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    width = GROUP_M * num_pid_n
    first_m = (pid // width) * GROUP_M
    gm = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % gm
    pid_n = (pid % width) // gm
    off_m = pid_m * BM
    off_n = pid_n * BN
    rm_c = ((off_m + tl.arange(0, BM)) % M).to(tl.int64)
    rn_c = (off_n + tl.arange(0, BN)) % N
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    prev = tl.zeros([BM, BN], dtype=tl.int32)
    g_prev = K * 0  # an int32 scalar like k0 // GS (loop-carried types must not change)
    for k0 in range(0, K, BK):
        if BITS == 8:
            part = tl.dot(a_desc.load([off_m, k0]), b_desc.load([off_n, k0]).T, out_dtype=tl.int32)
        else:
            b_lo, b_hi = _unpack4(b_desc.load([off_n, k0 // 2]), ASM)  # 16 * codes (see _unpack4)
            part = tl.dot(a_desc.load([off_m, k0]), b_lo.T, out_dtype=tl.int32)
            part = tl.dot(a_desc.load([off_m, k0 + H]), b_hi.T, part, out_dtype=tl.int32)
        if LAG:
            acc = _scale_fold(acc, prev, g_prev, rm_c, rn_c, G, N, sa_ptr, sb_ptr, True)
            prev = part
            g_prev = k0 // GS
        else:
            acc = _scale_fold(acc, part, k0 // GS, rm_c, rn_c, G, N, sa_ptr, sb_ptr, True)
    if LAG:
        acc = _scale_fold(acc, prev, g_prev, rm_c, rn_c, G, N, sa_ptr, sb_ptr, True)
    rm = off_m + tl.arange(0, BM)
    rn = off_n + tl.arange(0, BN)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn_c).to(tl.float32)[None, :]
    acc = tl.minimum(tl.maximum(acc, lo), hi)
    c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


# ---------------------------------------------------------------------------------------------------------
# Host side

_NUM_SMS: dict = {}


def _num_sms(device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _NUM_SMS:
        _NUM_SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _NUM_SMS[idx]


# Chosen from the sweeps in tools/bench/int8.py (H200, triton 3.6; see docs/kernels/triton_a8.md).
SMALL_M_CTAS_PER_SM = 6


def pick_config(m: int, n: int, k: int, bits: int, group: int, per_channel: bool, half: int = 0,
                num_sms: int = 132) -> dict:
    """Tile configuration (deterministic: same problem -> same config). BK divides the group (grouped)
    and is 2H for int4. TMA keys only take effect for sym activations x sym weights on the GPU (other
    modes run the pointer kernel with the same tiles); ASM only on the GPU."""
    if bits == 4:
        bk = 2 * half
    elif per_channel:
        bk = 128
    else:
        bk = min(group, 128)
    asm = bits == 4  # inline-asm nibble unpack (measured 5-15% faster at every M)
    if m <= 16:
        # GEMV regime (mul_mat_vec_q analogue): one 16-row MMA tile; split K over whole groups so that
        # every SM streams weights from several CTAs (memory-bound: bytes in flight matter, not MMA rate)
        if bits == 8 and per_channel:
            bn, bk = 128, 256
        else:
            bn = 64
        tiles = triton.cdiv(n, bn)
        unit = bk if per_channel else max(bk, group)
        split = max(1, min(k // unit, triton.cdiv(SMALL_M_CTAS_PER_SM * num_sms, tiles)))
        if bits == 8:
            split = min(split, 4)
        return dict(BM=16, BN=bn, BK=bk, GROUP_M=1, num_warps=4, num_stages=4, SPLIT_K=split, ASM=asm)
    if m <= 64:
        return dict(BM=64, BN=128, BK=bk, GROUP_M=8, num_warps=4, num_stages=4, ASM=asm)
    if per_channel and bits == 8:
        return dict(BM=256, BN=128, BK=bk, GROUP_M=8, num_warps=8, num_stages=3, TMA=True)
    # group-wise: one warpgroup per CTA so several CTAs share an SM and one's per-group fold (CUDA cores)
    # overlaps another's MMA (measured 1.3x over 128x128 / 8 warps)
    return dict(BM=64, BN=128, BK=bk, GROUP_M=8, num_warps=4, num_stages=4, TMA=True, LAG=False, ASM=asm)


def a8_gemm(aq, sa, oa, suma, lay, act_asym: bool, bias, lo: float, hi: float, out_dtype, config=None,
            out=None):
    """C [M, N] (out_dtype) from quantized activations (act_quant's four tensors, block = lay.group_size)
    and an Int8Layout. bias: float [N] or None. lo/hi: output clamp. config: optional tile override
    (keys BM BN BK GROUP_M num_warps num_stages, optional TMA / LAG / SPLIT_K)."""
    m, k = aq.shape
    n = lay.n
    if k != lay.k:
        raise ValueError(f"shape mismatch: activations K={k}, weight K={lay.k}")
    per_channel = lay.num_groups == 1
    cfg = dict(config) if config else pick_config(m, n, k, lay.bits, lay.group_size, per_channel, lay.half)
    Int8GemmConfig.from_dict(cfg)  # (an error naming a key the kernel does not have)
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=aq.device)
    if m == 0:
        return out
    tma = cfg.pop("TMA", False)
    lag = cfg.pop("LAG", None)
    split = cfg.pop("SPLIT_K", 1)
    asm = bool(cfg.pop("ASM", False)) and not _INTERPRET
    plain = not act_asym and not lay.has_offset and k % 16 == 0 and not _INTERPRET
    if tma and plain and per_channel and lay.bits == 8:
        from triton.tools.tensor_descriptor import TensorDescriptor

        bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
        a_desc = TensorDescriptor.from_tensor(aq, [bm, bk])
        b_desc = TensorDescriptor.from_tensor(lay.codes, [bn, bk])
        nsm = _num_sms(aq.device)
        tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
        _w8a8_tma_kernel[(min(nsm, tiles),)](
            a_desc, b_desc, sa, lay.scales, bias if bias is not None else sa, out, m, n, k, out.stride(0),
            lo, hi, HAS_BIAS=bias is not None, BM=bm, BN=bn, BK=bk, GROUP_M=cfg["GROUP_M"], NUM_SMS=nsm,
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        return out
    if (tma and plain and not per_channel and not (lay.bits == 4 and lay.half == lay.group_size)
            and lay.group_size % cfg["BK"] == 0):
        from triton.tools.tensor_descriptor import TensorDescriptor

        bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
        h = lay.half if lay.bits == 4 else bk
        if lay.bits == 4 and bk != 2 * h:
            raise ValueError(f"int4 needs BK == 2 * half = {2 * h}")
        a_desc = TensorDescriptor.from_tensor(aq, [bm, bk if lay.bits == 8 else h])
        b_desc = TensorDescriptor.from_tensor(lay.codes, [bn, bk if lay.bits == 8 else h])
        grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
        _grouped_tma_kernel[grid](
            a_desc, b_desc, sa, lay.dot_scales, bias if bias is not None else sa, out, m, n, k, lay.num_groups,
            lay.group_size, out.stride(0), lo, hi, BITS=lay.bits, H=h, HAS_BIAS=bias is not None, LAG=bool(lag),
            ASM=asm,
            BM=bm, BN=bn, BK=bk, GROUP_M=cfg["GROUP_M"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        return out
    _launch(aq, sa, oa, suma, lay, act_asym, bias, out, None, None, lo, hi, 0, cfg, static=False, split=split,
            asm=asm)
    return out


def _launch(aq, sa, oa, suma, lay, act_asym, bias, out, fb, mq, lo, hi, zo, cfg, static, split=1, asm=False):
    m, k = aq.shape
    n = lay.n
    per_channel = lay.num_groups == 1
    bk = cfg["BK"]
    if lay.bits == 4 and bk != 2 * lay.half:
        raise ValueError(f"int4 needs BK == 2 * half = {2 * lay.half}")
    if not per_channel and lay.group_size % bk and not (lay.bits == 4 and lay.half == lay.group_size):
        raise ValueError(f"BK={bk} must divide the group size {lay.group_size}")
    # split-K unit: whole groups (grouped) or whole K-steps (per-channel); only on an even K
    unit = bk if per_channel else max(bk, lay.group_size)
    if static or k % bk or split <= 1:
        split, ksplit = 1, k
    else:
        ksplit = triton.cdiv(triton.cdiv(k, split), unit) * unit
        split = triton.cdiv(k, ksplit)
    grid = (triton.cdiv(m, cfg["BM"]) * triton.cdiv(n, cfg["BN"]), split)
    dummy = lay.scales
    ws = torch.empty((split, m, n), dtype=torch.float32, device=aq.device) if split > 1 else dummy
    _a8_gemm_kernel[grid](
        aq, sa if sa is not None else dummy, oa if oa is not None else dummy,
        suma if suma is not None else dummy,
        lay.codes, lay.dot_scales, lay.moff, lay.cterm,
        bias if bias is not None else dummy, out,
        fb if fb is not None else dummy, mq if mq is not None else dummy, ws,
        m, n, k, lay.num_groups, lay.group_size, ksplit,
        aq.stride(0), lay.codes.stride(0), out.stride(0),
        lo, hi, zo,
        BITS=lay.bits, H=max(lay.half, 16), PER_CHANNEL=per_channel,
        TWO_GROUPS=lay.bits == 4 and lay.half == lay.group_size,
        A_ASYM=bool(act_asym), B_OFF=lay.has_offset, HAS_BIAS=bias is not None, STATIC_OUT=static,
        EVEN_K=k % bk == 0, GPU=not _INTERPRET, SPLIT=split > 1, ASM=asm,
        BM=cfg["BM"], BN=cfg["BN"], BK=bk, GROUP_M=cfg["GROUP_M"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if split > 1:
        block = 1024
        _splitk_reduce[(triton.cdiv(m * n, block),)](
            ws, bias if bias is not None else dummy, out, m, n, split, out.stride(0), lo, hi,
            HAS_BIAS=bias is not None, BLOCK=block, num_warps=4)


def static_int8_gemm(xq, lay, fused_bias, mq, zo: int, lo: int, hi: int, config=None, out=None):
    """INT8 out [M, N] = clamp(rint(float32(xq @ codes.T + fused_bias) * mq) + zo, lo, hi).
    xq: int8 [M, K]; lay: 8-bit per-channel Int8Layout (signed codes); fused_bias int32 [N]; mq float32 [N]."""
    m, k = xq.shape
    n = lay.n
    cfg = dict(config) if config else pick_config(m, n, k, 8, k, True)
    for key in ("TMA", "LAG", "SPLIT_K", "ASM"):
        cfg.pop(key, None)
    if out is None:
        out = torch.empty((m, n), dtype=torch.int8, device=xq.device)
    if m == 0:
        return out
    _launch(xq, None, None, None, lay, False, None, out, fused_bias, mq, float(lo), float(hi), float(zo), cfg,
            static=True)
    return out
