"""PyTorch modules: QuantLinear (drop-in nn.Linear) and the model-level ``quantize_``."""

from mixgemm.nn.linear import QuantLinear

__all__ = ["QuantLinear"]
