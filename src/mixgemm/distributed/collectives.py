"""The two collectives a tensor-parallel decode step makes, on plain tensors (no DTensor in the step).

* ``sum_over_ranks``: a row-parallel layer's (or an experts module's) partial outputs summed over the ranks;
* ``gather_columns``: a column-parallel layer's output shards joined along the last dimension (a gathered lm_head).

Eager, each is one ``torch.distributed`` call in place (all_reduce / all_gather_single): the least host work a
sum over the ranks can cost. Under torch.compile each is torch's functional collective (``_functional_collectives``),
which inductor schedules as a graph node and the CUDA graph of ``mode="reduce-overhead"`` captures (NCCL kernels
capture; so would a symmetric-memory all-reduce, which measured no faster for a decode step's 16 KB on two H200s).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

# torch 2.13 names all_gather_into_tensor all_gather_single (the old name warns); 2.11 has only the old one
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def sum_over_ranks(y: torch.Tensor, group) -> torch.Tensor:
    """``y`` summed over the ranks of ``group``: in place when eager (``y`` is this rank's fresh partial output)."""
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


__all__ = ["gather_columns", "sum_over_ranks"]
