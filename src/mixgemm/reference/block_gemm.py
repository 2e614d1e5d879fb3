"""Block-wise integer GEMM (int8 activations x int4/int8 weights, each quantized per block along K with a scale
and an offset), recovered with the offset terms.

With A = Aq * sA + oA per (token m, block i) and W = Bq * sB + oB per (channel n, block i), block i of
C = A @ W.T is

    C_i[m, n] = sA sB Cq_i + sA oB sum(Aq_i[m]) + oA sB sum(Bq_i[n]) + Ki oA oB,   Cq_i = Aq_i @ Bq_i.T

and C is the sum over blocks. The weight's zero-point form fits too: oB = -z * sB. Activation blocks that span
several weight groups (per-token activations over a grouped weight) are first described per weight group
(QuantizedActivation.regroup: the same codes, scales repeated, sums per group).
"""

from __future__ import annotations

import torch

from mixgemm.formats.activation import QuantizedActivation
from mixgemm.formats.weight import QuantizedWeight


def _aligned(a: QuantizedActivation, w: QuantizedWeight) -> QuantizedActivation:
    """a described per weight group (its blocks must be whole multiples of the weight's group)."""
    k = a.q.shape[1]
    if k != w.in_features:
        raise ValueError(f"shape mismatch: activations have K={k}, weight has K={w.in_features}")
    if a.block_size % w.group_size:
        raise ValueError(f"activation block size {a.block_size} must be a multiple of the weight group size "
                         f"{w.group_size}")
    return a.regroup(w.group_size)


def block_int_gemm_parts(a: QuantizedActivation, w: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact integer parts: Cq [G, M, N] int64 (per-block integer products) and sum(Bq) [N, G] int64."""
    a = _aligned(a, w)
    g, b = a.q.shape[1] // a.block_size, a.block_size
    m, n = a.q.shape[0], w.out_features
    aq = a.q.to(torch.int64).reshape(m, g, b).permute(1, 0, 2)  # [G, M, b]
    bq = w.codes().to(torch.int64).reshape(n, g, b).permute(1, 2, 0)  # [G, b, N]
    cq = torch.bmm(aq, bq) if aq.device.type != "cpu" else torch.einsum("gmk,gkn->gmn", aq, bq)
    return cq, bq.sum(1).T.contiguous()


def block_int_gemm(a: QuantizedActivation, w: QuantizedWeight) -> torch.Tensor:
    """float64 [M, N] from the integer block products and the four-term formula above."""
    a = _aligned(a, w)
    b = a.block_size
    cq, sum_b = block_int_gemm_parts(a, w)
    sa, oa = a.scales.double().T, a.offsets.double().T  # [G, M]
    sum_a = a.sums.double().T  # [G, M]
    sb, ob = (t.T for t in w.group_params_float64())  # [G, N]
    sum_b = sum_b.double().T  # [G, N]
    c = (sa[:, :, None] * sb[:, None, :] * cq.double()
         + sa[:, :, None] * ob[:, None, :] * sum_a[:, :, None]
         + oa[:, :, None] * sb[:, None, :] * sum_b[:, None, :]
         + b * oa[:, :, None] * ob[:, None, :])
    return c.sum(0)
