"""Kernels: Triton (GEMM, int8, conv; testable under the interpreter), CUDA C++ compiled by NVRTC (GEMV), and the
CPU entry (mixgemm.kernels.cpu: PyTorch's own int4 / int8 CPU kernels)."""
