"""The CPU fallback for what PyTorch's int4 / int8 kernels cannot take (fp32 / fp16 activations, odd shapes):
dequantize in float32 and run torch's float32 GEMM, one block of output channels at a time.

Each block's weights are dequantized into a buffer of at most ``BLOCK_ELEMS`` floats (16 MiB) and used at once;
no dequantized copy outlives the call, and the temporaries stay bounded (dequantizing the whole weight at once
needed about 2.5x its float32 size). Blocks are not made cache-sized: each op is a parallel region, and with
hundreds of small blocks the synchronisation cost dominated (4 MiB blocks were 1.7x slower than 16 MiB ones on a
2-core machine shared with other work). q * s and -z * s are exact in float32 for
fp16 / bf16 scales, so each weight is rounded at most once (for fp32 scales, where the addition rounds).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mixgemm.epilogue import clamp_bounds
from mixgemm.formats.packing import unpack_codes
from mixgemm.formats.weight import QuantizedWeight, scale_and_shift

BLOCK_ELEMS = 1 << 22


def _float32_params(qw: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, m) float32 [N, G] with w = q * s + m. Made per call (N x G values, small beside the codes), not cached:
    the fallback keeps nothing resident beside the plain weight."""
    s = qw.scales.float()
    m = qw.offsets.float() if qw.mode == "offset" else -qw.zero_points().float() * s
    return s, m


def dequant_linear(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None,
                   activation: str | None) -> torch.Tensor:
    """act(x @ dequant(W).T + bias) for any CPU problem: x [..., K] float -> [..., N] in x.dtype, computed in
    float32."""
    lo, hi = clamp_bounds(activation)
    n, k = qw.shape
    g = qw.group_size
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k).float()
    s, m = _float32_params(qw)
    y = torch.empty(x2.shape[0], n, dtype=torch.float32)
    rows = max(1, BLOCK_ELEMS // k)
    packed = qw.packed()  # (a compacted weight's codes rebuilt from its resident layout)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        w = scale_and_shift(unpack_codes(packed[r0:r1], qw.bits, k).float(), s[r0:r1], m[r0:r1], g)
        y[:, r0:r1] = F.linear(x2, w)
    if bias is not None:
        y += bias.float()
    return y.clamp_(lo, hi).to(x.dtype).reshape(*lead, n)
