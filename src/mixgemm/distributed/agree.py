"""Before tensor_parallel_ moves a weight, every rank agrees: on the verdict of the checks, and on the model.

Each rank's checks are pure functions of its model and the mesh size, so ranks holding the same model reach the same
verdict; but a rank whose model differs (another config, another checkpoint, a layer quantized on one rank only)
would pass its checks and then wait forever in a broadcast the others never make, or shard weights that do not match.
So the ranks exchange (one all_gather_object over the mesh's group) their verdict and a description of their model:
every parameter's and buffer's name, shape and dtype, and, where each rank keeps its own weights
(``src_data_rank=None``), a checksum of its bytes. Any refusal, or any difference, is then one error on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

# bytes summed per step of the checksum (bounds its temporary memory: 8 bytes an element, 512 MiB)
_CHUNK = 1 << 26


def _checksum(t: torch.Tensor) -> int:
    """A position-weighted sum of ``t``'s bytes (equal tensors give equal sums; a changed or moved byte changes it)."""
    if t.numel() == 0:
        return 0
    data = t.detach().contiguous().view(-1).view(torch.uint8)
    total = 0
    for start in range(0, data.numel(), _CHUNK):
        chunk = data[start:start + _CHUNK].long()
        weight = torch.arange(start, start + chunk.numel(), device=chunk.device) % 65521 + 1
        total += int((chunk * weight).sum())
    return total


def describe(model: nn.Module, values: bool) -> list[tuple]:
    """(name, shape, dtype, checksum or None) of every parameter and buffer of ``model``, in order."""
    tensors = [*model.named_parameters(), *((n, b) for n, b in model.named_buffers() if b is not None)]
    return [(name, tuple(t.shape), str(t.dtype), _checksum(t) if values else None) for name, t in tensors]


def _first_difference(ref: list[tuple], other: list[tuple]) -> str | None:
    mine = {e[0]: e for e in other}
    theirs = {e[0]: e for e in ref}
    for name in theirs.keys() - mine.keys():
        return f"{name} is missing"
    for name in mine.keys() - theirs.keys():
        return f"{name} is not in rank 0's model"
    for name, a in theirs.items():
        b = mine[name]
        if a[1:3] != b[1:3]:
            return f"{name} is {b[2]} {list(b[1])}, rank 0's {a[2]} {list(a[1])}"
        if a[3] != b[3]:
            return (f"{name} holds other values than rank 0's (src_data_rank=None: every rank keeps its own weights, "
                    "which must then be equal; src_data_rank=0 broadcasts rank 0's)")
    return None


def agree_on_every_rank(model: nn.Module, device_mesh, verdict: tuple[type, str] | None, values: bool) -> None:
    """Exchange this rank's ``verdict`` ((exception class, message) or None) and model description; raise on every
    rank when any rank refused (its message, and which ranks when not all) or the models differ (ValueError naming
    the first differing tensor and rank)."""
    everyone: list = [None] * device_mesh.size()
    dist.all_gather_object(everyone, (verdict, describe(model, values)), group=device_mesh.get_group())
    refused = {r: v for r, (v, _) in enumerate(everyone) if v is not None}
    if refused:
        cls, msg = refused[min(refused)]
        if len(refused) == len(everyone) and len(set(refused.values())) == 1:
            raise cls(msg)
        raise cls(f"tensor_parallel_ refused on rank(s) {sorted(refused)} of {len(everyone)} (the ranks' models "
                  f"differ): {msg}")
    ref = everyone[0][1]
    for r, (_, other) in enumerate(everyone[1:], 1):
        diff = _first_difference(ref, other)
        if diff is not None:
            raise ValueError(f"tensor_parallel_: the ranks hold different models: on rank {r}, {diff}; every rank "
                             "must build the same model before sharding it")


__all__ = ["agree_on_every_rank", "describe"]
