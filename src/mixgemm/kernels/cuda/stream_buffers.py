"""Device buffers kept per (device, stream) for kernels that pass data to the next kernel on the same stream (at most
MAX_SCRATCH_BYTES of scratch per stream that ran a decode-sized int8-activation call, outside torch.cuda's
memory statistics).

Why per stream: launches on one stream run in order (a PDL kernel touches such a buffer only after
griddepcontrol.wait), so a buffer one launch writes and the next reads can serve every call on that stream, as
cuBLAS keeps its workspace per handle and stream; two streams could run two calls at once, so each has its own.
Why keep them: an allocation is a few microseconds of host time, which an eager decode step pays per layer.
"""

from __future__ import annotations

import torch

# Scratch above this size is allocated per call: kept for good it would hold prefill-sized memory outside the caching
# allocator, where the host time of an allocation is small beside the kernels anyway. 16 MiB: M = 512 rows of K up to
# 32k int8 codes.
MAX_SCRATCH_BYTES = 16 << 20
MIN_SCRATCH_BYTES = 1 << 20

_SCRATCH: dict = {}  # (device index, stream) -> (address, bytes)
_COUNTERS: dict = {}


def stream_scratch(device_index: int, stream: int, nbytes: int) -> tuple[int, torch.Tensor | None]:
    """(address, holder): >= nbytes on cuda:device_index that the caller's kernels on ``stream`` (a raw handle) may
    write and read within one call. Up to MAX_SCRATCH_BYTES, one buffer per stream (holder None), the same for every
    call, taken from the driver, not from PyTorch's allocator: a buffer kept across calls must not come out of the
    memory pool of a CUDA graph being warmed up or recorded (which checks that nothing it did not return stays
    alive). It grows by powers of two, the old one freed after a device synchronize (a few times per stream at
    most). Above MAX_SCRATCH_BYTES, and while the stream captures a CUDA graph (whose replays may run on another
    stream), a fresh tensor each call: the holder, to keep alive until the launches are queued."""
    if nbytes > MAX_SCRATCH_BYTES or torch._C._cuda_isCurrentStreamCapturing():
        buf = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))
        return buf.data_ptr(), buf
    key = (device_index, stream)
    hit = _SCRATCH.get(key)
    if hit is not None and hit[1] >= nbytes:
        return hit[0], None
    from mixgemm.kernels.cuda.launch import driver_alloc, driver_free

    if hit is not None:
        driver_free(device_index, hit[0])
    size = max(MIN_SCRATCH_BYTES, 1 << (nbytes - 1).bit_length())
    _SCRATCH[key] = (driver_alloc(device_index, size), size)
    return _SCRATCH[key][0], None


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """An int32 counter per output tile for the serial split-K (WG_SPLIT 3), zero on entry and left zero by every
    launch (the last slice of a tile resets its counter), so it is allocated and zeroed once per device and stream,
    not per call."""
    key = (device, torch.cuda.current_stream(device).cuda_stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < tiles:
        buf = torch.zeros(max(tiles, 1024), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf
