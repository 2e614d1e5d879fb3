"""Kernels: Triton (GEMM, int8, conv; testable under the interpreter) and CUDA C++ compiled by NVRTC (GEMV, wgmma
GEMMs, convs). The registry (mixgemm.kernels.registry) lists them per op; the entry lists register here."""

from mixgemm.kernels import a8, conv, linear  # noqa: F401  (each registers its op's ordered entry list)
