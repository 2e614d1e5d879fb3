"""A GEMV call without the registry, for tests and benchmark tools: ``gemv(x2d, qw, bias, lo, hi)`` runs the
tensor-core GEMV where ``use_mma`` says so (or kernel_options forces it), else the CUDA-core one, each with its own
config rule. mixgemm's ops never call it: the registry (mixgemm.kernels.linear) decides which kernel runs.
"""

from __future__ import annotations

import torch

from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.gemv_launch import _ACT, GEMV_MAX_M, _check_gemv, weight_pair_packs
from mixgemm.kernels.cuda_gemv.host import gemv_simt, simt_config, simt_override
from mixgemm.kernels.cuda_gemv_mma.host import gemv_mma, mma_config, mma_override
from mixgemm.kernels.options import current_options


def gemv_supported(m: int, x_dtype: torch.dtype, qw: QuantizedWeight) -> bool:
    """True when this kernel handles the problem (the dispatcher's pre-check)."""
    return 1 <= m <= GEMV_MAX_M and x_dtype in _ACT and qw.bits in (4, 8)


def use_mma(x_dtype: torch.dtype, m: int) -> bool:
    """Tensor cores for bf16 activations and for fp16 at M >= 2 (measured on H200: at M = 1 the fp16
    CUDA-core kernel with 4 rows per warp was faster, at M = 16 the mma kernel 7.5x faster); fp32
    activations stay on exact fp32 CUDA-core math."""
    if x_dtype == torch.float32:
        return False
    return x_dtype == torch.bfloat16 or m >= 2


@torch.compiler.disable
def gemv(x2d: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None, lo: float, hi: float,
         perm: torch.Tensor | None = None) -> torch.Tensor:
    """clamp(x2d @ dequant(qw).T + bias, lo, hi) -> [M, N] in x2d.dtype (see the module docstring): the tensor-core
    kernel where use_mma says so, else the CUDA-core one, each with its own config rule; perm: see the module
    docstring."""
    bias = _check_gemv(x2d, qw, bias)
    m, k = x2d.shape
    n = qw.out_features
    if m == 0 or n == 0:
        return torch.empty(m, n, dtype=x2d.dtype, device=x2d.device)
    props = torch.cuda.get_device_properties(x2d.device)
    opts = current_options()  # kernel_options: force "cuda_gemv_mma" / "cuda_gemv", or a config for either
    forced_mma = "cuda_gemv_mma" in opts.force or ("cuda_gemv" not in opts.force and use_mma(x2d.dtype, m))
    if x2d.dtype != torch.float32 and forced_mma:
        cfg = mma_config(m, n, k, qw.bits, qw.group_size, props.multi_processor_count, qw.mode,
                         pair_packs=weight_pair_packs(qw.mode, qw.scales.dtype), x_dtype=x2d.dtype,
                         scale_dtype=qw.scales.dtype, arch=nvrtc.arch_of(x2d.device))
        forced = opts.configs.get("cuda_gemv_mma")
        return gemv_mma(x2d, qw, bias, lo, hi, cfg if forced is None else mma_override(cfg, forced), perm)
    forced = opts.configs.get("cuda_gemv")
    cfg = simt_override(forced) if forced is not None else simt_config(m, n, k, qw.bits, x2d.dtype, qw.mode,
                                                                          props.multi_processor_count, props.name)
    return gemv_simt(x2d, qw, bias, lo, hi, cfg, perm)
