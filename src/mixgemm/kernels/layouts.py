"""The weight layouts the registry's entries read, by name: the one map from a layout's name to its builder
(QuantizedWeight.layout builds and caches each on first use; each builder lives with the kernel that reads it), and
for the layouts a compacted weight may keep as its only copy, to the function that reads its codes back
(formats.weight.RESIDENT_LAYOUTS, registered here)."""

from __future__ import annotations

from mixgemm.formats.weight import ResidentLayout, register_resident
from mixgemm.kernels.registry import Layout


def _layout(name: str, module: str, build: str, unpack: str | None = None) -> Layout:
    """The layout ``name`` built by ``module.build``; with ``unpack`` (``module.unpack`` reads its codes back) a weight
    may keep it as its only copy."""
    if unpack is not None:
        register_resident(name, ResidentLayout(module, build, unpack))
    return Layout.lazy(name, module, build)


GEMV_MMA_V1 = _layout("gemv_mma_v1", "mixgemm.kernels.cuda_gemv_mma.layout", "build_gemv_mma_v1")
GEMV_V2 = _layout("gemv_v2", "mixgemm.kernels.cuda_gemv.layout", "build_gemv_v2")
WGMMA_V1 = _layout("wgmma_v1", "mixgemm.kernels.cuda_wgmma.layout", "build_wgmma_v1", "unpack_wgmma_v1")
# the opt-in resident layout of int8 weights (compact_("rows_v1")): the two GEMVs and the wgmma GEMM read it (config
# ROWS, set by mixgemm.kernels.linear_common.on_rows for such a weight; each kernel's host code reads rows_v1 whenever
# the weight keeps it)
ROWS_V1 = _layout("rows_v1", "mixgemm.kernels.cuda.rows_layout", "build_rows_v1", "unpack_rows_v1")
TRITON_GEMM_V1 = _layout("triton_gemm_v1_ks16", "mixgemm.kernels.triton_gemm.layout", "get_layout")
# the int8-activation entries': the fused GEMV's own (per channel the plain buffer), the int8 wgmma GEMM's (also the
# resident layout of a compacted W8A8 / W4A8 weight, which the GEMV on it reads) and the Triton int8 GEMM's
A8GEMV_V2 = Layout.lazy("a8gemv_v2", "mixgemm.kernels.cuda_gemv_a8.layout", "build_a8gemv_v2")
WGMMA_A8_V1 = Layout.lazy("wgmma_a8_v1", "mixgemm.formats.layouts_wgmma_a8", "build_wgmma_a8_v1")
INT8_V1 = Layout.lazy("int8_v1", "mixgemm.kernels.triton_a8.layout", "build_int8_layout")

BY_NAME: dict[str, Layout] = {lay.name: lay for lay in (GEMV_MMA_V1, GEMV_V2, WGMMA_V1, ROWS_V1, TRITON_GEMM_V1,
                                                        A8GEMV_V2, WGMMA_A8_V1, INT8_V1)}
