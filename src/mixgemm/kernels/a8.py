"""Int8-activation linear (W4A8 / W8A8: x quantized to int8 per token and block): the registry's entries, in order.
Each entry lives in its folder (kernels/<name>/: the entry, its host code, layout and source); the op's Problem, run
contract and activation quantizer are mixgemm.kernels.int8_activations.

* ``cuda_gemv_a8``: the fused CUDA GEMV (activation quantization in its prologue, dp4a), small M.
* ``cuda_gemv_a8_wg``: the same fused GEMV on the int8 GEMM's ``wgmma_a8_v1`` (a compacted weight's decode).
* ``cuda_wgmma_a8``: the Hopper int8 wgmma GEMM, large M (and the small-M tiles where they measured faster).
* ``triton_a8``: the Triton int8 tensor-core GEMM, any M.
"""

from __future__ import annotations

from mixgemm.kernels.cuda_gemv_a8 import ENTRY as CUDA_GEMV_A8
from mixgemm.kernels.cuda_gemv_a8_wg import ENTRY as CUDA_GEMV_A8_WG
from mixgemm.kernels.cuda_wgmma_a8 import ENTRY as CUDA_WGMMA_A8
from mixgemm.kernels.registry import register
from mixgemm.kernels.triton_a8 import ENTRY as TRITON_A8

ENTRIES = (CUDA_GEMV_A8, CUDA_GEMV_A8_WG, CUDA_WGMMA_A8, TRITON_A8)
register("linear_a8", ENTRIES)
