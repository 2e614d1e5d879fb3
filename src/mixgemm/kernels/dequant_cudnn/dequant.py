"""``dequant_cudnn``'s kernel: a conv weight's matrix [Co, Kh * Kw * Ci_g] dequantized to fp16 / bf16 / fp32 in one
Triton launch from the shared ``conv_triton_v1`` layout (mixgemm.kernels.triton.conv_common), with the implicit GEMM's
unpack and magic-number math, for cuDNN to convolve.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.triton.conv_common import _TL_DTYPES, conv_layout
from mixgemm.kernels.triton.dequant import codes_to_values, group_params


@triton.jit
def _dequantize_words(
    words,
    BITS: tl.constexpr,
    BK: tl.constexpr,
    ZERO_MODE: tl.constexpr,
    s,
    p,
    OUT_DTYPE: tl.constexpr,
    SCALE: tl.constexpr,
):
    """int32 word tile [BN, BK * BITS // 32] (code f of a word at bits f*BITS = k offset f) -> [BN, BK] weights.

    Only the unpack is this kernel's own; codes become values in the shared
    mixgemm.kernels.triton.dequant.codes_to_values (same group_params contract, same magic numbers).
    * unpack: each word's E codes land next to each other in one thread's registers (3-D broadcast +
      reshape), so one dot covers all BK.
    * ``bitcast(q | MAGIC_BITS)`` is exactly MAGIC + q in the compute dtype (0x6400 = fp16 1024.0, ulp 1):
      no int->float conversion instructions (1/4 rate on sm_90); ``- (MAGIC + z)`` is the exact q - z.
    """
    E: tl.constexpr = 32 // BITS
    shifts = tl.arange(0, E) * BITS
    q = tl.reshape((words[:, :, None] >> shifts[None, None, :]) & ((1 << BITS) - 1), (words.shape[0], BK))
    return codes_to_values(q, BITS, ZERO_MODE, s, p, OUT_DTYPE, SCALE)


@triton.jit
def _dequant_matrix_kernel(
    w_ptr,
    s_ptr,
    m_ptr,
    out_ptr,
    CO,
    K,
    WROW,
    GS,
    BITS: tl.constexpr,
    ZERO_MODE: tl.constexpr,
    OUT_DTYPE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ONE_GROUP: tl.constexpr,
    TILE_GROUPS: tl.constexpr,
):
    """out[n, k] = W[n, k] in OUT_DTYPE ([CO, K] row-major): the same unpack / magic-number math as the conv
    kernel. The parameters are read once per (row, group) of the tile and broadcast along k: ONE_GROUP (the tile
    inside one group) one vector, TILE_GROUPS > 0 (the tile holds that many whole groups: g32 in a 64-k tile) one
    [BLOCK_N, TILE_GROUPS] block; else a group index per element. Why: a per-element gather of the parameters reads
    four times the bytes the tile writes (H200, a 3x3 1280-1280 W4 g32 weight: 15.7 us for 14.7 M weights)."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask_n = offs_n < CO
    NW: tl.constexpr = BLOCK_K * BITS // 32
    offs_w = k0 * BITS // 32 + tl.arange(0, NW)
    words = tl.load(
        w_ptr + offs_n[:, None].to(tl.int64) * WROW + offs_w[None, :],
        mask=mask_n[:, None] & (offs_w[None, :] < WROW),
        other=0,
    )
    pm = mask_n[:, None] & (offs_k[None, :] < K)
    if ONE_GROUP:
        pidx = (k0 // GS) * CO + offs_n
        s, p = group_params(tl.load(s_ptr + pidx, mask=mask_n, other=0.0),
                            tl.load(m_ptr + pidx, mask=mask_n, other=0.0), BITS, ZERO_MODE, OUT_DTYPE)
        s, p = s[:, None], p[:, None]
    elif TILE_GROUPS > 0:
        offs_g = k0 // GS + tl.arange(0, TILE_GROUPS)
        pidx = offs_g[None, :] * CO + offs_n[:, None]
        gm = mask_n[:, None] & (offs_g[None, :] * GS < K)
        s, p = group_params(tl.load(s_ptr + pidx, mask=gm, other=0.0), tl.load(m_ptr + pidx, mask=gm, other=0.0),
                            BITS, ZERO_MODE, OUT_DTYPE)
        per: tl.constexpr = BLOCK_K // TILE_GROUPS
        s = tl.reshape(tl.broadcast_to(s[:, :, None], (BLOCK_N, TILE_GROUPS, per)), (BLOCK_N, BLOCK_K))
        p = tl.reshape(tl.broadcast_to(p[:, :, None], (BLOCK_N, TILE_GROUPS, per)), (BLOCK_N, BLOCK_K))
    else:
        pidx = (offs_k // GS)[None, :] * CO + offs_n[:, None]
        s, p = group_params(
            tl.load(s_ptr + pidx, mask=pm, other=0.0), tl.load(m_ptr + pidx, mask=pm, other=0.0), BITS, ZERO_MODE,
            OUT_DTYPE
        )
    w = _dequantize_words(words, BITS, BLOCK_K, ZERO_MODE, s, p, OUT_DTYPE, True)
    tl.store(out_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :], w, mask=pm)


def dequantize_matrix(qw: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """The weight matrix [N, K] in ``dtype`` (fp16 / bf16 / fp32), one kernel launch, from the cached layout.

    Values equal the conv kernel's in-register dequantization (for fp16: w = (q - z) * s rounded once)."""
    lay = conv_layout(qw)
    out = torch.empty((lay.n, lay.k), device=lay.weight.device, dtype=dtype)
    bn, bk = 64, 64
    gs = lay.group_size
    one_group = gs % bk == 0 or gs >= lay.k  # every tile inside one group (per channel: one group a row)
    tile_groups = bk // gs if not one_group and bk % gs == 0 else 0
    _dequant_matrix_kernel[(triton.cdiv(lay.n, bn), triton.cdiv(lay.k, bk))](
        lay.weight,
        lay.scale,
        lay.shift,
        out,
        lay.n,
        lay.k,
        lay.weight.shape[1],
        lay.group_size,
        BITS=lay.bits,
        ZERO_MODE=lay.zero_mode,
        OUT_DTYPE=_TL_DTYPES[dtype],
        BLOCK_N=bn,
        BLOCK_K=bk,
        ONE_GROUP=one_group,
        TILE_GROUPS=tile_groups,
        num_warps=4,
    )
    return out
