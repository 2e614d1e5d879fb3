"""Plain PyTorch references: the oracle for every kernel test and the CPU fallback.

Each is computed in float64 from the exact stored quantized values, on whatever device the inputs are.
"""

from mixgemm.reference.block_gemm import block_int_gemm, block_int_gemm_parts
from mixgemm.reference.conv import conv2d
from mixgemm.reference.int8_static import int8_static_gemm
from mixgemm.reference.matmul import matmul
from mixgemm.reference.norm import rms_norm

__all__ = ["block_int_gemm", "block_int_gemm_parts", "conv2d", "int8_static_gemm", "matmul", "rms_norm"]
