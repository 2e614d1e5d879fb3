"""mixgemm's CUDA C++ kernels, compiled at run time by NVRTC (no CUDA toolkit needed).

gemv: weight-only GEMV for decode, M <= 16 (gemv.cu). nvrtc: compile / load / launch helpers.
"""
