"""Prepared launches called from several Python threads at once: each launch must read the parameters its own call
wrote. A prepared launch's parameter buffer is written in place per call and read by the driver during the launch
(ctypes releases the GIL there), so the owner holds the buffer's lock from its first write to the launch
(mixgemm.kernels.cuda.launch.Params). Checked on the CPU with a stand-in for the driver call that yields to the
other thread while it reads the buffer, as a real launch can."""

from __future__ import annotations

import ctypes
import threading
import time
from types import SimpleNamespace

import torch

from mixgemm.kernels.cuda.gemv_launch import GemvLaunch
from mixgemm.kernels.cuda.launch import Params

K, N, CALLS = 64, 8, 200


class _YieldingLaunch:
    """Records (thread, x pointer, y pointer) as it reads them from the buffer, yielding between the two reads."""

    def __init__(self):
        # the CUDA-core GEMV's parameter order: W, params, x, x stride, y, y stride, bias, bias code, lo, hi, ..., perm
        self.params = Params([ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_int(0),
                              ctypes.c_void_p(0), ctypes.c_int(0), ctypes.c_void_p(0), ctypes.c_int(0),
                              ctypes.c_float(0), ctypes.c_float(0), ctypes.c_void_p(0)])
        self.seen = []

    def __call__(self, stream=None):
        v = self.params.values
        x = v[2].value
        time.sleep(0)  # the other thread runs here, as it may while the driver reads the buffer
        self.seen.append((threading.get_ident(), x, v[4].value))


def test_concurrent_calls_of_one_launch_read_their_own_parameters():
    fake = _YieldingLaunch()
    launch = GemvLaunch(fake, SimpleNamespace(k_padded=K), 1, N, torch.float32, torch.device("cpu"))
    xs, outs, errors = {}, {}, []
    start = threading.Barrier(2)

    def worker():
        me = threading.get_ident()
        x = torch.randn(1, 1, K)  # 3-D: the launch's output takes x's leading shape
        xs[me], outs[me] = x.data_ptr(), set()
        try:
            start.wait()
            for _ in range(CALLS):
                y = launch(x, None, -float("inf"), float("inf"))
                outs[me].add(y.data_ptr())
                time.sleep(0)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(fake.seen) == 2 * CALLS
    # every launch saw the x of the thread that made it (and an output of that thread's calls)
    assert all(x == xs[tid] for tid, x, _ in fake.seen)
    assert all(y in outs[tid] for tid, _, y in fake.seen)


def test_outputs_take_the_callers_shape_contiguous(monkeypatch):
    """launch.new_rows_like: a launch's output for x [..., K] is (*lead, N) with contiguous strides, from inductor's
    allocator on the current CUDA device (a stand-in here, on the CPU), for leading shapes of rank 0 to 3."""
    import mixgemm.kernels.cuda.launch as launch

    made = []

    def allocate(size, stride, dtype):
        made.append((size, stride))
        return torch.empty_strided(size, stride, dtype=dtype)

    monkeypatch.setattr(launch, "_empty_strided_cuda", allocate)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    for lead in ((), (7,), (2, 3), (2, 3, 4)):
        y = launch.new_rows_like(torch.Size(lead), 5, torch.float16, torch.device("cuda", 0))
        want = torch.empty(*lead, 5)
        assert y.shape == want.shape and y.stride() == want.stride() and y.dtype == torch.float16
        assert made[-1] == (tuple(want.shape), want.stride())
    assert launch.new_rows_like(torch.Size((2, 3)), 5, torch.float16, torch.device("cpu")).shape == (2, 3, 5)
    assert len(made) == 4  # (the CPU device: torch.empty)
