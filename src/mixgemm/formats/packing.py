"""Plain byte packing of unsigned codes along K (the interchange layout).

4 bits: byte j of a row holds code 2j in the low nibble and code 2j+1 in the high nibble. A row of odd K ends in a
byte whose high nibble is padding: PAD_CODE_4BIT, the zero code of "sym" (it dequantizes to 0 there, and is the signed
code c = 0 of the integer paths). No reader uses it: ``unpack_codes`` returns exactly K codes, and the kernels that
read the plain bytes themselves meet it with a zero (masked) activation.
8 bits: one code per byte.
"""

from __future__ import annotations

import torch

PAD_CODE_4BIT = 8


def packed_width(k: int, bits: int) -> int:
    """Bytes per row of K codes of ``bits`` bits in the plain packing: ceil(K * bits / 8)."""
    return -(-k * bits // 8)


def pack_codes(q: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes [..., K] -> packed uint8 [..., packed_width(K, bits)] (odd K at 4 bits: the last byte's high nibble
    is PAD_CODE_4BIT)."""
    if q.dtype != torch.uint8:
        raise TypeError(f"codes must be uint8, got {q.dtype}")
    if bits == 8:
        return q.contiguous()
    if bits != 4:
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    lo = q[..., 0::2]
    hi = q[..., 1::2]
    if hi.shape[-1] < lo.shape[-1]:  # odd K
        hi = torch.cat([hi, torch.full_like(lo[..., :1], PAD_CODE_4BIT)], dim=-1)
    return (lo | (hi << 4)).contiguous()


def unpack_codes(packed: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """packed uint8 [..., packed_width(K, bits)] -> codes uint8 [..., K] (a padding nibble is dropped)."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed weight must be uint8, got {packed.dtype}")
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    if packed.shape[-1] != packed_width(k, bits):
        raise ValueError(f"packed width {packed.shape[-1]} does not hold K={k} codes of {bits} bits (expected "
                         f"{packed_width(k, bits)} bytes per row)")
    if bits == 8:
        return packed
    lo = packed & 0xF
    hi = packed >> 4
    codes = torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])
    return codes if k % 2 == 0 else codes[..., :k].contiguous()
