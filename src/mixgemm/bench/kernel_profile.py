"""GPU kernels of a callable, per call: which kernels run, how often, and how much GPU time each takes (torch.profiler
with CUDA activity; kernels replayed from a CUDA graph are recorded too). What a tokens/s difference between two
models is made of: a kernel that is slower, or kernels that one of them adds."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class KernelTime:
    name: str             # the kernel's name, template arguments and parameters cut (kernel_name)
    calls_per_step: float
    us_per_step: float    # summed GPU time per step


def kernel_name(raw: str) -> str:
    """A kernel's name without its template arguments, parameter list and Triton's numeric suffixes, so that one
    kernel compiled for several shapes is one row."""
    name = re.sub(r"<.*", "", raw.replace("(anonymous namespace)", ""))
    name = re.sub(r"\(.*", "", name).strip()
    name = name.split()[-1] if name else raw
    return re.sub(r"_\d+$", "", name) or raw


def kernel_times(step: Callable[[], object], steps: int = 3, skip: int = 0) -> tuple[list[KernelTime], float]:
    """Run ``step`` ``skip`` times (compiles, warm-up), then ``steps`` times under torch.profiler (CUDA); returns the
    kernels by GPU time per step, largest first, and the total GPU time per step in µs."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(skip):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    calls: dict[str, int] = {}
    us: dict[str, float] = {}
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA or getattr(ev, "is_user_annotation", False):
            continue
        name = kernel_name(ev.name)
        calls[name] = calls.get(name, 0) + 1
        us[name] = us.get(name, 0.0) + ev.device_time
    rows = sorted((KernelTime(n, calls[n] / steps, us[n] / steps) for n in us), key=lambda r: -r.us_per_step)
    return rows, sum(r.us_per_step for r in rows)


def as_dicts(rows: list[KernelTime]) -> list[dict]:
    return [asdict(r) for r in rows]
