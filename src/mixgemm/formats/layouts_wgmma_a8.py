"""``wgmma_a8_v1``: the weight layout of the int8 wgmma GEMM (mixgemm/kernels/cuda_wgmma_a8/gemm_wgmma_a8.cu).

The GEMM computes out.T = C @ xq.T on the int8 tensor cores with the signed weight codes c = q - sym_bias as the
wgmma A operand *in registers* and the int8 activation codes as B in shared memory. Each warp owns 16 weight rows;
a k-tile is 128 k (128 activation bytes per token, one 128-byte swizzle row). For one k32 step s a lane
(g = lane / 4, t = lane % 4) holds the int8 A registers a0 = row g, k = 32 s + 4 t + (0..3); a1 = row g + 8, the same
k; a2 = row g, k + 16; a3 = row g + 8, k + 16 (4 codes per 32-bit register, k ascending from the low byte).

* int4: 1024 bytes per 16-row x 128-k tile; uint4 u (u = 0, 1) of lane l at byte 512 u + 16 l; its words are
  (step 2u, row g), (2u, g + 8), (2u + 1, g), (2u + 1, g + 8); byte i of word (s, h) holds c[g + 8h][32 s + 4 t + i]
  in its low nibble and c[g + 8h][32 s + 16 + 4 t + i] in its high nibble (4-bit two's complement). The kernel
  gets a0 / a1 as (w << 4) & 0xF0F0F0F0 and a2 / a3 as w & 0xF0F0F0F0: bytes 16 c, exact signed int8, two
  instructions per 8 codes and no sign extension (the 16 is divided out of the scales below).
* int8: 2048 bytes per tile; uint4 s of lane l (step s) at byte 512 s + 16 l holds (a0, a1, a2, a3).
* Tile order: [N_pad / 128][K_pad / 128][8 row tiles] (a CTA's 8 row tiles of one k-tile are contiguous).
* params: float32 [N_pad / 128, G, 8, 16]: the dot scale s / 16 (int4) or s (int8) of each row and group, so that
  w = c * s = (16 c) * (s / 16) exactly.

* mults / channel_steps (int4 groups whose scales factor as step * m, m in 1..16: formats/int_scales.py; else None):
  int32 [N_pad / 128, G, 8, 16] the multipliers m and float32 [N_pad / 128, 1, 8, 16] the steps, in the params'
  order, for the kernel's A8_QS mode (bytes c * m in registers, the step in the epilogue).

Only the symmetric mode (w = (q - sym_bias) * s), groups of 128 or 256 or per-channel: the kernel's int32 partial
of one group must stay below 2^22 in magnitude for its exact int-to-float step (16 c * a <= 128 * 127 per product).
Padding: rows to a multiple of 128 and k to a multiple of 128 with c = 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from mixgemm.formats.int_scales import int_group_scales
from mixgemm.formats.layouts import KernelLayout, WgmmaTiles, lane_slot_index
from mixgemm.formats.weight import PER_CHANNEL, QuantizedWeight

K_TILE = 128
ROWS = 16
GROUP_TILES = 8


@dataclass(frozen=True)
class WgmmaA8Layout(WgmmaTiles, KernelLayout):
    """The ``wgmma_a8_v1`` layout (module docstring): weight uint8 [N_pad / 128, K_pad / 128, 8, tile bytes], params
    float32 [N_pad / 128, G, 8, 16]."""

    TILE_K: ClassVar[int] = K_TILE
    mults: torch.Tensor | None = None
    channel_steps: torch.Tensor | None = None

    @property
    def per_channel(self) -> bool:
        return self.num_groups == 1


def a8_layout_supported(qw: QuantizedWeight) -> bool:
    """True when ``wgmma_a8_v1`` can hold qw: sym int4 / int8, group 128, 256 or per-channel."""
    return (qw.mode == "sym" and qw.bits in (4, 8)
            and (qw.config.group_size == PER_CHANNEL or qw.group_size in (128, 256)))


def _slot_index(bits: int):
    """(row in tile, k in tile) of every code of a lane's share of a tile, in the lane's code order (int4: nibble
    order, low nibble first; int8: byte order), [32 lanes, 64 or 128]."""

    def slots(g, t):
        for s in range(4):
            if bits == 4:  # byte i of word (s, h): k = 32 s + 4 t + i (low nibble), + 16 (high nibble)
                for h in range(2):
                    for i in range(4):
                        for hi in range(2):
                            yield g + 8 * h, 32 * s + 16 * hi + 4 * t + i
            else:  # a0, a1 (k), then a2, a3 (k + 16)
                for half in range(2):
                    for h in range(2):
                        for i in range(4):
                            yield g + 8 * h, 32 * s + 16 * half + 4 * t + i

    return lane_slot_index(slots)


def build_wgmma_a8_v1(qw: QuantizedWeight) -> WgmmaA8Layout:
    """Repack a sym ``qw`` for the int8 wgmma GEMM (on qw's device). The plain tensors are not modified."""
    if not a8_layout_supported(qw):
        raise ValueError(f"wgmma_a8_v1 takes sym int4 / int8 weights with group 128, 256 or per-channel, got "
                         f"mode={qw.mode!r} bits={qw.bits} group_size={qw.config.group_size}")
    n, k = qw.shape
    bits = qw.bits
    np_ = -(-n // (ROWS * GROUP_TILES)) * ROWS * GROUP_TILES
    kp = -(-k // K_TILE) * K_TILE
    c = torch.zeros(np_, kp, dtype=torch.int32, device=qw.device)
    c[:n, :k] = qw.codes().to(torch.int32) - qw.config.sym_bias
    tiles = c.reshape(np_ // ROWS, ROWS, kp // K_TILE, K_TILE).permute(0, 2, 1, 3)  # [Nt, Kt, 16, 128]
    rows, ks = _slot_index(bits)
    slots = tiles[:, :, rows.to(qw.device), ks.to(qw.device)]  # [Nt, Kt, 32 lanes, 64 | 128]
    if bits == 4:
        nib = slots & 0xF
        lane_bytes = (nib[..., 0::2] | (nib[..., 1::2] << 4)).to(torch.uint8)  # [Nt, Kt, 32, 32]
    else:
        lane_bytes = (slots & 0xFF).to(torch.uint8)  # [Nt, Kt, 32, 64]
    # lane bytes in 16-byte pieces: piece u of every lane contiguous (byte 512 u + 16 lane)
    nt, ktl = lane_bytes.shape[:2]
    packed = lane_bytes.reshape(nt, ktl, 32, -1, 16).transpose(2, 3)  # [Nt, Kt, pieces, 32, 16]
    nt8 = np_ // (ROWS * GROUP_TILES)
    weight = packed.reshape(nt8, GROUP_TILES, ktl, -1).transpose(1, 2).contiguous()
    _, ng = qw.config.groups(k)
    s = qw.scales.to(torch.float32) / (16.0 if bits == 4 else 1.0)

    def tiled(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:  # [N, G'] -> [N_pad / 128, G', 8, 16]
        t = torch.zeros(np_, v.shape[1], dtype=dtype, device=qw.device)
        t[:n] = v
        return t.reshape(nt8, GROUP_TILES, ROWS, v.shape[1]).permute(0, 3, 1, 2).contiguous()

    params = tiled(s, torch.float32)
    isc = int_group_scales(qw)
    mults = steps = None
    if isc is not None:
        mults = tiled(isc.mult, torch.int32)
        steps = tiled(isc.step[:, None], torch.float32)
    g = k if ng == 1 else qw.group_size
    return WgmmaA8Layout(weight=weight, params=params, n=n, k=k, k_padded=kp, bits=bits, mode=qw.mode,
                         group_size=g, num_groups=ng, mults=mults, channel_steps=steps)


def unpack_wgmma_a8_v1(layout: WgmmaA8Layout) -> torch.Tensor:
    """Signed codes int32 [N, K] read back from a ``wgmma_a8_v1`` layout (tests and debugging)."""
    w = layout.weight.transpose(1, 2)  # [Nt8, 8, Kt, B]
    w = w.reshape(-1, *w.shape[2:])
    ntl, ktl = w.shape[:2]
    lane_bytes = w.reshape(ntl, ktl, -1, 32, 16).transpose(2, 3).reshape(ntl, ktl, 32, -1).to(torch.int32)
    if layout.bits == 4:
        nib = torch.stack([lane_bytes & 0xF, lane_bytes >> 4], dim=-1).reshape(ntl, ktl, 32, -1)
        slots = nib - ((nib & 0x8) << 1)
    else:
        slots = lane_bytes - ((lane_bytes & 0x80) << 1)
    rows, ks = _slot_index(layout.bits)
    t = torch.zeros(ntl, ktl, ROWS, K_TILE, dtype=torch.int32, device=w.device)
    t[:, :, rows.to(w.device), ks.to(w.device)] = slots
    codes = t.permute(0, 2, 1, 3).reshape(ntl * ROWS, ktl * K_TILE)
    return codes[: layout.n, : layout.k].contiguous()
