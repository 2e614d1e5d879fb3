"""mixgemm.conv2d: convolution with a block-quantized kernel (reference on the CPU)."""

from __future__ import annotations

import torch

from mixgemm import reference
from mixgemm.formats.conv import QuantizedConvWeight


def conv2d(x: torch.Tensor, qweight: QuantizedConvWeight, bias: torch.Tensor | None = None, stride=1,
           padding=0, dilation=1, groups: int = 1, activation: str | None = None) -> torch.Tensor:
    """x [B, Ci, H, W] float (NCHW or channels_last) -> [B, Co, Ho, Wo] in x's layout and dtype."""
    return reference.conv2d(x, qweight, bias, stride, padding, dilation, groups, activation)
