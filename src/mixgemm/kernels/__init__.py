"""Kernels: Triton (GEMM, int8, conv; testable under the interpreter) and CUDA C++ compiled by NVRTC (GEMV)."""
