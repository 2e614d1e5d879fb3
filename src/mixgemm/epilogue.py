"""The fused epilogue shared by every op: + bias, then a clamp (relu = [0, inf), relu6 = [0, 6]).

Activations are expressed as a min/max clamp, like the seeds' minV/maxV, so one code path serves all.
"""

from __future__ import annotations

import math

ACTIVATIONS = {None: (-math.inf, math.inf), "none": (-math.inf, math.inf), "relu": (0.0, math.inf),
               "relu6": (0.0, 6.0)}


def clamp_bounds(activation: str | None) -> tuple[float, float]:
    """(min, max) of the output clamp for an activation name: None/'none', 'relu' or 'relu6'."""
    try:
        return ACTIVATIONS[activation]
    except (KeyError, TypeError):
        raise ValueError(f"activation must be None, 'relu' or 'relu6', got {activation!r}") from None
