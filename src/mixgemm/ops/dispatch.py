"""Pick the CUDA kernel for a matmul from M, N, K, the weight format and the GPU.

Contract with the kernels (each module owns its layout through QuantizedWeight.layout):
* mixgemm.kernels.cuda.gemv.gemv(x2d, qw, bias, lo, hi) -> [M, N]: CUDA-core GEMV, M <= 16.
* mixgemm.kernels.triton.gemm.gemm(x2d, qw, bias, lo, hi) -> [M, N]: tensor-core GEMM.
x2d is [M, K] with unit stride along K; the output is in x2d.dtype.
The same inputs on the same GPU always take the same path (no run-time autotuning).
"""

from __future__ import annotations

import torch

from mixgemm.epilogue import clamp_bounds
from mixgemm.formats.weight import QuantizedWeight

GEMV_MAX_M = 16


def pick_kernel(m: int, n: int, k: int, qw: QuantizedWeight, device: torch.device) -> str:
    """Name of the kernel that runs this problem: "gemv" or "gemm"."""
    return "gemv" if m <= GEMV_MAX_M else "gemm"


def cuda_matmul(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None, activation: str | None):
    lo, hi = clamp_bounds(activation)
    lead = x.shape[:-1]
    x2d = x.reshape(-1, x.shape[-1])
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()  # a copy: the caller's tensor is never touched
    m, k = x2d.shape
    kernel = pick_kernel(m, qw.out_features, k, qw, x.device)
    if kernel == "gemv":
        from mixgemm.kernels.cuda.gemv import gemv as run
    else:
        from mixgemm.kernels.triton.gemm import gemm as run
    y = run(x2d, qw, bias, lo, hi)
    return y.reshape(*lead, qw.out_features)
