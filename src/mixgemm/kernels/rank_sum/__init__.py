"""``rank_sum``: the one-shot sum over the ranks of a tensor-parallel group (rank_sum.cu), for a decode step's
row-parallel outputs. Not a registry entry (it multiplies nothing): mixgemm.distributed.collectives takes it for the
sums it can hold (host.unsupported_reason) when the group's ranks share symmetric memory, NCCL otherwise.
"""

from mixgemm.kernels.rank_sum.host import CAPACITY, RankSum, group_reason, unsupported_reason

__all__ = ["CAPACITY", "RankSum", "group_reason", "unsupported_reason"]
