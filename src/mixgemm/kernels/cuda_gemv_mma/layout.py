"""``gemv_mma_v1``, the tensor-core GEMV's layout (mixgemm/kernels/cuda_gemv_mma/gemv_mma.cu), fp16/bf16 activations,
built from the plain QuantizedWeight packing (once per weight, cached by ``QuantizedWeight.layout(name, build)``).


Tiles of 16 rows x KT k (KT = 64 for int4, 32 for int8), ordered [N / 16][Kp / KT], 512 bytes each:
16 bytes per lane (lane = 4 g + t, g = 0..7, t = 0..3). Lane (g, t) holds rows g and g + 8 of the tile,
k = KL t .. KL t + KL - 1 (KL = KT / 4). With k0 = KL t + 4 s:
  int4, word s = 0..3: nibble p holds element INT4_PERM[p] of
        (W[g][k0], W[g][k0+1], W[g+8][k0], W[g+8][k0+1], W[g][k0+2], W[g][k0+3], W[g+8][k0+2], W[g+8][k0+3])
        -- the four f16x2 A-fragment registers of mma.m16n8k16 step s, one lop3 each.
  int8, words 2s and 2s + 1 (s = 0, 1): bytes W[g][k0 .. k0+3] and W[g+8][k0 .. k0+3].
Rows are padded to a multiple of 16 and k to a multiple of KT with zero codes (padded rows are never
stored; padded k meet zero activations). Params are the gemv_v2 params (same tensor, shared).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm.formats.layouts import INT4_PERM, KernelLayout, groups_read, lane_slot_index
from mixgemm.formats.weight import PER_CHANNEL, QuantizedWeight
from mixgemm.kernels.cuda_gemv.layout import build_gemv_v2

_MMA_E_INT4 = ((0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3))  # (row half h, j) of e0..e7


@dataclass(frozen=True)
class GemvMmaLayout(KernelLayout):
    """The ``gemv_mma_v1`` layout of one weight (see the module docstring): weight uint8 [N_pad / 16, Kp / KT,
    32 lanes, 16 bytes], params as GemvLayout.params."""

    k_tile: int
    gk: int  # group of k = min(k >> gk, G - 1); 31 for per-channel

    @property
    def k_tiles(self) -> int:
        return self.k_padded // self.k_tile


def _mma_index(bits: int):
    """For each (lane, byte/nibble slot) of a tile, the (row in tile, k in tile) it holds, as two int64
    tensors of shape [32, 32] (int4: 32 nibbles per lane) or [32, 16] (int8: 16 bytes per lane)."""
    kl = 16 if bits == 4 else 8

    def slots(g, t):
        if bits == 4:
            for s in range(4):
                for p in range(8):
                    h, j = _MMA_E_INT4[INT4_PERM[p]]
                    yield g + 8 * h, kl * t + 4 * s + j
        else:
            for s in range(2):
                for h in range(2):
                    for j in range(4):
                        yield g + 8 * h, kl * t + 4 * s + j

    return lane_slot_index(slots)


def build_gemv_mma_v1(qw: QuantizedWeight) -> GemvMmaLayout:
    """Repack ``qw`` for the tensor-core GEMV (on qw's device). The plain tensors are not modified."""
    base = qw.layout("gemv_v2", build_gemv_v2)  # shares the params tensor (and the codes buffer is the plain one)
    n, k = qw.shape
    bits = qw.bits
    kt_ = 64 if bits == 4 else 32
    kp = -(-k // kt_) * kt_
    np_ = -(-n // 16) * 16
    codes = torch.zeros(np_, kp, dtype=torch.uint8, device=qw.device)
    codes[:n, :k] = qw.codes()
    rows, ks = _mma_index(bits)
    rows, ks = rows.to(qw.device), ks.to(qw.device)
    t = codes.reshape(np_ // 16, 16, kp // kt_, kt_).permute(0, 2, 1, 3)  # [Nt, Kt, 16, KT]
    slots = t[:, :, rows, ks].to(torch.int32)  # [Nt, Kt, 32, slots]
    if bits == 4:
        slots = slots.reshape(*slots.shape[:3], 16, 2)
        packed = (slots[..., 0] | (slots[..., 1] << 4)).to(torch.uint8)  # nibble 2i low, 2i+1 high
    else:
        packed = slots.to(torch.uint8)
    gk = 31 if qw.config.group_size == PER_CHANNEL else qw.group_size.bit_length() - 1
    params, ng = base.params, groups_read(qw.config.group_size, base.num_groups, kp)
    if ng > base.num_groups:  # a copy of the shared parameters with the padded K's zero group
        params = torch.zeros(n, ng, *params.shape[2:], dtype=params.dtype, device=params.device)
        params[:, :base.num_groups] = base.params
    return GemvMmaLayout(weight=packed.contiguous(), params=params, n=n, k=k, k_padded=kp, bits=bits,
                         mode=qw.mode, group_size=base.group_size, num_groups=ng, k_tile=kt_, gk=gk)


def unpack_gemv_mma_v1(layout: GemvMmaLayout) -> torch.Tensor:
    """Codes uint8 [N, K] read back from a ``gemv_mma_v1`` layout (for tests and debugging)."""
    w = layout.weight
    ntl, ktl = w.shape[0], w.shape[1]
    if layout.bits == 4:
        slots = torch.stack([w & 0xF, w >> 4], dim=-1).reshape(ntl, ktl, 32, 32)
    else:
        slots = w
    rows, ks = _mma_index(layout.bits)
    t = torch.zeros(ntl, ktl, 16, layout.k_tile, dtype=torch.uint8, device=w.device)
    t[:, :, rows.to(w.device), ks.to(w.device)] = slots
    codes = t.permute(0, 2, 1, 3).reshape(ntl * 16, ktl * layout.k_tile)
    return codes[: layout.n, : layout.k].contiguous()
