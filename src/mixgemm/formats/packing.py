"""Plain byte packing of unsigned codes along K (the interchange layout).

4 bits: byte j of a row holds code 2j in the low nibble and code 2j+1 in the high nibble.
8 bits: one code per byte.
"""

from __future__ import annotations

import torch


def pack_codes(q: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes [..., K] -> packed uint8 [..., K * bits // 8]."""
    if q.dtype != torch.uint8:
        raise TypeError(f"codes must be uint8, got {q.dtype}")
    if bits == 8:
        return q.contiguous()
    if bits != 4:
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    if q.shape[-1] % 2:
        raise ValueError(f"K={q.shape[-1]} must be even for 4-bit packing")
    lo = q[..., 0::2]
    hi = q[..., 1::2]
    return (lo | (hi << 4)).contiguous()


def unpack_codes(packed: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """packed uint8 [..., K * bits // 8] -> codes uint8 [..., K]."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed weight must be uint8, got {packed.dtype}")
    if packed.shape[-1] * 8 // bits != k:
        raise ValueError(f"packed width {packed.shape[-1]} does not hold K={k} codes of {bits} bits")
    if bits == 8:
        return packed
    lo = packed & 0xF
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], k)
