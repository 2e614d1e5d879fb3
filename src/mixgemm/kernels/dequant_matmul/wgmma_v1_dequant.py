"""One Triton kernel: a weight's ``wgmma_v1`` layout (mixgemm.kernels.cuda_wgmma.layout) -> its float matrix [N, K].

The layout is the one a Hopper weight keeps resident (the wgmma GEMM's, which the GEMVs also read), so the
dequantize + cuBLAS route needs no second copy of the codes. Each program expands one 128-row block of one 64-k tile
(the layout's unit: 8 row tiles of 16 x 64 stored back to back): a fixed table maps each (row, k) of a 16 x 64 tile to
its byte and bit shift inside the tile (the inverse of the lanes' A-fragment order), so the loads stay inside that
block's 4 KiB (int4) / 8 KiB (int8) and every store is a contiguous row run of the output.
Values: w = (q - z) * s (sym: z = 2^(bits - 1)) or q * s + m ("offset"), in float32, rounded once to the output dtype.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from mixgemm.formats.layouts import GROUP_TILES, K_TILE, ROWS
from mixgemm.kernels.cuda_wgmma.layout import WgmmaLayout, _slot_index

_MODES = {"sym": 0, "zero_point": 1, "offset": 2}
_TL = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}
TILE_BYTES = {4: ROWS * K_TILE // 2, 8: ROWS * K_TILE}


@functools.cache
def _tile_map(bits: int) -> torch.Tensor:
    """int32 [16 * 64] (row-major over (row, k) of a tile): byte in the tile * 8 + bit shift of that element's code."""
    rows, ks = _slot_index(bits)  # [32 lanes, 32 slots] -> (row, k)
    lane = torch.arange(32)[:, None].expand(32, 32)
    slot = torch.arange(32)[None, :].expand(32, 32)
    if bits == 4:  # lane's 16 bytes; slot j is nibble j % 2 of byte j // 2
        byte, shift = lane * 16 + slot // 2, 4 * (slot % 2)
    else:  # uint4 u = j // 16 of all lanes is contiguous: byte 512 u + 16 lane + j % 16
        byte, shift = 512 * (slot // 16) + lane * 16 + slot % 16, torch.zeros_like(slot)
    out = torch.empty(ROWS, K_TILE, dtype=torch.int32)
    out[rows, ks] = (byte * 8 + shift).to(torch.int32)
    return out.reshape(-1)


_MAPS: dict = {}


def _device_map(bits: int, device: torch.device) -> torch.Tensor:
    key = (bits, device)
    hit = _MAPS.get(key)
    if hit is None:
        hit = _MAPS[key] = _tile_map(bits).to(device)
    return hit


@triton.jit
def _wgmma_v1_dequant_kernel(w_ptr, p_ptr, map_ptr, out_ptr, N, K, KT, G, GK,
                             BITS: tl.constexpr, MODE: tl.constexpr, PW: tl.constexpr, TB: tl.constexpr,
                             OUT_DTYPE: tl.constexpr):
    nb = tl.program_id(0)  # 128-row block
    kt = tl.program_id(1)  # 64-k tile
    r = tl.arange(0, 128)  # row in the block
    c = tl.arange(0, 64)  # k in the tile
    t = r // 16
    ent = tl.load(map_ptr + (r % 16)[:, None] * 64 + c[None, :])  # [128, 64] byte * 8 + shift
    base = (nb.to(tl.int64) * KT + kt) * (8 * TB)
    byte = tl.load(w_ptr + base + t[:, None] * TB + (ent >> 3)).to(tl.int32)
    q = ((byte >> (ent & 7)) & ((1 << BITS) - 1)).to(tl.float32)
    k = kt * 64 + c
    g = tl.minimum(k >> GK, G - 1)  # the layout's group of k (GK 31: per-channel)
    pidx = ((nb.to(tl.int64) * G + g[None, :]) * 8 + t[:, None]) * 16 + (r % 16)[:, None]
    s = tl.load(p_ptr + pidx * PW).to(tl.float32)
    if MODE == 0:
        w = (q - (1 << (BITS - 1))) * s
    elif MODE == 1:
        w = (q - tl.load(p_ptr + pidx * PW + 1).to(tl.float32)) * s
    else:
        w = q * s + tl.load(p_ptr + pidx * PW + 1).to(tl.float32)
    n = nb * 128 + r
    mask = (n[:, None] < N) & (k[None, :] < K)
    if OUT_DTYPE == tl.bfloat16:  # noqa: SIM300
        # round to nearest even by hand: Triton's interpreter truncates in fp32 -> bf16 casts, the GPU rounds
        bits = w.to(tl.int32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        v = (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        v = w.to(OUT_DTYPE)
    tl.store(out_ptr + n[:, None].to(tl.int64) * K + k[None, :], v, mask=mask)


def dequantize_wgmma_v1(lay: WgmmaLayout, out: torch.Tensor, row0: int = 0) -> torch.Tensor:
    """Write rows row0 .. row0 + out.shape[0] of the weight held in ``lay`` into ``out`` ([rows, K], float16 / bfloat16
    / float32, contiguous, on the layout's device); row0 a multiple of 128 (the layout's row block)."""
    rows, k = out.shape
    if row0 % (ROWS * GROUP_TILES) or k != lay.k or not out.is_contiguous() or row0 + rows > lay.n:
        raise ValueError(f"dequantize_wgmma_v1: out {tuple(out.shape)} at row {row0} does not fit the layout "
                         f"[{lay.n}, {lay.k}] in 128-row blocks")
    if out.dtype not in _TL:
        raise TypeError(f"dequantize_wgmma_v1: out dtype {out.dtype} (takes float16 / bfloat16 / float32)")
    if rows == 0:
        return out
    nb0 = row0 // (ROWS * GROUP_TILES)
    blocks = -(-rows // (ROWS * GROUP_TILES))
    weight = lay.weight[nb0:nb0 + blocks]
    params = lay.params[nb0:nb0 + blocks]
    _wgmma_v1_dequant_kernel[(blocks, lay.k_tiles)](
        weight, params, _device_map(lay.bits, weight.device), out, rows, k, lay.k_tiles, lay.num_groups, lay.gk,
        BITS=lay.bits, MODE=_MODES[lay.mode], PW=params.shape[-1], TB=TILE_BYTES[lay.bits], OUT_DTYPE=_TL[out.dtype],
        num_warps=4)
    return out
