"""The launches a kernel's host code prepares, recorded: what the occupancy queries of the tools need (the CUfunction,
its grid, block, dynamic shared memory and cluster shape)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from mixgemm.kernels.cuda import nvrtc


@dataclass(frozen=True)
class PreparedLaunch:
    fn: object
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    cluster: tuple[int, int, int] | None

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def clusters_at_once(self) -> int:
        """Clusters of this launch the GPU holds at once (cuOccupancyMaxActiveClusters); a cluster launch only."""
        return nvrtc.max_active_clusters(self.fn, self.grid, self.block, self.shared_bytes, self.cluster)


@contextlib.contextmanager
def prepared_launches():
    """Inside the block every nvrtc.prepare_launch call (the kernels' host code calls it through the module, per call
    or per plan) is appended to the yielded list, and still prepares its launch."""
    seen: list[PreparedLaunch] = []
    orig = nvrtc.prepare_launch

    def spy(fn, device, grid, block, args, shared_bytes=0, pdl=False, cluster=None, first_without_pdl=False):
        seen.append(PreparedLaunch(fn, tuple(grid), tuple(block), shared_bytes, None if cluster is None else
                                   tuple(cluster)))
        return orig(fn, device, grid, block, args, shared_bytes, pdl, cluster, first_without_pdl)

    nvrtc.prepare_launch = spy
    try:
        yield seen
    finally:
        nvrtc.prepare_launch = orig
