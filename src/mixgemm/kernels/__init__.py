"""Kernels: Triton (GEMM, int8, conv; testable under the interpreter), CUDA C++ compiled by NVRTC (GEMV, wgmma
GEMMs, convs) and the CPU entry (mixgemm.kernels.cpu: PyTorch's own int4 / int8 CPU kernels). The registry
(mixgemm.kernels.registry) lists them per op; the entry lists register here."""

from mixgemm.kernels import a8, conv, linear  # noqa: F401  (each registers its op's ordered entry list)
