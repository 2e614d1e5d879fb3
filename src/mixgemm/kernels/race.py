"""Timing two routes of one problem on the GPU (the results live in mixgemm.tuning.races).

A race runs each contender WARMUP times, then REPS times between CUDA events, and takes the median. It runs only
where timing is possible and harmless: on a CUDA device, outside CUDA-graph capture and torch.compile tracing.
A route must beat the incumbent by ``margin`` (noise; the incumbent is the quantized kernel, which holds less memory).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mixgemm.tuning.races import RaceResult

WARMUP = 2
REPS = 7


def can_time(device: torch.device) -> bool:
    """True where a race may run now: CUDA, not capturing a graph, not tracing under torch.compile."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if torch.compiler.is_compiling():
        return False
    return not torch.cuda.is_current_stream_capturing()


def time_us(fn: Callable[[], object], device: torch.device) -> float:
    """Median microseconds of fn() on the current stream of ``device``."""
    with torch.cuda.device(device):
        for _ in range(WARMUP):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
        for s, e in zip(starts, ends, strict=True):
            s.record()
            fn()
            e.record()
        ends[-1].synchronize()
        times = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True))
    return times[len(times) // 2]


def race(incumbent: tuple[str, Callable[[], object]], challenger: tuple[str, Callable[[], object]], m: int,
         device: torch.device, margin: float = 1.03, timer=time_us) -> RaceResult:
    """Time both routes; the challenger wins only when the incumbent takes more than ``margin`` times its time."""
    times = {name: timer(fn, device) for name, fn in (incumbent, challenger)}
    wins = times[incumbent[0]] > margin * times[challenger[0]]
    return RaceResult(times_us=times, winner=challenger[0] if wins else incumbent[0], m=m)
