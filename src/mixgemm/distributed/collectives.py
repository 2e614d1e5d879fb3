"""The two collectives a tensor-parallel decode step makes, on plain tensors (no DTensor in the step).

* ``sum_over_ranks``: a row-parallel layer's (or an experts module's) partial outputs summed over the ranks;
* ``gather_columns``: a column-parallel layer's output shards joined along the last dimension (a gathered lm_head).

With ``use_one_shot_sums(True)`` (off by default: not yet measured on a multi-GPU machine), a sum goes through
mixgemm's one-shot kernel (mixgemm.kernels.rank_sum: one launch on the caller's stream, a flag round trip and one
read of the other ranks' pieces over NVLink) where the group has one (``one_shot_sums``: CUDA ranks that share
symmetric memory, all of them agreeing) and the message fits it (a decode step's); eager it is
called directly, under torch.compile as the op ``mixgemm::rank_sum``, which the CUDA graph of
``mode="reduce-overhead"`` captures. Otherwise, and for the gather: eager one ``torch.distributed`` call in place
(all_reduce / all_gather_single), under torch.compile torch's functional collective (``_functional_collectives``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import Tensor

from mixgemm.kernels import rank_sum

# torch 2.13 names all_gather_into_tensor all_gather_single (the old name warns); 2.11 has only the old one
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


_ONE_SHOT: dict[int, rank_sum.RankSum] = {}  # by RankSum.key: what the compiled op finds its workspace by
_BY_GROUP: dict[tuple, rank_sum.RankSum | None] = {}  # (group name, device index) -> the group's, or None (NCCL)
_WHY_NOT: dict[tuple, str] = {}  # (group name, device index) -> why that group has none


def one_shot_sums(group, device: torch.device) -> rank_sum.RankSum | None:
    """The one-shot sum of ``group`` on ``device``, made on the first call (collective: every rank of the group calls
    this at the same point, as parallelizing a model does), or None where the ranks sum through NCCL: not CUDA, more
    ranks than the kernel spans, no symmetric memory between them, or any rank failing to set it up (the ranks
    agree, so that no rank waits in a sum the others make through NCCL). ``why_no_one_shot`` says which."""
    key = (group.group_name, device.index)
    if key in _BY_GROUP:
        return _BY_GROUP[key]
    made = None
    why = rank_sum.group_reason(device, dist.get_world_size(group))
    if why is None:
        try:
            made = rank_sum.RankSum(group, device)
        except Exception as e:  # noqa: BLE001 -- the reason is agreed on below and reported by why_no_one_shot
            why = f"symmetric memory could not be set up: {type(e).__name__}: {e}"[:300]
    verdicts = [None] * dist.get_world_size(group)
    dist.all_gather_object(verdicts, why, group=group)
    refused = next((f"rank {r}: {v}" for r, v in enumerate(verdicts) if v is not None), None)
    if refused is not None:
        made, _WHY_NOT[key] = None, refused
    else:
        _ONE_SHOT[made.key] = made
    _BY_GROUP[key] = made
    return made


def why_no_one_shot(group, device: torch.device) -> str | None:
    """Why ``group``'s sums on ``device`` go through NCCL (None: they take the one-shot kernel where it fits; not asked
    yet: ``one_shot_sums`` decides)."""
    return _WHY_NOT.get((group.group_name, device.index))


@torch.library.custom_op("mixgemm::rank_sum", mutates_args=())
def _rank_sum_op(y: Tensor, key: int) -> Tensor:
    return _ONE_SHOT[key](y)


@_rank_sum_op.register_fake
def _rank_sum_fake(y: Tensor, key: int) -> Tensor:
    return torch.empty_like(y, memory_format=torch.contiguous_format)


# Off until the kernel is measured against NCCL on a multi-GPU machine (tools/checks/tp_decode_bench: the A/B and the
# GPU test tests/distributed/test_rank_sum.py); until then a sharded model sums through NCCL unless asked
_enabled = False


def use_one_shot_sums(enabled: bool) -> None:
    """Sum through the one-shot kernel where a group has one (True) or through NCCL (False, the default). Every rank
    alike. Called before tensor_parallel_ (the group's one-shot workspace is made while the model is sharded, only
    when enabled); switching later changes the path of the next eager call, and a compiled step re-traces."""
    global _enabled
    _enabled = bool(enabled)


def one_shot_enabled() -> bool:
    return _enabled


def sum_over_ranks(y: torch.Tensor, group, one_shot: rank_sum.RankSum | None = None) -> torch.Tensor:
    """``y`` summed over the ranks of ``group``: through ``one_shot`` (the group's ``one_shot_sums``) where it takes
    ``y``, a new tensor; otherwise NCCL's, in place when eager (``y`` is this rank's fresh partial output)."""
    if one_shot is not None and _enabled and rank_sum.unsupported_reason(y) is None:
        if torch.compiler.is_compiling():
            return torch.ops.mixgemm.rank_sum(y, one_shot.key)
        return one_shot(y)
    if torch.compiler.is_compiling():
        return funcol.all_reduce(y, "sum", group)
    dist.all_reduce(y, group=group)
    return y


def gather_columns(y: torch.Tensor, group, world: int) -> torch.Tensor:
    """The ranks' [..., n] outputs of ``group`` side by side in rank order: [..., world * n]."""
    lead, n = y.shape[:-1], y.shape[-1]
    rows = y.reshape(-1, n)
    if torch.compiler.is_compiling():
        stacked = funcol.all_gather_tensor(rows, 0, group)
    else:
        stacked = rows.new_empty((world * rows.shape[0], n))
        _all_gather_single(stacked, rows.contiguous(), group=group)
    return stacked.view(world, rows.shape[0], n).transpose(0, 1).reshape(*lead, world * n)


__all__ = ["gather_columns", "one_shot_enabled", "one_shot_sums", "sum_over_ranks", "use_one_shot_sums",
           "why_no_one_shot"]
