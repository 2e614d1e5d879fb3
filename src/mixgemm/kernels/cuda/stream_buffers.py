"""Device buffers kept per (device, stream) for kernels that pass data to the next kernel on the same stream: the
int8-activation calls' scratch (at most MAX_SCRATCH_BYTES), the serial split-K's tile counters and the in-launch
activation quantizer's two counters, in driver memory outside torch.cuda's memory statistics. Counters a CUDA graph
captures are kept per capture instead (graph_counters).

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
# Counters for CUDA-graph captures: one zeroed driver buffer per device, made outside a capture (a graph is captured
# after eager warm-up calls), from which each capture takes its own slices (graph_counters). 1 Mi int32: the small-M
# launches that count take at most a few thousand each.
GRAPH_ARENA_COUNTERS = 1 << 20
_GRAPH_ARENA: dict = {}  # device index -> [zeroed int32 tensor, first free counter]
_GRAPH_COUNTERS: dict = {}  # (table's name, device index, capture id) -> tensor
_GRAPH_LOCK = threading.Lock()


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


def _counters(table: dict, name: str, device_index: int, stream: int, numel: int, least: int) -> torch.Tensor:
    """int32 counters that a kernel finds zero on entry and leaves zero: made and zeroed once per device and stream
    (``table`` keeps them); while the stream captures a CUDA graph, the capture's own (graph_counters), or where the
    arena is missing or full zeroed ones per call (the zeroing then a node of the graph)."""
    if torch._C._cuda_isCurrentStreamCapturing():
        hit = graph_counters(name, device_index, stream, numel)
        if hit is None:
            hit = torch.zeros(numel, dtype=torch.int32, device=torch.device("cuda", device_index))
        return hit
    _graph_arena(device_index)
    return _kept(table, device_index, stream, numel, torch.int32, least, True)


def _graph_arena(device_index: int) -> None:
    """Make the device's zeroed capture arena (outside a capture: the zeroing, on the current stream, finishes before
    this returns; a stream's, not the device's, synchronization, which another thread's capture would forbid)."""
    if device_index in _GRAPH_ARENA:
        return
    from mixgemm.kernels.cuda.launch import driver_tensor

    with _GRAPH_LOCK:
        if device_index not in _GRAPH_ARENA:
            t = driver_tensor(device_index, GRAPH_ARENA_COUNTERS, torch.int32)
            t.zero_()
            torch.cuda.current_stream(device_index).synchronize()
            _GRAPH_ARENA[device_index] = [t, 0]


def graph_counters(name: str, device_index: int, stream: int, numel: int) -> torch.Tensor | None:
    """Counters for the launches of one CUDA-graph capture on ``stream``: a slice of the device's zeroed arena taken
    once per capture (and table ``name``) and handed to each of its launches, or None without an arena or room in it.
    Why: zeroed counters per call put a memset node before each counting launch of the graph (H100, W4 28672x8192 at
    M = 16, the serial split-K: 55.7 against 52.7 us a call). Why it is safe: the launches of one capture run in
    stream order on replay and each leaves its counters zero, as on a kept buffer; two captures never share a slice, so
    two graphs may replay at once on two streams. An arena slice is not reused (ids are unique per process)."""
    cid = _capture_id(stream)
    if cid is None:
        return None
    key = (name, device_index, cid)
    hit = _GRAPH_COUNTERS.get(key)
    if hit is not None and hit.numel() >= numel:
        return hit
    with _GRAPH_LOCK:
        arena = _GRAPH_ARENA.get(device_index)
        size = -(-numel // 64) * 64
        if arena is None or arena[1] + size > arena[0].numel():
            return None
        t = arena[0][arena[1]: arena[1] + size]
        arena[1] += size
    _GRAPH_COUNTERS[key] = t
    return t


def _capture_id(stream: int) -> int | None:
    """The id of the capture sequence ``stream`` (a raw handle) is in, unique over the process, or None."""
    from cuda.bindings import driver

    out = driver.cuStreamGetCaptureInfo(driver.CUstream(stream))
    if out[0] != driver.CUresult.CUDA_SUCCESS or out[1] != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
        return None
    return int(out[2])


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """An int32 counter per output tile for the serial split-K (WG_SPLIT 3), on the current stream (the last slice of
    a tile resets its counter: see _counters)."""
    return _counters(_COUNTERS, "tiles", device.index, torch._C._cuda_getCurrentRawStream(device.index), tiles,
                     MIN_COUNTERS)


def quantizer_counters(device_index: int, stream: int) -> torch.Tensor:
    """The two int32 counters of the int8 GEMM's in-launch activation quantizer (gemm_wgmma_a8.cu, A8_FQ) on
    ``stream`` (the last GEMM block past the wait resets both: see _counters)."""
    return _counters(_QUANT_COUNTERS, "quantizer", device_index, stream, 2, 64)
