"""Reference conv2d with a block-quantized kernel, in float64."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mixgemm.epilogue import clamp_bounds
from mixgemm.formats.conv import QuantizedConvWeight


def conv2d(
    x: torch.Tensor,
    qweight: QuantizedConvWeight,
    bias: torch.Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
    activation: str | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """x [B, Ci, H, W] (NCHW or channels_last) -> [B, Co, Ho, Wo] in x's memory format and out_dtype."""
    if not isinstance(qweight, QuantizedConvWeight):
        raise TypeError(f"qweight must be a QuantizedConvWeight, got {type(qweight).__name__}")
    if x.dim() != 4:
        raise ValueError(f"conv2d input must be 4-D [B, C, H, W], got shape {tuple(x.shape)}")
    if x.shape[1] != qweight.in_channels_per_group * groups:
        raise ValueError(
            f"shape mismatch: input has {x.shape[1]} channels, the weight expects "
            f"{qweight.in_channels_per_group} x groups={groups}"
        )
    if qweight.out_channels % groups:
        raise ValueError(f"out_channels={qweight.out_channels} is not divisible by groups={groups}")
    lo, hi = clamp_bounds(activation)
    w = qweight.dequantize(torch.float64).to(x.device)
    b = None if bias is None else bias.double()
    y = F.conv2d(x.double(), w, b, stride, padding, dilation, groups).clamp(lo, hi)
    fmt = torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) and x.shape[1] > 1 \
        else torch.contiguous_format
    return y.to(out_dtype or x.dtype).contiguous(memory_format=fmt)
