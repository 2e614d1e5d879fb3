"""CPU kernels: PyTorch's own int4 / int8 weight-only GEMMs (``cpu_linear``) and the dequantizing fallback
(``dequant_linear``) for what they cannot take. Entered from mixgemm.ops.matmul's CPU branch."""

from mixgemm.kernels.cpu.dequant import dequant_linear
from mixgemm.kernels.cpu.linear import cpu_can_run, cpu_linear

__all__ = ["cpu_can_run", "cpu_linear", "dequant_linear"]
