"""``rows_v1``: one int8 layout that the CUDA-core GEMV, the tensor-core GEMV and the wgmma GEMM all read (opt-in:
``QuantLinear.compact_("rows_v1")``; compacted int8 weight-only layers keep wgmma_v1 by default).

Status (H100, docs/architecture.md Open items): M = 1 runs the CUDA-core GEMV at the plain codes' speed and the GEMM at
M >= 512 is level with wgmma_v1, but the tensor-core GEMV at M = 2..16 takes 1.3-1.4x its time on wgmma_v1 (its
16-row x 64-byte loads against wgmma_v1's 512 contiguous bytes per warp load), so it is not the default.

* ``weight``: uint8 [N_16, K_pad] (N_16 = N rounded up to 16 rows, K_pad = K rounded up to 64; padded codes 0: padded
  k meet zero activations, padded rows are never stored, and a 16-row tile's rows all exist), row-major like the
  plain codes, with k permuted inside each 16: byte 4 t + i of a 16-byte chunk holds k = 2 t + (i & 1) + 8 (i >> 1)
  of that chunk (``ROWS_PERM``), so 32-bit word t of a chunk is (k 2t, 2t + 1, 2t + 8,
  2t + 9) -- lane t's share of one k16 step of a tensor-core A fragment (mma_frag.cuh's int8 word).
  Why this order: the wgmma GEMM loads a row tile with TMA and takes each lane's word with one ``ldmatrix`` (lane (g,
  t) gets word t of row g's 16 bytes) instead of a fragment-ordered copy, so the rows stay rows; the CUDA-core GEMV
  still reads a row's 16-byte chunks as it reads the plain codes (a lane meets the same 16 k of x, pairs renamed at
  compile time); and the tensor-core GEMV lets lane t take all four words of chunk t, putting chunk t's k in the mma's
  k slots of lane t (the mma's k order is free as long as A and B agree), so its x is one contiguous piece per lane.
  Why rows and not wgmma_v1's 16-row tiles: at one activation row the GEMV reads fastest with a few rows per block
  over all of K (docs/architecture.md, the int8 M = 1 gap on wgmma_v1).
* ``params``: wgmma_v1's, [N_pad / 128, G, 8, 16, PW] (N_pad = N rounded up to 128, padded rows zero): the GEMM
  streams one 128-row block's groups with one bulk copy; the GEMVs address them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm.formats.layouts import K_TILE, KernelLayout
from mixgemm.formats.weight import QuantizedWeight, narrow_group_reason
from mixgemm.kernels.cuda_wgmma.layout import wgmma_params

ROWS_LAYOUT = "rows_v1"  # its name (QuantizedWeight.resident of a weight that keeps only it)
CHUNK = 16
# byte p of a 16-byte chunk holds k = ROWS_PERM[p] of the chunk
ROWS_PERM = tuple(2 * (p // 4) + (p % 2) + 8 * ((p % 4) // 2) for p in range(CHUNK))


@dataclass(frozen=True)
class RowsLayout(KernelLayout):
    """The ``rows_v1`` layout of one int8 weight (see the module docstring): weight uint8 [N_16, K_pad], params as
    wgmma_v1's."""

    gk: int  # group of k = min(k >> gk, G - 1); 31 for per-channel

    @property
    def k_tiles(self) -> int:
        return self.k_padded // K_TILE

    @property
    def row_bytes(self) -> int:
        return self.k_padded

    # the CUDA-core GEMV's view (kernels/cuda_gemv/layout.py GemvLayout): 16-byte chunks of 16 k, chunk c in group
    # c >> gshift
    chunk = CHUNK

    @property
    def chunks_per_row(self) -> int:
        return self.k_padded // CHUNK

    @property
    def gshift(self) -> int:
        return self.gk - 4


def rows_supported(qw: QuantizedWeight) -> str | None:
    """Why ``qw`` cannot take rows_v1, or None."""
    if qw.bits != 8:
        return f"rows_v1 holds int8 weights, this one is int{qw.bits}"
    return narrow_group_reason(qw.group_size, qw.num_groups)


def build_rows_v1(qw: QuantizedWeight) -> RowsLayout:
    """Repack ``qw`` into rows_v1 (on qw's device). The plain tensors are not modified."""
    why = rows_supported(qw)
    if why:
        raise ValueError(why)
    n, k = qw.shape
    kp = -(-k // K_TILE) * K_TILE
    n16 = -(-n // 16) * 16
    full = torch.zeros(n16, kp, dtype=torch.uint8, device=qw.device)
    full[:n, :k] = qw.codes()
    perm = torch.tensor(ROWS_PERM, device=qw.device)
    weight = full.reshape(n16, kp // CHUNK, CHUNK)[:, :, perm].reshape(n16, kp).contiguous()
    params, ng, g, gk = wgmma_params(qw)
    return RowsLayout(weight=weight, params=params, n=n, k=k, k_padded=kp, bits=8, mode=qw.mode, group_size=g,
                      num_groups=ng, gk=gk)


def unpack_rows_v1(layout: RowsLayout) -> torch.Tensor:
    """Codes uint8 [N, K] read back from a rows_v1 layout."""
    n, kp = layout.weight.shape
    inv = torch.empty(CHUNK, dtype=torch.long)
    inv[torch.tensor(ROWS_PERM)] = torch.arange(CHUNK)
    codes = layout.weight.reshape(n, kp // CHUNK, CHUNK)[:, :, inv.to(layout.weight.device)].reshape(n, kp)
    return codes[: layout.n, : layout.k].contiguous()
