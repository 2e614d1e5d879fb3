"""The weight layouts the linear entries read, by name (QuantizedWeight.layout builds and caches each on first use)."""

from __future__ import annotations

from mixgemm.kernels.registry import Layout

GEMV_MMA_V1 = Layout.lazy("gemv_mma_v1", "mixgemm.formats.layouts", "build_gemv_mma_v1")
GEMV_V2 = Layout.lazy("gemv_v2", "mixgemm.formats.layouts", "build_gemv_v2")
WGMMA_V1 = Layout.lazy("wgmma_v1", "mixgemm.formats.layouts_wgmma", "build_wgmma_v1")
# the opt-in resident layout of int8 weights (compact_("rows_v1")): the two GEMVs and the wgmma GEMM read it (config
# ROWS, set by mixgemm.kernels.linear._on_rows for such a weight; each kernel's host code reads rows_v1 whenever the
# weight keeps it)
ROWS_V1 = Layout.lazy("rows_v1", "mixgemm.formats.layouts_rows", "build_rows_v1")
