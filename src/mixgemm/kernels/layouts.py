"""The weight layouts the registry's entries read, by name (QuantizedWeight.layout builds and caches each on first
use): the one map from a layout's name to its builder."""

from __future__ import annotations

from mixgemm.kernels.registry import Layout

GEMV_MMA_V1 = Layout.lazy("gemv_mma_v1", "mixgemm.formats.layouts", "build_gemv_mma_v1")
GEMV_V2 = Layout.lazy("gemv_v2", "mixgemm.formats.layouts", "build_gemv_v2")
WGMMA_V1 = Layout.lazy("wgmma_v1", "mixgemm.formats.layouts_wgmma", "build_wgmma_v1")
# the opt-in resident layout of int8 weights (compact_("rows_v1")): the two GEMVs and the wgmma GEMM read it (config
# ROWS, set by mixgemm.kernels.linear._on_rows for such a weight; each kernel's host code reads rows_v1 whenever the
# weight keeps it)
ROWS_V1 = Layout.lazy("rows_v1", "mixgemm.formats.layouts_rows", "build_rows_v1")
# the int8-activation entries': the fused GEMV's own (per channel the plain buffer), the int8 wgmma GEMM's (also the
# resident layout of a compacted W8A8 / W4A8 weight, which the GEMV on it reads) and the Triton int8 GEMM's
A8GEMV_V2 = Layout.lazy("a8gemv_v2", "mixgemm.kernels.cuda_gemv_a8.layout", "build_a8gemv_v2")
WGMMA_A8_V1 = Layout.lazy("wgmma_a8_v1", "mixgemm.formats.layouts_wgmma_a8", "build_wgmma_a8_v1")
INT8_V1 = Layout.lazy("int8_v1", "mixgemm.kernels.triton_a8.layout", "build_int8_layout")
