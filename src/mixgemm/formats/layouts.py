"""Kernel layouts built from the plain QuantizedWeight packing (built once per weight, cached by
``QuantizedWeight.layout(name, build)``).

``gemv_v2`` -- read by the CUDA-core GEMV (mixgemm/kernels/cuda/gemv.cu), M <= 16:

* ``weight``: uint8 [N, Kp * bits // 8], row-major, each row 16-byte aligned (Kp * bits / 8 is a multiple
  of 16). One 16-byte *chunk* holds ``chunk`` = 32 (int4) or 16 (int8) consecutive k in the plain packing
  (mixgemm.formats.packing): byte j of a row holds k = j (int8), or k = 2j in its low nibble and 2j + 1 in its
  high nibble (int4). Where Kp = K and the plain buffer is contiguous and 16-byte aligned (always, for weights
  quantized or loaded by mixgemm) ``weight`` *is* ``qw.qweight``: the layout costs no memory. The kernel pairs
  nibbles (k, k + 4) of each 32-bit word with one lop3 and permutes the activations to match (gemv.cu).

  Kp = K, except per-channel weights whose K is not a multiple of ``chunk``: Kp rounds K up and the
  padded codes are the zero point (the kernel feeds them zero activations); those get a padded copy.
* ``params``: per (row, group) parameters in the scale dtype: [N, G] scales for "sym" (``qw.scales`` itself);
  [N, G, 2] pairs (scale, z) for "zero_point" (z < 256 is exact in fp16/bf16/fp32);
  [N, G, 2] pairs (scale, m) for "offset". One load per group and row.
* ``gshift``: chunk c belongs to group c >> gshift (31 for per-channel: always group 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm.formats.packing import pack_codes, unpack_codes
from mixgemm.formats.weight import PER_CHANNEL, QuantizedWeight, narrow_group_reason

INT4_PERM = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble p of a 32-bit word holds element INT4_PERM[p]


@dataclass(frozen=True)
class KernelLayout:
    """What every kernel layout of a weight holds: the repacked codes, the per-(row, group) parameters, and the
    problem they came from. Each layout adds its own addressing fields."""

    weight: torch.Tensor  # uint8, layout-specific shape
    params: torch.Tensor  # scale dtype, layout-specific shape
    n: int
    k: int
    k_padded: int
    bits: int
    mode: str
    group_size: int  # effective (K for per-channel)
    num_groups: int


@dataclass(frozen=True)
class GemvLayout(KernelLayout):
    """The ``gemv_v2`` layout of one weight (see the module docstring): weight uint8 [N, Kp * bits // 8], params
    [N, G] or [N, G, 2]."""

    chunk: int  # k per 16-byte chunk
    gshift: int

    @property
    def chunks_per_row(self) -> int:
        return self.k_padded // self.chunk


def build_gemv_v2(qw: QuantizedWeight) -> GemvLayout:
    """The CUDA-core GEMV's layout of ``qw`` (on qw's device): its own buffers wherever they already are the layout
    (see the module docstring), else a copy. The plain tensors are not modified."""
    n, k = qw.shape
    bits = qw.bits
    chunk = 32 if bits == 4 else 16
    g, ng = qw.config.groups(k)
    why = narrow_group_reason(g, ng)
    if why:
        raise ValueError(f"no gemv_v2 layout: {why}")
    kp = -(-k // chunk) * chunk
    plain = qw.qweight
    if kp == k and plain.is_contiguous() and plain.data_ptr() % 16 == 0:
        weight = plain  # the plain packing is this layout: the weight's own buffer, no second copy
    else:
        codes = qw.codes()
        if kp != k:  # only per-channel weights reach here (group sizes are multiples of 32)
            assert qw.config.group_size == PER_CHANNEL
            zc = qw.zero_points()[:, :1].to(torch.uint8) if qw.mode != "offset" else 0
            pad = torch.zeros(n, kp - k, dtype=torch.uint8, device=codes.device) + zc
            codes = torch.cat([codes, pad], dim=1)
        weight = pack_codes(codes, bits).contiguous()
    if qw.mode == "sym":
        params = qw.scales.contiguous()
    elif qw.mode == "zero_point":
        params = torch.stack([qw.scales, qw.zeros.to(qw.scales.dtype)], dim=-1).contiguous()
    else:
        params = torch.stack([qw.scales, qw.offsets.to(qw.scales.dtype)], dim=-1).contiguous()
    if qw.config.group_size == PER_CHANNEL:
        gshift = 31
    else:
        cpg = g // chunk
        gshift = cpg.bit_length() - 1
        assert 1 << gshift == cpg
    return GemvLayout(weight=weight, params=params, n=n, k=k, k_padded=kp, bits=bits,
                      mode=qw.mode, group_size=g, num_groups=ng, chunk=chunk, gshift=gshift)


def unpack_gemv_v2(layout: GemvLayout) -> torch.Tensor:
    """Codes uint8 [N, K] read back from a ``gemv_v2`` layout (for tests and debugging)."""
    return unpack_codes(layout.weight, layout.bits, layout.k_padded)[:, : layout.k].contiguous()


# ---------------------------------------------------------------------------------------------------
# gemv_mma_v1 -- read by the tensor-core GEMV (mixgemm/kernels/cuda/gemv_mma.cu), fp16/bf16 activations.
#
# Tiles of 16 rows x KT k (KT = 64 for int4, 32 for int8), ordered [N / 16][Kp / KT], 512 bytes each:
# 16 bytes per lane (lane = 4 g + t, g = 0..7, t = 0..3). Lane (g, t) holds rows g and g + 8 of the tile,
# k = KL t .. KL t + KL - 1 (KL = KT / 4). With k0 = KL t + 4 s:
#   int4, word s = 0..3: nibble p holds element INT4_PERM[p] of
#         (W[g][k0], W[g][k0+1], W[g+8][k0], W[g+8][k0+1], W[g][k0+2], W[g][k0+3], W[g+8][k0+2], W[g+8][k0+3])
#         -- the four f16x2 A-fragment registers of mma.m16n8k16 step s, one lop3 each.
#   int8, words 2s and 2s + 1 (s = 0, 1): bytes W[g][k0 .. k0+3] and W[g+8][k0 .. k0+3].
# Rows are padded to a multiple of 16 and k to a multiple of KT with zero codes (padded rows are never
# stored; padded k meet zero activations). Params are the gemv_v2 params (same tensor, shared).
# ---------------------------------------------------------------------------------------------------

_MMA_E_INT4 = ((0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3))  # (row half h, j) of e0..e7


@dataclass(frozen=True)
class GemvMmaLayout(KernelLayout):
    """The ``gemv_mma_v1`` layout of one weight (see the comment above): weight uint8 [N_pad / 16, Kp / KT,
    32 lanes, 16 bytes], params as GemvLayout.params."""

    k_tile: int
    gk: int  # group of k = min(k >> gk, G - 1); 31 for per-channel

    @property
    def k_tiles(self) -> int:
        return self.k_padded // self.k_tile


def lane_slot_index(slots) -> tuple[torch.Tensor, torch.Tensor]:
    """(row in tile, k in tile) of every slot of every lane of a tile, as two int64 tensors [32, slots per lane];
    slots(g, t) yields the (row, k) pairs of lane 4 g + t in its slot order."""
    rows, ks = [], []
    for lane in range(32):
        pairs = list(slots(lane // 4, lane % 4))
        rows.append([r for r, _ in pairs])
        ks.append([k for _, k in pairs])
    return torch.tensor(rows), torch.tensor(ks)


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
    return GemvMmaLayout(weight=packed.contiguous(), params=base.params, n=n, k=k, k_padded=kp, bits=bits,
                         mode=qw.mode, group_size=base.group_size, num_groups=base.num_groups, k_tile=kt_,
                         gk=gk)


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
