"""The weight layouts the weight-only linear entries read, by name: the one map from a layout's name to its builder
(QuantizedWeight.layout builds and caches each on first use). Each builder lives with the kernel that reads it."""

from __future__ import annotations

from mixgemm.kernels.registry import Layout

GEMV_MMA_V1 = Layout.lazy("gemv_mma_v1", "mixgemm.kernels.cuda_gemv_mma.layout", "build_gemv_mma_v1")
GEMV_V2 = Layout.lazy("gemv_v2", "mixgemm.kernels.cuda_gemv.layout", "build_gemv_v2")
WGMMA_V1 = Layout.lazy("wgmma_v1", "mixgemm.kernels.cuda_wgmma.layout", "build_wgmma_v1")
# the opt-in resident layout of int8 weights (compact_("rows_v1")): the two GEMVs and the wgmma GEMM read it (config
# ROWS, set by mixgemm.kernels.linear_common.on_rows for such a weight; each kernel's host code reads rows_v1 whenever
# the weight keeps it)
ROWS_V1 = Layout.lazy("rows_v1", "mixgemm.kernels.cuda.rows_layout", "build_rows_v1")
TRITON_GEMM_V1 = Layout.lazy("triton_gemm_v1_ks16", "mixgemm.kernels.triton_gemm.layout", "get_layout")

BY_NAME: dict[str, Layout] = {lay.name: lay for lay in (GEMV_MMA_V1, GEMV_V2, WGMMA_V1, ROWS_V1, TRITON_GEMM_V1)}
