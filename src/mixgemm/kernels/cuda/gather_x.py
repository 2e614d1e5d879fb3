"""The act-order input gather (gather_x.cu): x[:, perm] for a layer whose K was sorted by group at load, written
zero-padded to the kernel permutation's length (mixgemm.ops.dispatch.kernel_perm), so the GEMVs read it like a plain
layer's padded x. Launched with programmatic dependent launch where the GPU has it (sm_90): the kernel after it starts
its weight loads while the gather waits for x (gather_x.cu says why)."""

from __future__ import annotations

import ctypes

import torch

from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.launch import LaunchCache, pdl_on
from mixgemm.kernels.options import current_options

SOURCE, KERNEL = "gather_x.cu", "mixgemm_gather_x"
THREADS = 128
_X, _LDX, _PERM, _Y = 0, 1, 3, 4  # per-call parameters' positions


class GatherLaunch:
    """The gather prepared for (M, K, padded K, dtype, device): a call makes the output [M, Kp], writes the pointers
    and launches on the current stream (CUDA-graph capturable: no host sync, one allocation)."""

    __slots__ = ("launch", "m", "kp", "dtype", "device", "_vals", "_lock")

    def __init__(self, m: int, k: int, kp: int, dtype: torch.dtype, device: torch.device):
        es = torch.empty((), dtype=dtype).element_size()
        fn = nvrtc.get_function(SOURCE, KERNEL, {"GX_ES": es}, device)
        per = 16 // es
        grid = (-(-kp // (per * THREADS)), m, 1)
        args = [ctypes.c_void_p(0), ctypes.c_int(0), ctypes.c_int(k), ctypes.c_void_p(0), ctypes.c_void_p(0),
                ctypes.c_int(kp * es // 16), ctypes.c_int(kp)]
        self.launch = nvrtc.prepare_launch(fn, device, grid, (THREADS, 1, 1), args, pdl=pdl_on(device))
        self.m, self.kp, self.dtype, self.device = m, kp, dtype, device
        self._vals, self._lock = self.launch.params.values, self.launch.params.lock

    def __call__(self, x2d: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
        y = torch.empty((self.m, self.kp), dtype=self.dtype, device=self.device)
        v = self._vals
        with self._lock:  # (launch.Params: written and launched by one thread at a time)
            v[_X].value = x2d.data_ptr()
            v[_LDX].value = x2d.stride(0)
            v[_PERM].value = perm.data_ptr()
            v[_Y].value = y.data_ptr()
            self.launch()
        return y


_launches = LaunchCache()  # by (M, K, Kp, dtype, device, PDL)


def gather_x(x2d: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """x2d[:, perm[:K]] zero-padded to perm's length Kp, as [M, Kp] contiguous (x2d: [M, K] on CUDA, float16 /
    bfloat16 / float32, unit stride along K; perm: a kernel permutation from kernel_perm, int32 [Kp] padded with the
    identity, on x's device). The caller's tensor is not modified."""
    m, k = x2d.shape
    kp = perm.numel()
    if x2d.stride(1) != 1 or perm.dtype != torch.int32 or kp % 64 or kp < k or perm.device != x2d.device:
        raise ValueError(f"gather_x: x must be [M, K] with unit stride along K and perm an int32 kernel permutation "
                         f"(a multiple of 64, >= K) on x's device; got x {tuple(x2d.shape)} strides {x2d.stride()}, "
                         f"perm {perm.dtype} [{kp}] on {perm.device}")
    key = (m, k, kp, x2d.dtype, x2d.device.index, current_options().pdl)
    return _launches.get(key, lambda: GatherLaunch(m, k, kp, x2d.dtype, x2d.device))(x2d, perm)
