"""Measured races: which of two routes ran a problem faster on this GPU, timed in this process.

Where a quantized kernel may lose to its float layer (a prefill GEMM against cuBLAS on a dequantized copy, a conv
against cuDNN), no shipped table can know every layer a user will run: the first eager call of a problem times both
routes (mixgemm.kernels.race) and the result is kept here for the process, keyed by the problem (exact layer shape,
weight format, activation dtype, GPU, and the power-of-two M bucket), so every later call of that key -- and CUDA-graph
captures, where nothing can be timed -- takes the winner. ``mixgemm.explain`` prints the times.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RaceResult:
    """The median time in microseconds of each route (entry name -> us) at ``m`` rows, and the winner."""

    times_us: dict
    winner: str
    m: int

    def note(self) -> str:
        parts = ", ".join(f"{name} {us:.1f} us" for name, us in sorted(self.times_us.items(), key=lambda kv: kv[1]))
        return f"measured at M={self.m} in this process: {parts}"


_RESULTS: dict[tuple, RaceResult] = {}


def result(key: tuple) -> RaceResult | None:
    return _RESULTS.get(key)


def record(key: tuple, res: RaceResult) -> None:
    _RESULTS[key] = res


def forget() -> None:
    """Drop every result (the next eager call of each problem races again)."""
    _RESULTS.clear()
