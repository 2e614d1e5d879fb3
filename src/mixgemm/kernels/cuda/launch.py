"""Kernel launches straight into libcuda, and launches prepared once per call plan.

Why not cuda-bindings' ``cuLaunchKernel`` on every call: each call there builds Python wrapper objects (the stream,
the launch config and its attribute list) and converts every argument, tens of microseconds per launch -- more than a
decode-sized kernel runs. Here the driver entry points are called through ctypes with prebuilt C structs, and a
:class:`PreparedLaunch` keeps a kernel's whole parameter buffer between calls: a call writes only the pointers that
change (activations, output) and enters the driver once.

The driver is loaded as a ``ctypes.PyDLL``: the call keeps the GIL, so two Python threads sharing one prepared
parameter buffer cannot interleave their writes with the driver's read of it (the driver copies the parameters
before it returns).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from dataclasses import dataclass, field

import torch

from mixgemm.kernels.cuda.driver import make_primary_context_current
from mixgemm.kernels.options import current_options

CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
CUDA_ERROR_INVALID_CONTEXT = 201


class LaunchAttributeValue(ctypes.Union):
    """CUlaunchAttributeValue: a 64-byte union (8-byte aligned: some members hold pointers)."""

    _fields_ = [("pad", ctypes.c_char * 64), ("align", ctypes.c_uint64), ("dims", ctypes.c_uint * 3),
                ("flag", ctypes.c_int)]


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: the attribute id, padding to 8 bytes, the value."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", LaunchAttributeValue)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig, the first argument of cuLaunchKernelEx."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


@functools.cache
def _libcuda():
    lib = ctypes.PyDLL("libcuda.so.1")
    lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    lib.cuLaunchKernel.restype = ctypes.c_int
    lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.cuLaunchKernelEx.restype = ctypes.c_int
    lib.cuTensorMapReplaceAddress.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cuTensorMapReplaceAddress.restype = ctypes.c_int
    lib.cuMemsetD32Async.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
    lib.cuMemsetD32Async.restype = ctypes.c_int
    lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    lib.cuMemAlloc_v2.restype = ctypes.c_int
    return lib


def launch_config(grid, block, smem: int, pdl: bool, cluster) -> LaunchConfig | None:
    """The cuLaunchKernelEx config for a launch with programmatic dependent launch and / or a cluster shape; None
    when neither is asked (a plain cuLaunchKernel then). The attribute array lives on the returned struct."""
    attrs = []
    if pdl:
        a = LaunchAttribute(id=CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
        a.value.flag = 1
        attrs.append(a)
    if cluster is not None:
        a = LaunchAttribute(id=CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
        a.value.dims[:] = list(cluster)
        attrs.append(a)
    if not attrs:
        return None
    arr = (LaunchAttribute * len(attrs))(*attrs)
    cfg = LaunchConfig(grid=(ctypes.c_uint * 3)(*grid), block=(ctypes.c_uint * 3)(*block), smem=smem,
                       attrs=ctypes.cast(arr, ctypes.POINTER(LaunchAttribute)), num_attrs=len(attrs))
    cfg._keep = arr  # the struct points into this array
    return cfg


def _in_context(call, *args) -> int:
    """call(*args), a stream-ordered driver call; on CUDA_ERROR_INVALID_CONTEXT (a thread on which PyTorch has not yet
    made the device's primary context current) make it current and call once more. Returns the CUresult."""
    err = call(*args)
    if err == CUDA_ERROR_INVALID_CONTEXT:
        make_primary_context_current(torch.cuda.current_device())
        err = call(*args)
    return err


def raw_launch(fn: int, grid, block, smem: int, stream: int, params_addr: int, config: LaunchConfig | None) -> None:
    """Launch the CUfunction handle fn with the void*[] parameter array at params_addr on the stream handle."""
    lib = _libcuda()
    if config is None:
        err = _in_context(lib.cuLaunchKernel, fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem,
                          stream, params_addr, None)
    else:
        config.stream = stream
        err = _in_context(lib.cuLaunchKernelEx, ctypes.byref(config), fn, params_addr, None)
    if err:
        raise RuntimeError(f"cuLaunchKernel{'Ex' if config is not None else ''} failed: CUresult {err}")


def memset_zero_async(ptr: int, nbytes: int, stream: int) -> None:
    """Zero nbytes (a multiple of 4) at the device address ptr, in stream order (one driver call, no kernel launch
    from the host side)."""
    err = _in_context(_libcuda().cuMemsetD32Async, ptr, 0, nbytes // 4, stream)
    if err:
        raise RuntimeError(f"cuMemsetD32Async failed: CUresult {err}")


class _DriverMemory:
    """Device memory from cuMemAlloc seen by torch through __cuda_array_interface__ (torch.as_tensor wraps it without a
    copy, and the tensor keeps this object alive). Never freed: a launch queued by another thread may still hold the
    address."""

    def __init__(self, device_index: int, numel: int, dtype: torch.dtype):
        self.device_index = device_index
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        ptr = ctypes.c_uint64(0)
        with torch.cuda.device(device_index):
            err = _in_context(_libcuda().cuMemAlloc_v2, ctypes.byref(ptr), nbytes)
        if err:
            raise RuntimeError(f"cuMemAlloc of {nbytes} bytes on cuda:{device_index} failed: CUresult {err}")
        self.ptr = ptr.value
        typestr = {torch.uint8: "|u1", torch.int32: "<i4"}[dtype]
        self.__cuda_array_interface__ = {"shape": (numel,), "typestr": typestr, "data": (self.ptr, False),
                                         "version": 2}


def driver_tensor(device_index: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor of numel on cuda:device_index whose memory comes straight from the driver (cuMemAlloc), outside
    PyTorch's caching allocator and so outside any CUDA-graph memory pool a caller may be allocating into: for buffers
    kept for the life of the process (a pool checks that nothing it did not return stays alive). Uninitialized, never
    freed."""
    return torch.as_tensor(_DriverMemory(device_index, numel, dtype), device=torch.device("cuda", device_index))


def replace_tensor_map_address(map_addr: int, ptr: int) -> None:
    """Point the 128-byte CUtensorMap at map_addr to the global address ptr (same shape and strides)."""
    err = _libcuda().cuTensorMapReplaceAddress(map_addr, ptr)
    if err:
        raise RuntimeError(f"cuTensorMapReplaceAddress failed: CUresult {err}")


# the allocation inductor's generated code calls: no Python argument parser (about half of torch.empty's host time)
try:
    from torch._C._dynamo.guards import _empty_strided_cuda
except ImportError:  # a PyTorch without it: torch.empty
    _empty_strided_cuda = None


def pdl_on(device) -> bool:
    """Whether a kernel prepared for ``device`` is launched with programmatic dependent launch: kernel_options' pdl
    (MIXGEMM_PDL) on a GPU of sm_90 or later, where griddepcontrol exists."""
    return current_options().pdl and torch.cuda.get_device_capability(device)[0] >= 9


def _new_strided(size: tuple, stride: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialized contiguous tensor of ``size`` (``stride``: its contiguous strides) on ``device``: from the
    allocator inductor's generated code calls where ``device`` is the current CUDA device, else torch.empty."""
    global _empty_strided_cuda
    if _empty_strided_cuda is not None and device.type == "cuda" and torch._C._cuda_getDevice() == device.index:
        try:
            return _empty_strided_cuda(size, stride, dtype)
        except TypeError:  # a private function: another signature in this PyTorch, so torch.empty from now on
            _empty_strided_cuda = None
    return torch.empty(size, dtype=dtype, device=device)


def new_rows(m: int, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.empty(m, n, dtype=dtype, device=device) for a launch's output, on the fastest path PyTorch offers: a
    prepared launch's host time is what an eager decode step or a compiled graph without CUDA graphs pays per layer."""
    return _new_strided((m, n), (n, 1), dtype, device)


def new_rows_like(lead: torch.Size, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """new_rows for an output of shape (*lead, n), contiguous: a [batch, tokens, K] input's output comes out in its
    shape with no view (transformers' layers call with 3-D inputs, once per layer and decode step)."""
    if len(lead) == 2:  # [batch, tokens]: the usual case, spelled out
        return _new_strided((lead[0], lead[1], n), (lead[1] * n, n, 1), dtype, device)
    size, inner = (*lead, n), [1]
    for d in reversed(size[1:]):
        inner.append(inner[-1] * d)
    return _new_strided(size, tuple(reversed(inner)), dtype, device)


class Params:
    """A kernel's parameter buffer: the ctypes value of each parameter (kept alive here, in the kernel's order) and
    the void* array of their addresses that the driver reads. Values are written in place between launches, so a
    caller holds ``lock`` from its first write to the launch: two Python threads calling one layer would otherwise
    interleave there (the GIL switches between bytecodes and is released inside the driver call, which reads the
    buffer), and one launch could run with the other's pointers."""

    def __init__(self, values: list):
        self.values = values
        self.lock = threading.Lock()
        self.array = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        self.addr = ctypes.addressof(self.array)


@dataclass
class PreparedLaunch:
    """One kernel launch with everything but the per-call pointers fixed: function, grid, block, dynamic shared
    memory, parameters, and the launch attributes (PDL, cluster), on the CUDA device ``device_index`` (calls go on its
    current stream). ``first_without_pdl``: the first launch goes without programmatic dependent launch (the weight's
    layout was just built by kernels that write what a PDL kernel reads before its dependency wait)."""

    fn: int
    device_index: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    params: Params
    pdl: bool = False
    cluster: tuple[int, int, int] | None = None
    first_without_pdl: bool = False
    _config: LaunchConfig | None = field(default=None, repr=False)

    def __post_init__(self):
        self._config = launch_config(self.grid, self.block, self.smem, self.pdl, self.cluster)
        if self.first_without_pdl and self.pdl:
            self._first = launch_config(self.grid, self.block, self.smem, False, self.cluster)
        else:
            self.first_without_pdl = False
        # the steady-state call (__call__ after the first): cuLaunchKernelEx on the prebuilt config through one
        # pointer made here, or cuLaunchKernel with the geometry as ctypes arguments made here (each per-call ctypes
        # object and Python frame is a fraction of a microsecond on a launch that costs a few)
        lib = _libcuda()
        if self._config is not None:
            self._ex_args = (ctypes.pointer(self._config), ctypes.c_void_p(self.fn), ctypes.c_void_p(self.params.addr))
        else:
            self._args = (ctypes.c_void_p(self.fn), *(ctypes.c_uint(v) for v in (*self.grid, *self.block, self.smem)))
            self._params_arg = ctypes.c_void_p(self.params.addr)
        self._ex, self._plain = lib.cuLaunchKernelEx, lib.cuLaunchKernel

    def current_stream(self) -> int:
        """The handle of the device's current stream (PyTorch's: graph capture and stream contexts included)."""
        return torch._C._cuda_getCurrentRawStream(self.device_index)

    def __call__(self, stream: int | None = None) -> None:
        """Launch on ``stream`` (default: the device's current stream)."""
        if stream is None:
            stream = torch._C._cuda_getCurrentRawStream(self.device_index)
        if self.first_without_pdl:
            self.first_without_pdl = False
            raw_launch(self.fn, self.grid, self.block, self.smem, stream, self.params.addr, self._first)
            return
        if self._config is not None:
            self._config.stream = stream
            err = self._ex(*self._ex_args, None)
        else:
            err = self._plain(*self._args, stream, self._params_arg, None)
        if err:  # another thread's first launch (no current context), or a real failure: the general path says which
            raw_launch(self.fn, self.grid, self.block, self.smem, stream, self.params.addr, self._config)


class LaunchCache:
    """Prepared launches by key (shape, dtype, device, options), at most ``size`` of them: emptied when full, because
    prefill lengths vary and each new M would otherwise keep a launch forever."""

    def __init__(self, size: int = 256):
        self.size = size
        self._launches: dict = {}

    def get(self, key, make):
        """The launch kept for ``key``, made by ``make()`` on a miss."""
        launch = self._launches.get(key)
        if launch is None:
            if len(self._launches) >= self.size:
                self._launches.clear()
            launch = self._launches[key] = make()
        return launch

    def __len__(self) -> int:
        return len(self._launches)
