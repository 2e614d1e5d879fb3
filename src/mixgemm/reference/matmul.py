"""Reference y = act(x @ dequant(W).T + bias), in float64."""

from __future__ import annotations

import torch

from mixgemm._checks import check_matmul_inputs
from mixgemm.epilogue import clamp_bounds
from mixgemm.formats.weight import QuantizedWeight, dequantize_weight


def matmul(
    x: torch.Tensor,
    qweight: QuantizedWeight,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """x [..., K] float16/bfloat16/float32/float64 times a QuantizedWeight [N, K] -> [..., N].

    Computed in float64; bias (float [N]) added, then the activation clamp; returned in out_dtype
    (default: x.dtype).
    """
    check_matmul_inputs(x, qweight, bias, allowed_dtypes=(torch.float16, torch.bfloat16, torch.float32,
                                                          torch.float64))
    lo, hi = clamp_bounds(activation)
    w = dequantize_weight(qweight, torch.float64)
    y = x.double() @ w.T
    if bias is not None:
        y = y + bias.double()
    y = y.clamp(lo, hi)
    return y.to(out_dtype or x.dtype)
