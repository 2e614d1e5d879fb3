"""Timing two routes of one problem on the GPU (the results live in mixgemm.tuning.races).

A race runs each contender WARMUP times, captures REPS calls in a CUDA graph and times ROUNDS replays between CUDA
events (the median per call). It runs only where timing is possible and harmless: on a CUDA device, outside CUDA-graph
capture and torch.compile tracing.
A route must beat the incumbent by ``margin`` (noise; the incumbent is the quantized kernel, which holds less memory).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mixgemm.tuning.races import RaceResult

WARMUP = 2
REPS = 5
ROUNDS = 5


def can_time(device: torch.device) -> bool:
    """True where a race may run now: CUDA, not capturing a graph, not tracing under torch.compile."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if torch.compiler.is_compiling():
        return False
    return not torch.cuda.is_current_stream_capturing()


def time_us(fn: Callable[[], object], device: torch.device) -> float:
    """Median microseconds of one fn() call, from CUDA-graph replays of REPS calls (eager timing would measure the
    host's launch path, not the GPU's work: a small layer's kernels finish before Python issues the next)."""
    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(REPS):
                fn()
        graph.replay()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(ROUNDS)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(ROUNDS)]
        for s, e in zip(starts, ends, strict=True):
            s.record()
            graph.replay()
            e.record()
        ends[-1].synchronize()
        times = sorted(s.elapsed_time(e) * 1e3 / REPS for s, e in zip(starts, ends, strict=True))
        del graph
    return times[len(times) // 2]


def race(incumbent: tuple[str, Callable[[], object]], challenger: tuple[str, Callable[[], object]], m: int,
         device: torch.device, margin: float = 1.03, timer=time_us) -> RaceResult:
    """Time both routes; the challenger wins only when the incumbent takes more than ``margin`` times its time."""
    times = {name: timer(fn, device) for name, fn in (incumbent, challenger)}
    wins = times[incumbent[0]] > margin * times[challenger[0]]
    return RaceResult(times_us=times, winner=challenger[0] if wins else incumbent[0], m=m)
