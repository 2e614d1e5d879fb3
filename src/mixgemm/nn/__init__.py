"""PyTorch modules: QuantLinear (drop-in nn.Linear) and QuantConv2d (drop-in nn.Conv2d)."""

from mixgemm.nn.conv import QuantConv2d
from mixgemm.nn.linear import QuantLinear

__all__ = ["QuantConv2d", "QuantLinear"]
