"""mixgemm.matmul: the one public entry for activations x quantized weights.

The dispatcher (mixgemm.ops.dispatch) picks GEMV / GEMM kernels on CUDA; on the CPU, torch's own int4 / int8
kernels or a dequantizing float32 GEMM run (mixgemm.kernels.cpu). Nothing GPU-related is imported on the CPU.
"""

from __future__ import annotations

import torch

from mixgemm._checks import check_matmul_inputs
from mixgemm.epilogue import clamp_bounds
from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.cpu import cpu_can_run, cpu_linear, dequant_linear


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
        return _cpu_matmul(x, qweight, bias, activation)
    from mixgemm.ops.dispatch import cuda_matmul

    return cuda_matmul(x, qweight, bias, activation)


def _cpu_matmul(x, qw: QuantizedWeight, bias, activation):
    """The CPU branch: torch's int4 / int8 kernels where they take the problem (mixgemm.kernels.cpu.linear:
    bfloat16 activations), else the blockwise dequantizing float32 GEMM (mixgemm.kernels.cpu.dequant)."""
    if cpu_can_run(x, qw)[0]:
        return cpu_linear(x, qw, bias, activation)
    return dequant_linear(x, qw, bias, activation)
