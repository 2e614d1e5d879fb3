"""mixgemm's RMSNorm kernel (rms_norm.cu): optionally with the residual add before it and the output gathered through
an act-order permutation, one kernel either way, launched with programmatic dependent launch where the GPU has it
(sm_90). rms_norm.cu says why it exists beside inductor's fused norm."""

from __future__ import annotations

import ctypes

import torch

from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.launch import LaunchCache, new_rows, new_rows_like, pdl_on
from mixgemm.kernels.options import current_options

SOURCE, KERNEL = "rms_norm.cu", "mixgemm_rms_norm"
SMEM_LIMIT = 48 * 1024 - 256  # the row of h in shared memory, within the default dynamic limit (beside red[32])
PRE = 2  # RN_PRE: 16-byte pieces per thread whose constants are read before the wait
_DTYPES = {torch.float16: (2, 0), torch.bfloat16: (2, 1), torch.float32: (4, 0)}
_A, _LDA, _B, _LDB, _H, _LDH, _W, _PERM, _Y, _LDY = range(10)  # per-call parameters' positions


def unsupported_reason(x2d: torch.Tensor, weight: torch.Tensor, perm: torch.Tensor | None) -> str | None:
    """Why the kernel cannot take rows x2d [M, K] (None when it can): the caller then runs the torch composite."""
    if not x2d.is_cuda:
        return "x is not on a CUDA device"
    if x2d.dtype not in _DTYPES:
        return f"dtype {x2d.dtype} (float16, bfloat16 or float32)"
    if weight.dtype != x2d.dtype or weight.device != x2d.device or weight.dim() != 1 or not weight.is_contiguous():
        return "the weight is not a contiguous [K] tensor of x's dtype on x's device"
    m, k = x2d.shape
    es = x2d.element_size()
    if not m or k * es % 16 or k * es > SMEM_LIMIT:
        return f"K = {k} ({k * es} bytes a row: a nonzero multiple of 16 up to {SMEM_LIMIT})"
    if x2d.stride(1) != 1 or x2d.stride(0) * es % 16 or x2d.data_ptr() % 16 or weight.numel() != k:
        return "rows not 16-byte aligned with unit stride"
    if perm is not None and (perm.dtype != torch.int32 or perm.numel() < k or perm.device != x2d.device
                             or perm.data_ptr() % 16):
        return "perm is not a kernel permutation (int32, >= K, 16-byte aligned) on x's device"
    if not nvrtc.nvrtc_available():
        return "NVRTC is not available"
    return None


class NormLaunch:
    """The kernel prepared for (M, K, with or without the add, gathered or not, dtype, device, eps): a call allocates
    the outputs, writes the pointers and launches on the current stream (CUDA-graph capturable: no host sync)."""

    __slots__ = ("launch", "m", "k", "add", "dtype", "device", "_vals", "_lock")

    def __init__(self, m: int, k: int, add: bool, gather: bool, dtype: torch.dtype, device: torch.device,
                 eps: float, unit: bool = False):
        es, bf16 = _DTYPES[dtype]
        defines = {"RN_ES": es, "RN_BF16": bf16, "RN_ADD": int(add), "RN_PERM": int(gather), "RN_PRE": PRE}
        if unit:
            defines["RN_UNIT"] = 1
        fn = nvrtc.get_function(SOURCE, KERNEL, defines, device)
        pieces = k * es // 16
        threads = min(1024, max(64, -(-pieces // 32) * 32))
        args = [ctypes.c_void_p(0), ctypes.c_int(0), ctypes.c_void_p(0), ctypes.c_int(0), ctypes.c_void_p(0),
                ctypes.c_int(0), ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_int(0),
                ctypes.c_int(k), ctypes.c_float(eps)]
        self.launch = nvrtc.prepare_launch(fn, device, (m, 1, 1), (threads, 1, 1), args, shared_bytes=k * es,
                                           pdl=pdl_on(device))
        self.m, self.k, self.add, self.dtype, self.device = m, k, add, dtype, device
        self._vals, self._lock = self.launch.params.values, self.launch.params.lock

    def __call__(self, a: torch.Tensor, b: torch.Tensor | None, weight: torch.Tensor,
                 perm: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor]:
        v = self._vals
        y = new_rows(self.m, self.k, self.dtype, self.device)
        h = new_rows(self.m, self.k, self.dtype, self.device) if self.add else None
        with self._lock:  # (launch.Params: written and launched by one thread at a time)
            v[_A].value, v[_LDA].value = a.data_ptr(), a.stride(0)
            if self.add:
                v[_B].value, v[_LDB].value = b.data_ptr(), b.stride(0)
                v[_H].value, v[_LDH].value = h.data_ptr(), self.k
            v[_W].value = weight.data_ptr()
            v[_PERM].value = 0 if perm is None else perm.data_ptr()
            v[_Y].value, v[_LDY].value = y.data_ptr(), self.k
            self.launch()
        return h, y

    def rows(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """norm(x) for a contiguous x [..., K] of the prepared M rows, 16-byte aligned (a launch prepared without the
        add and the gather), in x's shape: the path of an eager norm's repeated call (mixgemm.nn.norms)."""
        v = self._vals
        y = new_rows_like(x.shape[:-1], self.k, self.dtype, self.device)
        with self._lock:
            v[_A].value, v[_LDA].value = x.data_ptr(), self.k
            v[_W].value = weight.data_ptr()
            v[_PERM].value = 0
            v[_Y].value, v[_LDY].value = y.data_ptr(), self.k
            self.launch()
        return y


_launches = LaunchCache()  # by (M, K, add, gather, dtype, device, eps, formula, PDL)


def rms_norm_rows(a: torch.Tensor, b: torch.Tensor | None, weight: torch.Tensor, eps: float,
                  perm: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(h, norm(h)) for rows a [M, K] (h = a + b when b is given, else None and the norm of a), the norm's output
    gathered through ``perm`` (a kernel permutation, mixgemm.ops.dispatch.kernel_perm) when given. The caller checked
    unsupported_reason for a (and b, which must match a's shape, dtype and alignment)."""
    m, k = a.shape
    return norm_launch(m, k, b is not None, perm is not None, a.dtype, a.device, eps)(a, b, weight, perm)


def norm_launch(m: int, k: int, add: bool, gather: bool, dtype: torch.dtype, device: torch.device,
                eps: float, unit: bool = False) -> NormLaunch:
    """The kernel prepared for M rows of K, with or without the add and the gather, transformers' formula or (unit)
    Gemma's (shared by every norm of that key: a call writes all the pointers it reads)."""
    key = (m, k, add, gather, dtype, device.index, float(eps), unit, current_options().pdl)
    return _launches.get(key, lambda: NormLaunch(m, k, add, gather, dtype, device, eps, unit))
