"""Weight-only linear (x float, W int4 / int8): the registry's entries, in the order the dispatcher tries them. Each
entry's folder holds its can_run, config, run, layout, host code and source.

* ``cuda_gemv_wg_simt`` (mixgemm.kernels.cuda_gemv_wg_simt): the CUDA-core GEMV on wgmma_v1, M = 1, fp16 / bf16: a
  compacted weight's decode call.
* ``cuda_gemv_mma`` (mixgemm.kernels.cuda_gemv_mma): the tensor-core GEMV, M <= 16, fp16 / bf16.
* ``cuda_gemv`` (mixgemm.kernels.cuda_gemv): the CUDA-core GEMV, M <= 16, any activation dtype.
  The GEMVs serve M up to the GPU table's crossover (mixgemm.kernels.gemv_crossover), which depends on whether the
  wgmma GEMM or the Triton GEMM takes over above it.
* ``dequant_cublas`` (mixgemm.kernels.dequant_matmul): M >= 512 on sm_90, the weight dequantized into a transient
  float buffer and cuBLAS, where a race on the layer's first eager call measured it faster than the entry below.
* ``cuda_wgmma`` (mixgemm.kernels.cuda_wgmma): the Hopper wgmma GEMM, sm_90, fp16 / bf16, any M.
* ``triton_gemm`` (mixgemm.kernels.triton_gemm): the Triton tensor-core GEMM, any M, any GPU and activation dtype.

Run contract: ``run(x2d, qw, bias, lo, hi, config) -> [M, N]`` with x2d [M, K] unit stride along K, M >= 1;
cuda_gemv_mma and cuda_gemv also take ``perm=`` (an act-order layer's kernel permutation,
mixgemm.ops.dispatch.kernel_perm) and gather x through it while reading it. The GEMMs do not (their reason says so):
the caller gathers x before them, which costs little next to a prefill GEMM; cuda_gemv_wg_simt declines act-order
layers.
"""

from __future__ import annotations

from mixgemm.kernels import cuda_gemv, cuda_gemv_mma, cuda_gemv_wg_simt, cuda_wgmma, dequant_matmul, triton_gemm
from mixgemm.kernels.registry import register

ENTRIES = (cuda_gemv_wg_simt.ENTRY, cuda_gemv_mma.ENTRY, cuda_gemv.ENTRY, dequant_matmul.ENTRY, cuda_wgmma.ENTRY,
           triton_gemm.ENTRY)
register("linear", ENTRIES)
