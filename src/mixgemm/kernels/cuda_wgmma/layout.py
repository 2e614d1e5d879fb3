"""``wgmma_v1``: the weight layout of the Hopper wgmma GEMM (mixgemm/kernels/cuda/gemm_wgmma.cu).

The GEMM computes out.T = W @ x.T with the dequantized weights as the wgmma A operand *in registers*: each
warp of a warpgroup owns 16 weight rows, and a lane must find exactly its A-fragment bits in one 16-byte
load. So the weights are cut into tiles of 16 rows x 64 k, ordered [N_pad / 16][K_pad / 64], and inside a
tile lane (g = lane / 4, t = lane % 4) owns rows g and g + 8 at k = 16 s + 2 t + (0, 1) (pair 0) and
k = 16 s + 2 t + 8 + (0, 1) (pair 1) for the four k16 steps s = 0..3 -- the natural k order of the
wgmma/mma A fragment (unlike gemv_mma_v1, whose k order is permuted to match activations in registers; here
the activations come from shared memory in plain order).

* int4: 512 bytes per tile, one uint4 per lane (lane-major, coalesced); word s holds step s as
  nibble p = element INT4_PERM[p] of (W[g][k0], W[g][k0+1], W[g+8][k0], W[g+8][k0+1], W[g][k1], W[g][k1+1],
  W[g+8][k1], W[g+8][k1+1]), k0 = 16 s + 2 t, k1 = k0 + 8 (mma_frag.cuh turns each into an A register with
  one lop3).
* int8: 1024 bytes per tile: uint4 u (u = 0, 1) of lane l at byte 512 u + 16 l; its words 2j and 2j + 1
  (step s = 2 u + j) are the bytes (W[g][k0], W[g][k0+1], W[g][k1], W[g][k1+1]) and the same of row g + 8.
* Tile order: [N_pad / 128][K_pad / 64][8 row tiles] -- the 8 row tiles a CTA reads for one k-tile are one contiguous
  4 KiB (int4) block instead of 8 pieces 64 KiB apart (DRAM page locality; measured in docs/architecture.md).
* params: [N_pad / 128, G, 8, 16, PW] in the scale dtype (PW = 1 for sym, 2 = (scale, z) for zero_point,
  (scale, m) for offset): one warp's 16 rows of one group are 16 * PW * 2..4 contiguous bytes, so the
  kernel streams them into shared memory with the weights (cp.async, 16-byte pieces). Padded rows: zeros.

Padding: rows to a multiple of 128, k to a multiple of 64, with code 0 (padded k meet zero activations:
the kernel zero-fills x past K; padded rows are never stored).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm.formats.layouts import GROUP_TILES, INT4_PERM, K_TILE, ROWS, KernelLayout, WgmmaTiles, groups_read
from mixgemm.formats.weight import PER_CHANNEL, QuantizedWeight, narrow_group_reason

# (row half h, k offset) of the elements e0..e7 of one int4 word: pair 0 at k0, pair 1 at k0 + 8
_E_INT4 = ((0, 0), (0, 1), (1, 0), (1, 1), (0, 8), (0, 9), (1, 8), (1, 9))


@dataclass(frozen=True)
class WgmmaLayout(WgmmaTiles, KernelLayout):
    """The ``wgmma_v1`` layout of one weight (see the module docstring): weight uint8 [N_pad / 128, K_pad / 64, 8,
    tile bytes], params scale dtype [N_pad / 128, G, 8, 16, PW]."""

    gk: int  # group of k = min(k >> gk, G - 1); 31 for per-channel

    def tile(self, nt: int, kt: int) -> torch.Tensor:
        """The bytes of row tile nt, k-tile kt."""
        return self.weight[nt // GROUP_TILES, kt, nt % GROUP_TILES]


def _slot_index(bits: int):
    """(row in tile, k in tile) of every nibble (int4: [32 lanes, 32]) or byte (int8: [32 lanes, 32]) of a
    lane's share of a tile, in the lane's byte order (int8: uint4 0 then uint4 1)."""
    rows, ks = [], []
    for lane in range(32):
        g, t = lane // 4, lane % 4
        rr, kk = [], []
        for s in range(4):
            k0 = 16 * s + 2 * t
            if bits == 4:
                for p in range(8):
                    h, dk = _E_INT4[INT4_PERM[p]]
                    rr.append(g + 8 * h)
                    kk.append(k0 + dk)
            else:
                for h in range(2):
                    for dk in (0, 1, 8, 9):
                        rr.append(g + 8 * h)
                        kk.append(k0 + dk)
        rows.append(rr)
        ks.append(kk)
    return torch.tensor(rows), torch.tensor(ks)


def _tile_codes(codes: torch.Tensor, n: int, k: int) -> tuple[torch.Tensor, int, int]:
    np_ = -(-n // (ROWS * GROUP_TILES)) * ROWS * GROUP_TILES
    kp = -(-k // K_TILE) * K_TILE
    full = torch.zeros(np_, kp, dtype=torch.uint8, device=codes.device)
    full[:codes.shape[0], :k] = codes
    return full.reshape(np_ // ROWS, ROWS, kp // K_TILE, K_TILE).permute(0, 2, 1, 3), np_, kp


# Rows repacked at a time (a multiple of 128): the repacking's temporaries stay a few bytes per weight of one block,
# not of the whole weight (a 128k-vocabulary lm_head would otherwise hold ~10 bytes per weight on the device at once).
BUILD_ROWS = 4096


def build_wgmma_v1(qw: QuantizedWeight) -> WgmmaLayout:
    """Repack ``qw`` for the wgmma GEMM (on qw's device), BUILD_ROWS rows at a time. The plain tensors are not
    modified."""
    from mixgemm.formats.packing import unpack_codes

    why = narrow_group_reason(qw.group_size, qw.num_groups)
    if why:
        raise ValueError(f"no wgmma_v1 layout: {why}")
    n, k = qw.shape
    bits = qw.bits
    np_ = -(-n // (ROWS * GROUP_TILES)) * ROWS * GROUP_TILES
    kp = -(-k // K_TILE) * K_TILE
    rows, ks = (t.to(qw.device) for t in _slot_index(bits))
    tile_bytes = ROWS * K_TILE * bits // 8
    weight = torch.empty(np_ // (ROWS * GROUP_TILES), kp // K_TILE, GROUP_TILES, tile_bytes, dtype=torch.uint8,
                         device=qw.device)
    plain = qw.packed()
    for r0 in range(0, np_, BUILD_ROWS):
        r1 = min(r0 + BUILD_ROWS, np_)
        tiles, _, _ = _tile_codes(unpack_codes(plain[r0:min(r1, n)], bits, k), r1 - r0, k)  # [Nt, Kt, 16, 64]
        slots = tiles[:, :, rows, ks]  # [Nt, Kt, 32 lanes, 32], uint8 codes
        if bits == 4:
            slots = slots.reshape(*slots.shape[:3], 16, 2)
            packed = slots[..., 0] | (slots[..., 1] << 4)  # [Nt, Kt, 32 lanes, 16 B]
        else:  # lane bytes 0..15 -> uint4 0, 16..31 -> uint4 1; uint4 u of all lanes is contiguous
            packed = slots.reshape(*slots.shape[:3], 2, 16).transpose(2, 3)
        weight[r0 // (ROWS * GROUP_TILES):r1 // (ROWS * GROUP_TILES)] = (
            packed.reshape(-1, GROUP_TILES, kp // K_TILE, tile_bytes).transpose(1, 2))
    params, ng, g, gk = wgmma_params(qw)
    return WgmmaLayout(weight=weight, params=params, n=n, k=k, k_padded=kp, bits=bits, mode=qw.mode,
                       group_size=g, num_groups=ng, gk=gk)


def wgmma_params(qw: QuantizedWeight) -> tuple[torch.Tensor, int, int, int]:
    """(params [N_pad / 128, G, 8, 16, PW] in the scale dtype, padded rows and groups zero; G, the groups of the
    padded K; the group size; gk) -- the parameter order of wgmma_v1 and rows_v1 (module docstring)."""
    n, k = qw.shape
    np_ = -(-n // (ROWS * GROUP_TILES)) * ROWS * GROUP_TILES
    g, ng = qw.config.groups(k)
    if qw.mode == "sym":
        p = qw.scales[..., None]
    elif qw.mode == "zero_point":
        p = torch.stack([qw.scales, qw.zeros.to(qw.scales.dtype)], dim=-1)
    else:
        p = torch.stack([qw.scales, qw.offsets.to(qw.scales.dtype)], dim=-1)
    pw = p.shape[-1]
    ng_read = groups_read(qw.config.group_size, ng, -(-k // K_TILE) * K_TILE)
    params = torch.zeros(np_, ng_read, pw, dtype=qw.scales.dtype, device=qw.device)
    params[:n, :ng] = p
    params = params.reshape(np_ // (ROWS * GROUP_TILES), GROUP_TILES, ROWS, ng_read, pw).permute(0, 3, 1, 2, 4)
    gk = 31 if qw.config.group_size == PER_CHANNEL else qw.group_size.bit_length() - 1
    return params.contiguous(), ng_read, g, gk


def unpack_wgmma_v1(layout: WgmmaLayout) -> torch.Tensor:
    """Codes uint8 [N, K] read back from a ``wgmma_v1`` layout (for tests and debugging)."""
    w = layout.weight.transpose(1, 2)  # [Nt8, 8, Kt, B]
    w = w.reshape(-1, *w.shape[2:])
    ntl, ktl = w.shape[0], w.shape[1]
    if layout.bits == 4:
        lanes = w.reshape(ntl, ktl, 32, 16)
        slots = torch.stack([lanes & 0xF, lanes >> 4], dim=-1).reshape(ntl, ktl, 32, 32)
    else:
        slots = w.reshape(ntl, ktl, 2, 32, 16).transpose(2, 3).reshape(ntl, ktl, 32, 32)
    rows, ks = _slot_index(layout.bits)
    t = torch.zeros(ntl, ktl, ROWS, K_TILE, dtype=torch.uint8, device=w.device)
    t[:, :, rows.to(w.device), ks.to(w.device)] = slots
    codes = t.permute(0, 2, 1, 3).reshape(ntl * ROWS, ktl * K_TILE)
    return codes[: layout.n, : layout.k].contiguous()
