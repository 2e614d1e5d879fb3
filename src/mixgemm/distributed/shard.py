"""Slicing a block-quantized weight, or a QuantLinear, into one rank's tensor-parallel shard.

Pure functions of (weight, rank, world): no process group is needed, so every check can be tested in one
process, and every rank reaches the same verdict (a bad split raises on all ranks, before any collective).

* Column parallel (``dim=0``, split along N): each rank keeps N / world whole output rows: their packed codes,
  scales, zeros / offsets and bias. Any row count: the kernels' layouts pad a shard's rows to their row tile (16;
  the wgmma GEMM's 128) with zero codes and never write the padding, so a shard of 500 rows (a vocabulary of 1000
  at TP 2) is an ordinary layer of 500 rows. A layer whose output is gathered (lm_head) may also have an N that
  ``world`` does not divide (``uneven``): each rank keeps ceil(N / world) rows, the last ranks' tails zero rows
  (zero codes and scales: their outputs are 0) that the gather drops. A packed layer of ``parts`` equal row blocks
  (a fused gate / up projection, whose output the model cuts in two) splits each block alike and keeps its shards'
  blocks in order (transformers' "packed_colwise"), so the model's cut still finds them.
* Row parallel (``dim=1``, split along K): each rank keeps K / world input features of every row. The split must
  fall on group boundaries (K / world a multiple of the group size), so every group's scale, zero point and offset
  go with it whole; where it does not, a weight-only layer (``regroup``) is re-grouped, exactly, into the largest
  group size of GROUP_SIZES that divides both the group size and K / world, each new group repeating its old
  group's scale, zero point and offset (K = 11008 in groups of 128 at TP 4: 2752 per rank, 43 groups of 64); an
  activation-quantized layer's groups are its activation blocks too, so it is refused instead. A per-channel weight
  (group -1: one group spanning K) splits anywhere (an odd K per rank at 4 bits is repacked, its rows ending in a
  padding nibble, mixgemm.formats.packing): each shard keeps the channel's scale (and zero / offset)
  for its slice, and w = (q - z) s is still exact element by element. Integer group scales (W4A8,
  mixgemm.formats.int_scales) stay integer multiples of their row's step in any subset of the groups.
  The partial products of the shards are summed by an all-reduce, so the bias must be added once: rank 0 keeps
  it, the other ranks hold zeros (the same state-dict keys and shapes on every rank).

An optional ``input_perm`` (act-order: the layer reads ``x[..., input_perm]``) is kept whole by a column split (the
input is replicated). A row split can keep it only when each rank's slice of the permutation stays inside that
rank's own slice of the input (then it becomes a local permutation); otherwise the shard would need inputs that
live on another rank and the split is refused.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from mixgemm.formats.packing import pack_codes
from mixgemm.formats.weight import GROUP_SIZES, PER_CHANNEL, QuantConfig, QuantizedWeight
from mixgemm.nn.linear import QuantLinear

COLWISE, ROWWISE = 0, 1
_DIM_NAME = {COLWISE: "column-parallel (split along N, the output features)",
             ROWWISE: "row-parallel (split along K, the input features)"}


def _check_rank(rank: int, world: int) -> None:
    if not (isinstance(world, int) and world >= 1 and isinstance(rank, int) and 0 <= rank < world):
        raise ValueError(f"need 0 <= rank < world with world >= 1, got rank={rank!r}, world={world!r}")


def _check_dim(dim: int) -> None:
    if dim not in _DIM_NAME:
        raise ValueError(f"dim must be 0 (column-parallel, along N) or 1 (row-parallel, along K), got {dim!r}")


def split_group(group: int, local: int) -> int | None:
    """The largest group size of GROUP_SIZES that divides ``group`` and ``local`` (the K a rank keeps), or None: the
    groups a row split that cuts groups of ``group`` re-groups a weight-only layer into."""
    return max((g for g in GROUP_SIZES if group % g == 0 and local % g == 0), default=None)


def check_split(shape: tuple[int, int], config: QuantConfig, dim: int, world: int, layer: str = "weight",
                parts: int = 1, uneven: bool = False, regroup: bool = False) -> int:
    """Check that an [N, K] weight in ``config`` splits exactly into ``world`` shards along ``dim`` (0: N, 1: K; a
    column split of ``parts`` packed row blocks splits each block; ``uneven``: a column split whose output is
    gathered, where N need not divide; ``regroup``: a weight-only layer, whose row split may re-group a cut group,
    module docstring); return the shard's size along that dim (rows held, with
    the padding). Raises ValueError naming ``layer`` and the sizes otherwise."""
    _check_dim(dim)
    _check_rank(0, world)
    n, k = shape
    if parts != 1:
        if dim != COLWISE or parts < 1 or n % parts:
            raise ValueError(f"{layer}: a packed split takes the rows (dim 0) of [N={n}, K={k}] in {parts} equal "
                             "blocks")
        return parts * check_split((n // parts, k), config, COLWISE, world, f"{layer} (each of its {parts} packed "
                                   "row blocks)")
    size = shape[dim]
    if world == 1:  # nothing is split
        return size
    what = "N (out_features)" if dim == COLWISE else "K (in_features)"
    if dim == COLWISE and uneven:
        return -(-size // world)
    if size % world:
        raise ValueError(f"{layer}: {_DIM_NAME[dim]} split of [N={n}, K={k}] over {world} ranks: {what}={size} is not "
                         f"divisible by {world}" + (" (only a gathered output, as lm_head's, splits unevenly)"
                                                    if dim == COLWISE else ""))
    local = size // world
    if dim == COLWISE:
        return local
    g = k if config.group_size == PER_CHANNEL else config.group_size
    if config.group_size != PER_CHANNEL and local % g and not (regroup and split_group(g, local)):
        why = ("no group size of 32 or more divides both, to re-group it into" if regroup else
               "an activation-quantized layer's groups are its activation blocks, so they are not re-grouped")
        raise ValueError(f"{layer}: row-parallel split of [N={n}, K={k}] over {world} ranks gives K={local} per rank, "
                         f"not a multiple of the group size {g}: a group (its scale, zero point / offset) would be "
                         f"cut in two ({why})")
    return local


def _take(t: torch.Tensor | None, dim: int, start: int, stop: int) -> torch.Tensor | None:
    """A compact copy of t[start:stop] along dim (a copy, so the full tensor can be freed)."""
    if t is None:
        return None
    return t.narrow(dim, start, stop - start).clone(memory_format=torch.contiguous_format)


def _take_rows(t: torch.Tensor | None, n: int, parts: int, rank: int, local: int) -> torch.Tensor | None:
    """Rank ``rank``'s ``local`` rows of each of the ``parts`` row blocks of t (n rows), the blocks' shards in order
    (a copy); rows past a block's end are zeros (an uneven split's padding)."""
    if t is None or t.numel() == 0:
        return None if t is None else t.clone()
    block = n // parts
    out = []
    for p in range(parts):
        a = min(rank * local, block)
        b = min(a + local, block) if rank * local < block else a
        rows = _take(t, 0, p * block + a, p * block + b)
        if b - a < local:
            rows = torch.cat([rows, rows.new_zeros((local - (b - a), *t.shape[1:]))])
        out.append(rows)
    return torch.cat(out)


def regrouped(qw: QuantizedWeight, group: int) -> QuantizedWeight:
    """``qw`` in groups of ``group`` (a divisor of its group size): the same codes, each group's scale, zero point
    and offset repeated over the new groups it spans: the same weight, exactly. A new QuantizedWeight."""
    times = qw.config.group_size // group
    ng = -(-qw.in_features // group)  # (a partial last group spans fewer new groups)

    def rep(t):
        return None if t is None else t.repeat_interleave(times, dim=1)[:, :ng].contiguous()

    return replace(qw, _layouts={}, resident=None, qweight=qw.packed(), scales=rep(qw.scales), zeros=rep(qw.zeros),
                   offsets=rep(qw.offsets), config=replace(qw.config, group_size=group))


def shard_quantized_weight(qw: QuantizedWeight, dim: int, rank: int, world: int,
                           layer: str = "weight", parts: int = 1, uneven: bool = False,
                           regroup: bool = False) -> QuantizedWeight:
    """Rank ``rank``'s shard (of ``world``) of ``qw`` along ``dim`` (0: N rows, 1: K columns; ``parts`` packed row
    blocks, module docstring), as a new QuantizedWeight [N / world, K] or [N, K / world] with its own copies of the
    tensors (plain codes, also from a compacted weight); ``qw`` is not modified. ``uneven``: a column split of a
    gathered output, N need not divide (ceil(N / world) rows each, zero rows past N). ``regroup``: a row split that
    cuts a group re-groups the weight first (``regrouped``; weight-only layers).
    Raises ValueError (naming ``layer`` and the sizes) when the split cannot be exact (module docstring)."""
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"{layer}: expected a QuantizedWeight, got {type(qw).__name__}")
    _check_rank(rank, world)
    local = check_split(qw.shape, qw.config, dim, world, layer, parts, uneven, regroup)
    n, k = qw.shape
    if dim == ROWWISE and qw.config.group_size != PER_CHANNEL and local % qw.config.group_size:
        qw = regrouped(qw, split_group(qw.config.group_size, local))
    a, b = rank * local, (rank + 1) * local
    if dim == COLWISE:
        rows = local // parts
        return replace(qw, _layouts={}, resident=None, qweight=_take_rows(qw.packed(), n, parts, rank, rows),
                       scales=_take_rows(qw.scales, n, parts, rank, rows),
                       zeros=_take_rows(qw.zeros, n, parts, rank, rows),
                       offsets=_take_rows(qw.offsets, n, parts, rank, rows), shape=(local, k))
    per_byte = 8 // qw.bits
    if local % per_byte:  # an odd K per rank at 4 bits: its codes start or end inside a byte, repacked
        qweight = pack_codes(qw.codes()[:, a:b].contiguous(), qw.bits)
    else:
        qweight = _take(qw.packed(), 1, a // per_byte, b // per_byte)
    if qw.config.group_size == PER_CHANNEL:  # one group spans K: every shard keeps the channel's parameters
        ga, gb = 0, 1
    else:
        ga, gb = a // qw.config.group_size, b // qw.config.group_size
    return replace(qw, _layouts={}, resident=None, qweight=qweight,
                   scales=_take(qw.scales, 1, ga, gb), zeros=_take(qw.zeros, 1, ga, gb),
                   offsets=_take(qw.offsets, 1, ga, gb), shape=(n, local))


def _shard_perm(perm: torch.Tensor, dim: int, rank: int, world: int, layer: str) -> torch.Tensor:
    if dim == COLWISE:
        return perm.clone()
    local = perm.numel() // world
    a = rank * local
    mine = perm[a:a + local]
    if world > 1 and not bool(((perm.view(world, local) // local)
                               == torch.arange(world, device=perm.device)[:, None]).all()):
        raise ValueError(f"{layer}: row-parallel split of a layer with an input permutation (act-order) over {world} "
                         "ranks: the permutation moves input features across rank slices, so a rank would need inputs "
                         "held by another rank; shard it column-parallel, or keep it replicated")
    return (mine - a).clone()


def shard_quant_linear(module: QuantLinear, dim: int, rank: int, world: int, layer: str = "",
                       parts: int = 1, uneven: bool = False) -> QuantLinear:
    """Rank ``rank``'s shard of a QuantLinear as a new, ordinary QuantLinear (its own buffers, its own N / K in the
    state dict); ``module`` is not modified. dim 0: column parallel (rows of N, bias sliced with them; ``parts``
    packed row blocks each split alike; ``uneven``: N need not divide, shard_quantized_weight); dim 1: row parallel
    (K slice; the bias on rank 0 only, zeros elsewhere, so the summed partial outputs add it once)."""
    if not isinstance(module, QuantLinear):
        raise TypeError(f"{layer or 'module'}: expected a QuantLinear, got {type(module).__name__}")
    layer = layer or f"QuantLinear(in_features={module.in_features}, out_features={module.out_features})"
    _check_dim(dim)
    _check_rank(rank, world)
    qw = shard_quantized_weight(module.quantized_weight(), dim, rank, world, layer, parts, uneven,
                                regroup=module.act_mode is None)
    bias = module.bias
    if bias is not None:
        bias = bias.detach()
        if dim == COLWISE:
            bias = _take_rows(bias, module.out_features, parts, rank, qw.out_features // parts)
        elif rank != 0:
            bias = torch.zeros_like(bias)
    perm = getattr(module, "input_perm", None)
    if module.input_gathered_by is not None and dim != COLWISE:
        raise ValueError(f"{layer}: row-parallel split of a layer whose input arrives gathered through its "
                         f"act-order permutation by {module.input_gathered_by} (only column splits keep that input "
                         "whole)")
    if perm is not None:
        perm = _shard_perm(perm, dim, rank, world, layer)
    shard = QuantLinear.from_quantized(qw, bias, act_mode=module.act_mode, act_block=module.act_block)
    if perm is not None:
        if "input_perm" in shard._buffers:
            shard.input_perm = perm
        else:
            shard.register_buffer("input_perm", perm)
        shard.input_gathered_by = module.input_gathered_by  # a column split reads the same gathered input
    return shard.train(module.training)


__all__ = ["COLWISE", "ROWWISE", "check_split", "regrouped", "shard_quant_linear", "shard_quantized_weight",
           "split_group"]
