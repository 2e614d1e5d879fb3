"""The vocabulary every kernel layout shares (built once per weight from the plain QuantizedWeight packing, cached by
``QuantizedWeight.layout(name, build)``): the fields each layout holds, the int4 nibble order and lane-slot indexing
of the tensor-core layouts, and the tile geometry of the two wgmma layouts (wgmma_v1, wgmma_a8_v1). Each layout's
builder lives with the kernel that reads it (mixgemm.kernels.layouts maps every name to its builder).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from mixgemm.formats.weight import PER_CHANNEL

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


def lane_slot_index(slots) -> tuple[torch.Tensor, torch.Tensor]:
    """(row in tile, k in tile) of every slot of every lane of a tile, as two int64 tensors [32, slots per lane];
    slots(g, t) yields the (row, k) pairs of lane 4 g + t in its slot order."""
    rows, ks = [], []
    for lane in range(32):
        pairs = list(slots(lane // 4, lane % 4))
        rows.append([r for r, _ in pairs])
        ks.append([k for _, k in pairs])
    return torch.tensor(rows), torch.tensor(ks)



K_TILE = 64


def groups_read(group_size: int, num_groups: int, k_padded: int) -> int:
    """The parameter groups a layout read in k-tiles must hold: every group of the padded K. Groups of 32 where
    K % 64 == 32 leave the padded half of the last 64-k tile a group of its own, which must exist and be finite (zero:
    the kernels multiply it by the zero-filled activations there), not the next rows' or unallocated parameters.
    Per channel: the one group."""
    return num_groups if group_size == PER_CHANNEL else max(num_groups, k_padded // group_size)
ROWS = 16
GROUP_TILES = 8  # row tiles stored together per k-tile


class WgmmaTiles:
    """Tile counts of the wgmma layouts (wgmma_v1, wgmma_a8_v1): 16-row tiles, TILE_K k per k-tile."""

    TILE_K: ClassVar[int] = K_TILE
    n: int
    k_padded: int

    @property
    def k_tiles(self) -> int:
        return self.k_padded // self.TILE_K

    @property
    def row_tiles(self) -> int:
        """16-row tiles holding real rows (the storage pads to a multiple of 8 of them)."""
        return -(-self.n // ROWS)
