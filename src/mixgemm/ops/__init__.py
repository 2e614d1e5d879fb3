"""Public ops and the dispatcher that picks a kernel (or the reference on CPU)."""

from mixgemm.ops.conv import conv2d
from mixgemm.ops.matmul import matmul

__all__ = ["conv2d", "matmul"]
