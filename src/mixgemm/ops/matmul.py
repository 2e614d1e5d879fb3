"""mixgemm.matmul: the one public entry for activations x quantized weights.

The dispatcher (mixgemm.ops.dispatch) picks GEMV / GEMM kernels on CUDA; on the CPU the float64
reference runs (the CPU fallback).
"""

from __future__ import annotations

import torch

from mixgemm import reference
from mixgemm._checks import check_matmul_inputs
from mixgemm.epilogue import clamp_bounds
from mixgemm.formats.weight import QuantizedWeight


def matmul(
    x: torch.Tensor,
    qweight: QuantizedWeight,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """y = act(x @ W.T + bias).

    x: float16 / bfloat16 / float32 [..., K], on qweight's device. qweight: QuantizedWeight [N, K].
    bias: float [N] or None. activation: None, "relu" or "relu6". Returns [..., N] in x.dtype.
    Inputs are never modified.
    """
    check_matmul_inputs(x, qweight, bias)
    clamp_bounds(activation)
    if x.device.type == "cpu":
        return reference.matmul(x, qweight, bias, activation)
    from mixgemm.ops.dispatch import cuda_matmul

    return cuda_matmul(x, qweight, bias, activation)
