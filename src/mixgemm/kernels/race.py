"""Timing two routes of one problem on the GPU (the results live in mixgemm.tuning.races).

A race runs each contender WARMUP times, captures REPS calls in a CUDA graph and times ROUNDS replays between CUDA
events (the median per call). It runs only where timing is possible and harmless: on a CUDA device, outside CUDA-graph
capture and torch.compile tracing.
A route must beat the incumbent by ``margin`` (noise; the incumbent is the entry that runs unraced, for the float
routes the quantized kernel, which holds less memory).
:func:`decision` is what a raced entry's can_run returns (dequant_cublas, dequant_cudnn, conv_as_matmul): the recorded
result, or a race against the entry the registry would pick without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from mixgemm.kernels.options import current_options, pop_options, push_options
from mixgemm.kernels.registry import OK, Choice, Decision, Problem, choose, prefer_not
from mixgemm.tuning import races
from mixgemm.tuning.buckets import SourcedConfig
from mixgemm.tuning.races import RaceResult

WARMUP = 2
# a race decides a layer for the rest of the process: enough calls and rounds that a 3 us layer's median holds still
REPS = 8
ROUNDS = 7


def can_time(device: torch.device) -> bool:
    """True where a race may run now: CUDA, not capturing a graph, not tracing under torch.compile."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if torch.compiler.is_compiling():
        return False
    return not torch.cuda.is_current_stream_capturing()


# One side stream per device for every race's warm-up and capture: cuBLAS keeps a workspace (tens of MB) per stream
# it ran on for the life of the process, so a fresh stream per race (torch hands out up to 32 per device) would leave
# one behind each time; with one stream the races hold one, once.
_STREAMS: dict[int, torch.cuda.Stream] = {}


def race_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream the races on ``device`` warm up and capture on."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _STREAMS:
        _STREAMS[index] = torch.cuda.Stream(device=index)
    return _STREAMS[index]


def time_us(fn: Callable[[], object], device: torch.device) -> float:
    """Median microseconds of one fn() call, from CUDA-graph replays of REPS calls (eager timing would measure the
    host's launch path, not the GPU's work: a small layer's kernels finish before Python issues the next)."""
    with torch.cuda.device(device):
        side = race_stream(device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
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


def decision(p: Problem, name: str, key: tuple, device: torch.device, can_race: bool,
             routes: Callable[[Choice], tuple[Callable[[], object], Callable[[], object]]]) -> Decision:
    """Entry ``name``'s decision for p from its race under ``key``: OK where it won, else a soft decline with the times.
    With no result yet, a race runs now where ``can_race`` and timing is possible (:func:`can_time`): routes(rival)
    gives (the rival's call, this entry's call), the rival being the registry's choice without ``name``; otherwise a
    soft decline (the quantized kernel runs)."""
    res = races.result(key)
    if res is None:
        if not (can_race and can_time(device)):
            return prefer_not("not measured yet (the first eager call of this layer races it against the quantized "
                              "kernel)")
        opts = current_options()
        without = replace(opts, force=opts.force - {name}, disable=opts.disable | {name})
        # current while the rival is chosen and timed: a raced entry below (conv_as_matmul under dequant_cudnn) then
        # races against the entries below itself, not back against this one
        token = push_options(without)
        try:
            rival = choose(p, without)
            rival_call, own_call = routes(rival)
            res = race((rival.entry.name, rival_call), (name, own_call), p.m, device)
        finally:
            pop_options(token)
        races.record(key, res)
    return OK if res.winner == name else prefer_not(f"slower than {res.winner}: {res.note()}")


def measured_config(key: tuple) -> SourcedConfig | None:
    """A raced entry's config: none to hand its kernel, with the race's times as its source (explain prints them)."""
    res = races.result(key)
    return None if res is None else SourcedConfig({}, res.note())
