"""The ctypes mirrors of the driver's launch structs (mixgemm.kernels.cuda.launch) against cuda-bindings' own:
byte for byte, so that cuLaunchKernelEx reads the grid, the stream and the PDL / cluster attributes it is given."""

from __future__ import annotations

import ctypes

import pytest

driver = pytest.importorskip("cuda.bindings.driver")

from mixgemm.kernels.cuda.launch import (  # noqa: E402
    LaunchAttribute,
    LaunchConfig,
    Params,
    launch_config,
)


def _attr(kind: str):
    a = driver.CUlaunchAttribute()
    if kind == "cluster":
        a.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = 1, 2, 3
    else:
        a.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        a.value.programmaticStreamSerializationAllowed = 1
    return ctypes.string_at(a.getPtr(), ctypes.sizeof(LaunchAttribute))


@pytest.mark.parametrize("pdl, cluster", [(True, None), (False, (1, 2, 3)), (True, (1, 2, 3))])
def test_launch_config_matches_the_driver_structs(pdl, cluster):
    grid, block, smem, stream = (5, 6, 7), (384, 1, 1), 200_000, 0xABCDEF
    cfg = launch_config(grid, block, smem, pdl, cluster)
    cfg.stream = stream
    want_attrs = ([_attr("pdl")] if pdl else []) + ([_attr("cluster")] if cluster else [])
    got_attrs = ctypes.string_at(ctypes.addressof(cfg.attrs.contents), len(want_attrs) * ctypes.sizeof(LaunchAttribute))
    assert got_attrs == b"".join(want_attrs)
    c = driver.CUlaunchConfig()
    c.gridDimX, c.gridDimY, c.gridDimZ = grid
    c.blockDimX, c.blockDimY, c.blockDimZ = block
    c.sharedMemBytes = smem
    c.hStream = driver.CUstream(stream)
    c.numAttrs = len(want_attrs)
    want = ctypes.string_at(c.getPtr(), ctypes.sizeof(LaunchConfig))
    got = ctypes.string_at(ctypes.addressof(cfg), ctypes.sizeof(LaunchConfig))
    attrs_at = LaunchConfig.attrs.offset
    assert got[:attrs_at] == want[:attrs_at] and got[attrs_at + 8:] == want[attrs_at + 8:]  # all but the pointer


def test_no_attributes_means_a_plain_launch():
    assert launch_config((1, 1, 1), (32, 1, 1), 0, False, None) is None


def test_params_point_at_their_values_and_see_writes():
    vals = [ctypes.c_void_p(16), ctypes.c_int(3), ctypes.c_float(0.5)]
    p = Params(vals)
    assert [p.array[i] for i in range(3)] == [ctypes.addressof(v) for v in vals]
    vals[0].value = 4096  # a call writes its pointers in place; the driver reads them through the same array
    assert ctypes.c_void_p.from_address(p.array[0]).value == 4096


def test_a_tensor_map_parameter_keeps_its_memory():
    """A parameter list holds only the 128-byte value of a TensorMapParam: the value alone must keep its memory alive
    (the conv's im2col map was freed before its launch when it did not) and stay 64-byte aligned."""
    import gc

    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import TensorMapParam

    class FakeMap:  # what cuda-bindings' CUtensorMap offers: the address of its 128 bytes
        def __init__(self):
            self.raw = (ctypes.c_ubyte * 128)(*range(128))

        def getPtr(self):  # noqa: N802 - cuda-bindings' name
            return ctypes.addressof(self.raw)

    params = Params([TensorMapParam(FakeMap()).value])
    gc.collect()
    for _ in range(64):  # churn the allocator over any freed block
        (ctypes.c_ubyte * 192)(*([255] * 192))
    value = params.values[0]
    assert ctypes.addressof(value) % 64 == 0 and params.array[0] == ctypes.addressof(value)
    assert bytes(value) == bytes(range(128))


def test_launch_cache_keeps_at_most_its_size():
    from mixgemm.kernels.cuda.launch import LaunchCache

    cache, made = LaunchCache(size=3), []

    def make(key):
        made.append(key)
        return ("launch", key)

    assert cache.get(1, lambda: make(1)) == ("launch", 1)
    assert cache.get(1, lambda: make(1)) == ("launch", 1) and made == [1]  # a hit makes nothing
    for key in (2, 3):
        cache.get(key, lambda key=key: make(key))
    assert len(cache) == 3
    cache.get(4, lambda: make(4))  # full: emptied, then the new one kept
    assert len(cache) == 1 and made == [1, 2, 3, 4]
    cache.get(1, lambda: make(1))
    assert made[-1] == 1 and len(cache) == 2


class _HostStream:
    """torch.cuda.current_stream()'s stand-in on a machine without a GPU (the capture arena synchronizes it)."""

    def synchronize(self):
        pass


def test_stream_buffers_are_kept_per_stream_and_grow_by_powers_of_two(monkeypatch):
    """kernels/cuda/stream_buffers: one buffer per (device, stream), reused while large enough, replaced by a power of
    two when short (the counters zeroed when made); a fresh allocation above MAX_SCRATCH_BYTES and while capturing.
    The driver allocation is replaced by CPU tensors here."""
    import torch

    from mixgemm.kernels.cuda import launch
    from mixgemm.kernels.cuda import stream_buffers as sb

    made = []

    def fake_driver_tensor(device_index, numel, dtype):
        made.append((device_index, numel, dtype))
        return torch.full((numel,), 7, dtype=dtype)

    monkeypatch.setattr(launch, "driver_tensor", fake_driver_tensor)
    monkeypatch.setattr(sb, "_SCRATCH", {})
    monkeypatch.setattr(sb, "_COUNTERS", {})
    monkeypatch.setattr(sb, "_GRAPH_ARENA", {})
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _HostStream())
    capturing = [False]
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: capturing[0])
    monkeypatch.setattr(torch, "empty", lambda n, dtype, device: ("fresh", n))
    a = sb.stream_scratch(0, 11, 1000)
    assert a.numel() == sb.MIN_SCRATCH_BYTES and sb.stream_scratch(0, 11, 5000) is a  # kept, reused
    b = sb.stream_scratch(0, 12, 1000)
    assert b is not a  # another stream, another buffer
    c = sb.stream_scratch(0, 11, sb.MIN_SCRATCH_BYTES + 1)
    assert c.numel() == 2 * sb.MIN_SCRATCH_BYTES and sb.stream_scratch(0, 11, 10) is c  # grown, then kept
    assert sb.stream_scratch(0, 11, sb.MAX_SCRATCH_BYTES + 1) == ("fresh", sb.MAX_SCRATCH_BYTES + 1)
    capturing[0] = True
    assert sb.stream_scratch(0, 11, 10) == ("fresh", 10)  # a graph being captured keeps its own
    capturing[0] = False
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 11, raising=False)
    counters = sb.tile_counters(torch.device("cuda", 0), 3000)
    assert counters.numel() == 4096 and int(counters.abs().sum()) == 0  # zeroed when made
    assert made == [(0, sb.MIN_SCRATCH_BYTES, torch.uint8), (0, sb.MIN_SCRATCH_BYTES, torch.uint8),
                    (0, 2 * sb.MIN_SCRATCH_BYTES, torch.uint8), (0, sb.GRAPH_ARENA_COUNTERS, torch.int32),
                    (0, 4096, torch.int32)]  # (the capture arena, made with the first kept counters)


def test_graph_counters_are_kept_per_capture(monkeypatch):
    """kernels/cuda/stream_buffers.graph_counters: while a CUDA graph is captured, each capture (and each table) takes
    its own slice of the device's zeroed arena once and hands it to every launch of the capture (no zeroing node per
    call); another capture gets another slice; without an arena or room in it, zeroed counters per call."""
    import torch

    from mixgemm.kernels.cuda import launch
    from mixgemm.kernels.cuda import stream_buffers as sb

    monkeypatch.setattr(launch, "driver_tensor", lambda index, numel, dtype: torch.full((numel,), 7, dtype=dtype))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _HostStream())
    for name in ("_COUNTERS", "_QUANT_COUNTERS", "_GRAPH_ARENA", "_GRAPH_COUNTERS"):
        monkeypatch.setattr(sb, name, {})
    monkeypatch.setattr(sb, "GRAPH_ARENA_COUNTERS", 1024)
    capture = [None]  # the id of the capture in progress
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: capture[0] is not None)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 11, raising=False)
    monkeypatch.setattr(sb, "_capture_id", lambda stream: capture[0])
    monkeypatch.setattr(torch, "zeros", lambda n, dtype, device: ("zeroed per call", n))
    capture[0] = 5
    assert sb.tile_counters(torch.device("cuda", 0), 100) == ("zeroed per call", 100)  # no arena yet
    capture[0] = None
    eager = sb.tile_counters(torch.device("cuda", 0), 100)  # makes the arena (zeroed)
    capture[0] = 5
    a = sb.tile_counters(torch.device("cuda", 0), 100)
    assert a.numel() == 128 and int(a.abs().sum()) == 0 and a.data_ptr() != eager.data_ptr()
    assert sb.tile_counters(torch.device("cuda", 0), 60) is a  # the same capture: the same counters
    q = sb.quantizer_counters(0, 11)
    assert q.numel() == 64 and q.data_ptr() != a.data_ptr()  # another table: its own slice
    capture[0] = 6
    b = sb.tile_counters(torch.device("cuda", 0), 100)
    assert b.data_ptr() != a.data_ptr()  # another capture: another slice
    assert sb.tile_counters(torch.device("cuda", 0), 900) == ("zeroed per call", 900)  # the arena is full
