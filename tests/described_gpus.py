"""GPUs described for dispatch decisions checked on the CPU (``mixgemm.explain(..., device=...)``, the registry's
``choose``): what the tables and rules read of a device, no device needed."""

from mixgemm.kernels.registry import DeviceInfo

H100 = DeviceInfo("cuda", 0, (9, 0), 132, "NVIDIA H100 80GB HBM3", 227 * 1024)
H200 = DeviceInfo("cuda", 0, (9, 0), 132, "NVIDIA H200", 227 * 1024)
A100 = DeviceInfo("cuda", 0, (8, 0), 108, "NVIDIA A100-SXM4-80GB", 163 * 1024)
