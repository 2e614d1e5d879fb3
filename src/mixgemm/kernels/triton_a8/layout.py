"""Layout "int8_v1": a QuantizedWeight repacked for the int8 tensor-core kernels (W8A8 / W4A8).

Built once per weight by :func:`build_int8_layout` and cached with ``qw.layout("int8_v1", build_int8_layout)``.

Signed codes (the int8 tensor cores multiply signed int8): every mode is rewritten as w = c * s + m with a
signed code c = q - 2**(bits-1) (the stored unsigned q carries a +128 / +8 bias):

* sym:        c = q - bias,  m = 0
* zero_point: c = q - bias,  m = (bias - z) * s      ((q - z) s = (q - bias) s + (bias - z) s)
* offset:     c = q - bias,  m = m0 + bias * s

Tensors (on the weight's device):

* ``codes``: 8 bits: int8 [N, K], byte k of row n = c[n, k] (K-contiguous = "column-major B", the
  operand order the int8 MMA wants). 4 bits: int8 [N, K // 2] in *half-split* order: K is cut into runs
  of 2H (H = ``half``, 32 or 64); byte j of run r holds c[n, 2H r + j] in its low nibble and
  c[n, 2H r + H + j] in its high nibble, two's complement. A kernel widens a [H, BN] byte tile into the
  two int8 tiles b << 4 = 16 c_lo and b & 0xF0 = 16 c_hi (the nibble placed in the top of a signed byte
  is the code times 16: one op per byte, no sign extension) and multiplies them with the two contiguous
  H-wide halves of the activation tile: no shuffles. The factor 16 is folded into ``dot_scales``.
* ``scales``: float32 [G, N] (s per group, transposed so a K-step loads N-contiguous values).
* ``dot_scales``: float32 [G, N]: the scale applied to the kernel's integer dot: s (8 bits), s / 16 (4 bits).
* ``moff``: float32 [G, N]: m above (zeros for sym; ``has_offset`` False).
* ``cterm``: float32 [G, N]: s * sum(c over the group) + g * m, the weight-side constant of the
  asymmetric-activation term oA * (sB sum(cB) + g mB) (computed in float64, rounded once).
* ``csum``: int32 [N, G]: sum of the signed codes per group (exact; used by the tests and the static GEMM).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm.formats.weight import QuantizedWeight

LAYOUT_NAME = "int8_v1"


@dataclass(frozen=True)
class Int8Layout:
    codes: torch.Tensor
    scales: torch.Tensor
    dot_scales: torch.Tensor
    moff: torch.Tensor
    cterm: torch.Tensor
    csum: torch.Tensor
    bits: int
    group_size: int
    num_groups: int
    half: int
    has_offset: bool
    n: int
    k: int


def pick_half(group_size: int, k: int) -> int:
    """H of the 4-bit half-split order: 32 for group 32, else 64 (needs K % 2H == 0)."""
    h = 32 if group_size == 32 else 64
    if group_size == k and k % 128 != 0:  # per-channel on a K that is not a multiple of 128
        h = 32
    if k % (2 * h) != 0:
        raise ValueError(f"4-bit int8_v1 layout needs K % {2 * h} == 0, got K={k}")
    return h


def half_split_pack(c: torch.Tensor, h: int) -> torch.Tensor:
    """Signed int4 codes c (int8 [N, K] in [-8, 7]) -> int8 [N, K // 2] in half-split order of run 2h."""
    n, k = c.shape
    r = c.reshape(n, k // (2 * h), 2, h).to(torch.int16)
    lo = r[:, :, 0, :] & 0xF
    hi = r[:, :, 1, :] & 0xF
    byte = (lo | (hi << 4)).to(torch.uint8).view(torch.int8)
    return byte.reshape(n, k // 2).contiguous()


def half_split_unpack(p: torch.Tensor, h: int) -> torch.Tensor:
    """Inverse of half_split_pack (for tests): int8 [N, K // 2] -> signed codes int8 [N, K]."""
    n, kh = p.shape
    r = p.reshape(n, kh // h, h)
    lo = torch.bitwise_right_shift(torch.bitwise_left_shift(r, 4), 4)
    hi = torch.bitwise_right_shift(r, 4)
    return torch.stack((lo, hi), dim=2).reshape(n, 2 * kh)


def build_int8_layout(qw: QuantizedWeight) -> Int8Layout:
    """Repack ``qw`` (plain layout, any mode, 4 or 8 bits) into Int8Layout. Does not modify qw."""
    n, k = qw.shape
    g, ng = qw.group_size, qw.num_groups
    bias = qw.config.sym_bias
    c = (qw.codes().to(torch.int16) - bias).to(torch.int8)  # [N, K] signed
    s64, m64 = qw.centered_params_float64()
    csum, cterm = qw.centered_group_sums()
    if qw.bits == 8:
        codes, h = c.contiguous(), 0
    else:
        h = pick_half(g, k)
        codes = half_split_pack(c, h)
    return Int8Layout(
        codes=codes,
        scales=s64.float().T.contiguous(),
        dot_scales=(s64 / (16 if qw.bits == 4 else 1)).float().T.contiguous(),
        moff=m64.float().T.contiguous(),
        cterm=cterm.float().T.contiguous(),
        csum=csum.contiguous(),
        bits=qw.bits,
        group_size=g,
        num_groups=ng,
        half=h,
        has_offset=qw.mode != "sym",
        n=n,
        k=k,
    )


def get_int8_layout(qw: QuantizedWeight) -> Int8Layout:
    """The cached int8_v1 layout of qw (built on first use)."""
    return qw.layout(LAYOUT_NAME, build_int8_layout)
