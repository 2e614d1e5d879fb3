"""Weight-only GEMM on tensor cores (Triton, wgmma on Hopper through tl.dot): y = clamp(x @ W.T + b).

``gemm(x2d, qw, bias, lo, hi, config=None)``:

* x2d: float16 / bfloat16 / float32 [M, K], unit stride along K (any row stride), on a CUDA device (or on
  the CPU under TRITON_INTERPRET=1). Any M >= 1.
* qw: QuantizedWeight [N, K] on the same device: int4 / int8, any group size (32..256, per-channel; 16 for int8),
  mode "sym" / "zero_point" / "offset", any scale dtype. Its ``triton_gemm_v1_ks<KS>`` layout (layout.py) is
  built on first use and cached on the weight.
* bias: None or float [N]. lo, hi: output clamp bounds (floats, may be +-inf).
* config: None (the kernel's own rule, default_config; the dispatcher hands the per-GPU table's config from
  mixgemm.tuning, which mixgemm.explain shows) or a dict of short keys, each defined and documented in config.py
  (``TritonGemmConfig``: KS, BM, BN, KCH, SPLIT_K, GROUP_M, num_warps, num_stages).
* Returns [M, N] in x2d.dtype; fp32 accumulation. No host synchronization (CUDA-graph capturable once
  compiled); allocations: the output, plus an fp32 [M, N] workspace when SPLIT_K > 1.

How it works. The kernel computes the *transposed* tile out.T[BN, BM] = W[BN, BK] @ x.T[BK, BM]:
the dequantized weights are the first operand, which wgmma may take straight from registers, so the
dequantized weights never go to shared memory (let alone global memory); the activation tile is the
second operand (shared memory, software-pipelined with num_stages cp.async stages). M becomes the
wgmma N dimension (8..256 in steps of 8), so small M (17..64) wastes no tensor-core rows. Each chunk
of a word tile is unpacked field by field (layout.py) into [BN, KS] operands of KS consecutive k,
each dotted against the matching x slice (no register shuffle: each thread unpacks exactly its own
A-fragment). Group scales are applied per weight (dequant.py), except for per-channel sym /
zero_point weights, whose integer q - z tiles go into the dot and whose scale multiplies the fp32
accumulator once at the end. fp32 activations: weights dequantized in fp32, dot with
input_precision="tf32x3" (three tf32 MMAs: about fp32 accuracy).
SPLIT_K > 1 splits the K loop over extra programs (fills the SMs when the tile count is low) and
reduces through fp32 atomics into a workspace, then a small epilogue kernel adds bias, clamps, casts.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.triton.dequant import MODE_IDS, dequantize, group_params
from mixgemm.kernels.triton_gemm.layout import N_ALIGN, TritonGemmLayout, chunk_k, get_layout

DEFAULT_KS = 16
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _gemm_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, m_ptr, b_ptr, o_ptr, ws_ptr,
    M, N, K, Kw, Np, stride_xm, stride_om, lo, hi, KT_PER_SPLIT,
    BITS: tl.constexpr, ZERO_MODE: tl.constexpr, GS: tl.constexpr, KS: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, KCH: tl.constexpr, SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr, CLAMP_LO: tl.constexpr, CLAMP_HI: tl.constexpr, EVEN_K: tl.constexpr,
    DOT_PREC: tl.constexpr, FPG: tl.constexpr,
):
    E: tl.constexpr = 32 // BITS  # codes per int32 word = fields per chunk
    CH: tl.constexpr = E * KS  # k per chunk
    BK: tl.constexpr = CH * KCH
    ACT = x_ptr.dtype.element_ty

    # Grouped raster: GROUP_M consecutive m-tiles walk the n-tiles together (x tiles stay in L2).
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    num_in_group = GROUP_M * num_pid_n
    group_id = pid // num_in_group
    first_m = group_id * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % num_in_group) % group_m)
    pid_n = (pid % num_in_group) // group_m

    offs_n = pid_n * BN + tl.arange(0, BN)  # < Np: the layout pads N to a multiple of 256 >= BN
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_j = tl.arange(0, KS)
    m_ok = offs_m < M
    x_cols = x_ptr + offs_m[None, :].to(tl.int64) * stride_xm  # [1, BM]
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * Kw + offs_j[None, :]  # [BN, KS]

    if GS == 0:  # per-channel: one parameter row for the whole K loop
        s_raw = tl.load(s_ptr + offs_n)
        if ZERO_MODE == 1:
            p_raw = tl.load(z_ptr + offs_n)
        elif ZERO_MODE == 2:
            p_raw = tl.load(m_ptr + offs_n)
        else:
            p_raw = s_raw
        s, p = group_params(s_raw, p_raw, BITS, ZERO_MODE, ACT)
        s2 = s[:, None]
        p2 = p[:, None]

    acc = tl.zeros((BN, BM), dtype=tl.float32)
    kt_start = pid_k * KT_PER_SPLIT
    kt_end = min(kt_start + KT_PER_SPLIT, tl.cdiv(K, BK))
    for kt in range(kt_start, kt_end):
        for c in tl.static_range(KCH):
            words = tl.load(w_rows + (kt * KCH + c) * KS)
            # FPG consecutive fields share one group: load its parameters once per segment
            for seg in tl.static_range(E // FPG):
                if GS >= KS:
                    g = (kt * BK + c * CH + seg * FPG * KS) // GS
                    s_raw = tl.load(s_ptr + g * Np + offs_n)
                    if ZERO_MODE == 1:
                        p_raw = tl.load(z_ptr + g * Np + offs_n)
                    elif ZERO_MODE == 2:
                        p_raw = tl.load(m_ptr + g * Np + offs_n)
                    else:
                        p_raw = s_raw
                    sg, pg = group_params(s_raw, p_raw, BITS, ZERO_MODE, ACT)
                    sg2 = sg[:, None]
                    pg2 = pg[:, None]
                elif GS > 0:  # groups narrower than a field (GS < KS): parameters per element
                    g2 = ((kt * BK + c * CH + seg * KS + offs_j) // GS)[None, :] * Np + offs_n[:, None]
                    s_raw = tl.load(s_ptr + g2)
                    if ZERO_MODE == 1:
                        p_raw = tl.load(z_ptr + g2)
                    elif ZERO_MODE == 2:
                        p_raw = tl.load(m_ptr + g2)
                    else:
                        p_raw = s_raw
                    sg2, pg2 = group_params(s_raw, p_raw, BITS, ZERO_MODE, ACT)
                else:
                    sg2 = s2
                    pg2 = p2
                for f2 in tl.static_range(FPG):
                    f = seg * FPG + f2
                    kk = kt * BK + c * CH + f * KS
                    w = dequantize(words, f, BITS, ZERO_MODE, sg2, pg2, ACT, GS > 0 or ZERO_MODE == 2)
                    xk = kk + offs_j
                    if EVEN_K:
                        xt = tl.load(x_cols + xk[:, None], mask=m_ok[None, :], other=0.0)
                    else:
                        xt = tl.load(x_cols + xk[:, None], mask=m_ok[None, :] & (xk[:, None] < K), other=0.0)
                    acc = tl.dot(w, xt, acc, input_precision=DOT_PREC)

    if GS == 0 and ZERO_MODE != 2:
        acc = acc * s.to(tl.float32)[:, None]  # per-channel scale once per output, not per weight
    n_ok = offs_n < N
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc = acc + tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        if CLAMP_LO:
            acc = tl.maximum(acc, lo)
        if CLAMP_HI:
            acc = tl.minimum(acc, hi)
        o_ptrs = o_ptr + offs_m[None, :].to(tl.int64) * stride_om + offs_n[:, None]
        tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=m_ok[None, :] & n_ok[:, None])
    else:
        ws_ptrs = ws_ptr + offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
        tl.atomic_add(ws_ptrs, acc, mask=m_ok[None, :] & n_ok[:, None], sem="relaxed")


@triton.jit
def _splitk_epilogue(ws_ptr, b_ptr, o_ptr, M, N, stride_om, lo, hi, BLOCK: tl.constexpr,
                     HAS_BIAS: tl.constexpr, CLAMP_LO: tl.constexpr, CLAMP_HI: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M * N
    m = offs // N
    n = offs % N
    acc = tl.load(ws_ptr + offs, mask=ok, other=0.0)
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + n, mask=ok, other=0.0).to(tl.float32)
    if CLAMP_LO:
        acc = tl.maximum(acc, lo)
    if CLAMP_HI:
        acc = tl.minimum(acc, hi)
    tl.store(o_ptr + m * stride_om + n, acc.to(o_ptr.dtype.element_ty), mask=ok)


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def fields_per_group(lay: TritonGemmLayout) -> int:
    """How many consecutive unpacked fields (KS k each) share one group: E for per-channel / big groups,
    1 when a group is narrower than a field (then the parameters are loaded per element)."""
    e = 32 // lay.bits
    return e if lay.group_size == 0 else max(1, min(e, lay.group_size // lay.ks))


def default_config(m: int, n: int, k: int, bits: int, per_channel: bool, sms: int = 132) -> dict:
    """The fallback tile choice when the shipped table has no entry (any GPU; deterministic)."""
    if m <= 16:
        cfg = dict(BM=16, BN=128, GROUP_M=1, num_warps=4, num_stages=3)
    elif m <= 32:
        cfg = dict(BM=32, BN=128, GROUP_M=1, num_warps=4, num_stages=3)
    elif m <= 64:
        cfg = dict(BM=64, BN=128, GROUP_M=1, num_warps=4, num_stages=3)
    else:
        cfg = dict(BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=3)
    cfg.update(KS=DEFAULT_KS, KCH=1)
    cfg["SPLIT_K"] = auto_split(m, n, k, cfg, sms, bits)
    return cfg


def auto_split(m: int, n: int, k: int, cfg: dict, sms: int, bits: int = 4) -> int:
    """Split-K factor that brings the program count to about one full wave (1 when the tiles suffice)."""
    tiles = math.ceil(m / cfg["BM"]) * math.ceil(n / cfg["BN"])
    kt = math.ceil(k / (chunk_k(bits, cfg.get("KS", DEFAULT_KS)) * cfg.get("KCH", 1)))
    if tiles >= sms or kt < 8:
        return 1
    return max(1, min(8, sms // tiles, kt // 4))


def _check(x2d: torch.Tensor, qw: QuantizedWeight):
    if x2d.dim() != 2 or x2d.shape[1] != qw.in_features:
        raise ValueError(f"x2d must be [M, K={qw.in_features}], got {tuple(x2d.shape)}")
    if x2d.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"x2d dtype must be float16/bfloat16/float32, got {x2d.dtype}")
    if x2d.stride(1) != 1:
        raise ValueError("x2d must have unit stride along K")
    if qw.bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {qw.bits}")
    if x2d.device != qw.device:
        raise ValueError(f"device mismatch: x2d on {x2d.device}, weight on {qw.device}")
    if x2d.device.type != "cuda" and not _INTERPRET:
        raise ValueError("the Triton GEMM needs CUDA tensors (or TRITON_INTERPRET=1 for the CPU interpreter)")


def tile_error(cfg: dict) -> str | None:
    """Why the tile config cannot run (None when it can); also keeps tuning candidates legal."""
    bm, bn, kch = cfg["BM"], cfg["BN"], cfg.get("KCH", 1)
    if bn > N_ALIGN or N_ALIGN % bn or kch not in (1, 2) or bm < 16 or bm % 16:
        return f"bad tile BM={bm} BN={bn} KCH={kch}: BN must divide 256, KCH be 1 or 2, BM >= 16"
    return None


def gemm(x2d: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None, lo: float, hi: float,
         config: dict | None = None) -> torch.Tensor:
    """clamp(x2d @ dequant(qw).T + bias, lo, hi) in x2d.dtype (see the module docstring)."""
    _check(x2d, qw)
    m, k = x2d.shape
    n = qw.out_features
    out = torch.empty((m, n), dtype=x2d.dtype, device=x2d.device)
    if m == 0:
        return out
    if config is None:
        config = default_config(m, n, k, qw.bits, qw.num_groups == 1, num_sms(x2d.device))
    cfg = dict(config)
    lay: TritonGemmLayout = get_layout(qw, cfg.get("KS", DEFAULT_KS))
    why = tile_error(cfg)
    if why:
        raise ValueError(why)
    bm, bn, kch = cfg["BM"], cfg["BN"], cfg.get("KCH", 1)
    bk = chunk_k(lay.bits, lay.ks) * kch
    kt = math.ceil(k / bk)
    if cfg.get("SPLIT_K", 1) == "auto":
        cfg["SPLIT_K"] = auto_split(m, n, k, cfg, num_sms(x2d.device), lay.bits)
    split = max(1, min(int(cfg.get("SPLIT_K", 1)), kt))
    kt_per = math.ceil(kt / split)
    split = math.ceil(kt / kt_per)
    lo_on, hi_on = lo != -math.inf, hi != math.inf  # clamp only where a bound exists
    lo_v = float(lo) if lo_on else 0.0
    hi_v = float(hi) if hi_on else 0.0
    ws = torch.zeros((m, n), dtype=torch.float32, device=x2d.device) if split > 1 else out
    dummy = lay.scales
    grid = (math.ceil(m / bm) * math.ceil(n / bn), split)
    _gemm_kernel[grid](
        x2d, lay.words, lay.scales,
        lay.zeros if lay.zeros is not None else dummy,
        lay.offsets if lay.offsets is not None else dummy,
        bias if bias is not None else dummy, out, ws,
        m, n, k, lay.kw, lay.np_, x2d.stride(0), out.stride(0), lo_v, hi_v, kt_per,
        BITS=lay.bits, ZERO_MODE=MODE_IDS[lay.mode], GS=lay.group_size, KS=lay.ks,
        BM=bm, BN=bn, KCH=kch, SPLIT_K=split, GROUP_M=cfg.get("GROUP_M", 1),
        HAS_BIAS=bias is not None and split == 1,
        CLAMP_LO=lo_on and split == 1, CLAMP_HI=hi_on and split == 1,
        EVEN_K=(k % bk == 0),
        DOT_PREC="tf32x3" if x2d.dtype == torch.float32 else "tf32",
        FPG=fields_per_group(lay),
        num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3),
    )
    if split > 1:
        block = 1024
        _splitk_epilogue[(math.ceil(m * n / block),)](
            ws, bias if bias is not None else dummy, out, m, n, out.stride(0), lo_v, hi_v, BLOCK=block,
            HAS_BIAS=bias is not None, CLAMP_LO=lo_on, CLAMP_HI=hi_on, num_warps=4,
        )
    return out
