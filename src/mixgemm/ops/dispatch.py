"""Pick the CUDA kernel for a matmul from M, N, K, the weight format and the GPU.

Contract with the kernels (each module owns its layout through QuantizedWeight.layout):
* mixgemm.kernels.cuda.gemv.gemv(x2d, qw, bias, lo, hi) -> [M, N]: CUDA-core GEMV, M <= 16.
* mixgemm.kernels.cuda.gemm_wgmma.gemm_wgmma(x2d, qw, bias, lo, hi, config) -> [M, N]: Hopper wgmma GEMM
  (sm_90, fp16 / bf16 activations), any M; measured 1.2-1.9x faster than the Triton GEMM on H200 at M = 32..4096
  (benchmarks/gemm_wgmma_notes.md). MIXGEMM_WGMMA=0 turns it off.
* mixgemm.kernels.triton.gemm.gemm(x2d, qw, bias, lo, hi) -> [M, N]: tensor-core GEMM, any M, any GPU and
  activation dtype (fp32 activations, pre-Hopper GPUs).
x2d is [M, K] with unit stride along K; the output is in x2d.dtype.

The choice comes from the table shipped for the GPU (src/mixgemm/configs/<gpu>.json, see
mixgemm.ops.configs): M <= gemv_max_m[bits] runs the GEMV (when it is importable and supports the
problem), everything else the GEMM with the table's tile config. No run-time autotuning: the same
inputs on the same GPU always take the same path.
"""

from __future__ import annotations

import functools
import os

import torch

from mixgemm.epilogue import clamp_bounds
from mixgemm.formats.weight import QuantizedWeight

GEMV_MAX_M = 16  # the GEMV's own limit; the table may lower it per bit width
WGMMA = os.environ.get("MIXGEMM_WGMMA", "1") != "0"


@functools.cache
def _optional_module(name: str):
    """mixgemm.kernels.cuda.<name>, or None when it cannot be imported (e.g. no cuda-bindings): then the next
    kernel in line serves the problem (the Triton GEMM serves every M)."""
    import importlib

    try:
        return importlib.import_module(f"mixgemm.kernels.cuda.{name}")
    except Exception:  # noqa: BLE001 - any import failure means "not here"
        return None


def _gemv_module():
    return _optional_module("gemv")


def _wgmma_module():
    return _optional_module("gemm_wgmma")


def pick_kernel(m: int, n: int, k: int, qw: QuantizedWeight, device: torch.device,
                x_dtype: torch.dtype = torch.float16) -> str:
    """Name of the kernel that runs this problem: "gemv", "wgmma" or "gemm" (Triton)."""
    from mixgemm.ops.configs import gemv_max_m

    wg = WGMMA and (mod := _wgmma_module()) is not None and mod.wgmma_supported(x_dtype, qw, device)
    # the GEMV / GEMM crossover depends on which GEMM takes over (the wgmma GEMM overtakes the GEMV at smaller M)
    if m <= min(GEMV_MAX_M, gemv_max_m(qw, device, n, wgmma=wg, k=k)):
        mod = _gemv_module()
        if mod is not None and (not hasattr(mod, "gemv_supported") or mod.gemv_supported(m, x_dtype, qw)):
            return "gemv"
    return "wgmma" if wg else "gemm"


def cuda_matmul(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None, activation: str | None):
    lo, hi = clamp_bounds(activation)
    lead = x.shape[:-1]
    if lead.numel() == 0 or qw.out_features == 0:  # empty batch: no kernel math (tile and split-K rules divide by M)
        return x.new_empty((*lead, qw.out_features))
    x2d = x.reshape(-1, x.shape[-1])
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()  # a copy: the caller's tensor is never touched
    m, k = x2d.shape
    kernel = pick_kernel(m, qw.out_features, k, qw, x.device, x.dtype)
    if kernel == "gemv":
        y = _gemv_module().gemv(x2d, qw, bias, lo, hi)
    elif kernel == "wgmma":
        from mixgemm.ops.configs import wgmma_config

        y = _wgmma_module().gemm_wgmma(x2d, qw, bias, lo, hi, wgmma_config(m, qw.out_features, k, qw, x.device),
                                           fit=True)
    else:
        from mixgemm.kernels.triton.gemm import gemm

        y = gemm(x2d, qw, bias, lo, hi)
    return y.reshape(*lead, qw.out_features)
