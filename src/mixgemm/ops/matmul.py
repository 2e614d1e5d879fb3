"""mixgemm.matmul: the one public entry for activations x quantized weights.

The dispatcher (mixgemm.ops.dispatch) picks GEMV / GEMM kernels on CUDA; on the CPU the float64
reference runs (the CPU fallback).
"""

from __future__ import annotations

import torch

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
        return _cpu_matmul(x, qweight, bias, activation)
    from mixgemm.ops.dispatch import cuda_matmul

    return cuda_matmul(x, qweight, bias, activation)


def _cpu_matmul(x, qw: QuantizedWeight, bias, activation):
    """CPU fallback: dequantize in float32 per call (q * s and -z * s are exact in float32, so each weight is
    rounded once) and run torch's float32 GEMM; no dequantized copy is kept."""
    lo, hi = clamp_bounds(activation)
    n, k = qw.shape
    s = qw.scales.float()
    m = qw.offsets.float() if qw.mode == "offset" else -qw.zero_points().float() * s
    q = qw.codes().float().reshape(n, qw.num_groups, qw.group_size)
    w = torch.addcmul(m[..., None], q, s[..., None]).reshape(n, k)
    y = torch.nn.functional.linear(x.float(), w, None if bias is None else bias.float())
    return y.clamp(lo, hi).to(x.dtype)
