"""Bytes, flops and the floor of one benchmark case (benchmark protocol, step 4).

floor = max(bytes / copy bandwidth, flops / matmul rate), where bytes counts what one call must touch
once: the weights as the kernel reads them (packed codes + scales/zeros), the activations in and the
output out. Bandwidth in bytes/s, rates in flop/s (or int op/s), times in microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

PROTOCOL_GROUP = 128  # the protocol's W4 floor: int4 weights + fp16 group-128 scales and zeros


def matmul_flops(m: int, k: int, n: int) -> int:
    """2 M N K: one multiply and one add per weight and row."""
    return 2 * m * k * n


def quant_weight_bytes(k: int, n: int, bits: int, group_size: int, param_bytes_per_group: int = 4) -> int:
    """Bytes of a block-quantized [N, K] weight: packed codes + per-group parameters.

    group_size -1 means per-channel (one group = all K); a partial last group counts as one.
    param_bytes_per_group: 4 for an fp16 scale and an fp16 zero (the protocol's W4 floor), 2 for a symmetric fp16
    scale alone.
    """
    if bits not in (1, 2, 4, 8, 16):
        raise ValueError(f"bits must be 1, 2, 4, 8 or 16, got {bits}")
    g = k if group_size == -1 else group_size
    if g <= 0:
        raise ValueError(f"group_size must be positive or -1, got {group_size}")
    return -(-n * k * bits // 8) + n * -(-k // g) * param_bytes_per_group  # (a partial last group is a group)


def case_bytes(m: int, k: int, n: int, weight_bytes: int, act_bytes: int = 2, out_bytes: int = 2) -> int:
    """Bytes one call touches once: weights + activations in [M, K] + output out [M, N]."""
    return weight_bytes + m * k * act_bytes + m * n * out_bytes


def protocol_w4_bytes(m: int, k: int, n: int, group_size: int = PROTOCOL_GROUP) -> int:
    """The protocol table's W4 floor bytes: int4 codes + fp16 scale and zero per group + fp16 x and y
    (a last partial group, when group_size does not divide K, counts as a group)."""
    weights = -(-n * k // 2) + n * -(-k // group_size) * 4
    return case_bytes(m, k, n, weights, 2, 2)


@dataclass(frozen=True)
class Floor:
    mem_us: float  # bytes / copy bandwidth
    compute_us: float  # flops / matmul rate (0 when the rate is unknown)

    @property
    def us(self) -> float:
        return max(self.mem_us, self.compute_us)

    @property
    def bound(self) -> str:
        return "memory" if self.mem_us >= self.compute_us else "compute"


def floor_of(nbytes: int, flops: int, bandwidth: float, rate: float | None) -> Floor:
    """Floor of a case. bandwidth: bytes/s (> 0). rate: flop/s, or None/0 to ignore compute."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth}")
    mem = nbytes / bandwidth * 1e6
    comp = flops / rate * 1e6 if rate else 0.0
    return Floor(mem, comp)


def pct_of_floor(floor_us: float, time_us: float | None) -> float | None:
    """100 * floor / measured time (100% = at the floor); None when the time is missing."""
    if time_us is None or time_us <= 0:
        return None
    return 100.0 * floor_us / time_us
