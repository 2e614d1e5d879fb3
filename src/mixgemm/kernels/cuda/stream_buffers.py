"""Device buffers kept per (device, stream) for kernels that pass data to the next kernel on the same stream: the
int8-activation calls' scratch (at most MAX_SCRATCH_BYTES), the serial split-K's tile counters and the in-launch
activation quantizer's two counters, in driver memory outside torch.cuda's memory statistics.

Why per stream: launches on one stream run in order (a PDL kernel touches such a buffer only after
griddepcontrol.wait), so a buffer one launch writes and the next reads can serve every call on that stream, as
cuBLAS keeps its workspace per handle and stream; two streams could run two calls at once, so each has its own.
Why keep them: an allocation is a few microseconds of host time, which an eager decode step pays per layer.
"""

from __future__ import annotations

import threading

import torch

# Held across "write the scratch, launch its reader": two host threads may share a stream (PyTorch's default stream is
# every thread's), and a second thread's writer queued between the first one's writer and reader would overwrite what
# the reader is about to read; under the lock the pair is queued together, and stream order does the rest.
SCRATCH_LOCK = threading.Lock()
# Scratch above this size is allocated per call: kept for good it would hold prefill-sized memory outside the caching
# allocator, where the host time of an allocation is small beside the kernels anyway. 16 MiB: M = 512 rows of K up to
# 32k int8 codes.
MAX_SCRATCH_BYTES = 16 << 20
MIN_SCRATCH_BYTES = 1 << 20
MIN_COUNTERS = 1024

_SCRATCH: dict = {}  # (device index, stream) -> tensor
_COUNTERS: dict = {}
_QUANT_COUNTERS: dict = {}


def _kept(table: dict, device_index: int, stream: int, numel: int, dtype: torch.dtype, least: int,
          zeroed: bool) -> torch.Tensor:
    """The buffer ``table`` keeps for (device, stream), replaced by one of a power of two >= numel (and >= least)
    when short: driver memory (launch.driver_tensor), so that a buffer first made while a CUDA graph is warmed up or
    recorded does not come out of its memory pool. A replaced one is not freed (a launch another thread is queuing may
    hold its address): at most as much again as the largest, a few times per stream. ``zeroed``: zero it, in stream
    order, when it is made."""
    key = (device_index, stream)
    hit = table.get(key)
    if hit is not None and hit.numel() >= numel:
        return hit
    from mixgemm.kernels.cuda.launch import driver_tensor

    t = driver_tensor(device_index, max(least, 1 << (numel - 1).bit_length()), dtype)
    if zeroed:
        t.zero_()
    table[key] = t
    return t


def stream_scratch(device_index: int, stream: int, nbytes: int) -> torch.Tensor:
    """uint8 [>= nbytes] on cuda:device_index that the caller's kernels on ``stream`` (a raw handle, the current one)
    may write and read within one call: up to MAX_SCRATCH_BYTES the same buffer for every call on that stream; above
    it, and while the stream captures a CUDA graph (whose replays may run on another stream), a fresh one each call."""
    if nbytes > MAX_SCRATCH_BYTES or torch._C._cuda_isCurrentStreamCapturing():
        return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))
    return _kept(_SCRATCH, device_index, stream, nbytes, torch.uint8, MIN_SCRATCH_BYTES, False)


def _counters(table: dict, device_index: int, stream: int, numel: int, least: int) -> torch.Tensor:
    """int32 counters that a kernel finds zero on entry and leaves zero: made and zeroed once per device and stream
    (``table`` keeps them); while the stream captures a CUDA graph, zeroed ones of the graph's own (the zeroing is part
    of the graph)."""
    if torch._C._cuda_isCurrentStreamCapturing():
        return torch.zeros(numel, dtype=torch.int32, device=torch.device("cuda", device_index))
    return _kept(table, device_index, stream, numel, torch.int32, least, True)


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """An int32 counter per output tile for the serial split-K (WG_SPLIT 3), on the current stream (the last slice of
    a tile resets its counter: see _counters)."""
    return _counters(_COUNTERS, device.index, torch._C._cuda_getCurrentRawStream(device.index), tiles, MIN_COUNTERS)


def quantizer_counters(device_index: int, stream: int) -> torch.Tensor:
    """The two int32 counters of the int8 GEMM's in-launch activation quantizer (gemm_wgmma_a8.cu, A8_FQ) on
    ``stream`` (the last GEMM block past the wait resets both: see _counters)."""
    return _counters(_QUANT_COUNTERS, device_index, stream, 2, 64)
