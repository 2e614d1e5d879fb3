"""ColwiseParallel / RowwiseParallel for QuantLinear: drop-in for torch's styles in ``parallelize_module``.

They are torch's own ``ColwiseParallel`` / ``RowwiseParallel`` (same keyword options ``input_layouts``,
``output_layouts``, ``use_local_output``, same defaults and same meaning) extended to QuantLinear; an ``nn.Linear`` or
``nn.Embedding`` is handed to torch's implementation unchanged, so one plan can mix float and quantized layers.

How a QuantLinear is sharded. Its buffers stay plain local tensors (the CUDA kernels read plain tensors): each rank
holds an ordinary, smaller QuantLinear (mixgemm.distributed.shard), and the module's forward runs the single-GPU
kernels on that shard.

* With the layouts a model's plan uses (column parallel: a replicated input, the output left sharded or gathered;
  row parallel: a sharded input, the output summed), the shard becomes a ColwiseQuantLinear / RowwiseQuantLinear
  (the QuantLinear class with a forward that adds the one collective: mixgemm.distributed.collectives): plain
  tensors in and out, no hook, no DTensor, so an eager decode step's host work per layer is one GPU's plus the
  all-reduce, and a compiled one holds the collective as a graph node (captured in the CUDA graph). A DTensor input
  is still taken (redistributed to the layout the shard reads).
* Other layouts: hooks around the forward do what DTensor sharding propagation does for torch's styles. Before
  forward the input (a local tensor laid out as ``input_layouts``, or a DTensor) is redistributed to what the shard
  needs (Replicate for column parallel, Shard(-1) for row parallel) and handed over as a local tensor; after forward
  the local output is the DTensor Shard(-1) (column parallel) or Partial (row parallel: a sum over ranks; rank 0
  carries the bias) and is redistributed to ``output_layouts`` (all-gather, all-reduce or reduce-scatter, by
  torch.distributed), returned as a local tensor when ``use_local_output`` (default) or as the DTensor.

``src_data_rank`` (set by ``parallelize_module``, default 0): the rank whose weights are the reference; the others
receive its tensors by a broadcast before slicing (None: every rank slices its own copy, which must then be equal).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel as _TorchColwise
from torch.distributed.tensor.parallel import ParallelStyle
from torch.distributed.tensor.parallel import RowwiseParallel as _TorchRowwise

from mixgemm.distributed.collectives import gather_columns, one_shot_enabled, one_shot_sums, sum_over_ranks
from mixgemm.distributed.shard import COLWISE, ROWWISE, shard_quant_linear
from mixgemm.nn.experts import ExpertList, QuantizedExperts
from mixgemm.nn.linear import QuantLinear

# nn.Linear -> (style, mesh) for the Linears our styles handed to torch: quantize_ after sharding quantizes the full
# weight and shards the QuantLinear with the same style (weak keys: a dropped model takes its entries with it).
_LINEAR_STYLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _check_mesh(device_mesh: DeviceMesh, module: nn.Module) -> tuple[int, int]:
    if not isinstance(device_mesh, DeviceMesh):
        raise TypeError(f"device_mesh must be a torch DeviceMesh, got {type(device_mesh).__name__}")
    if device_mesh.ndim != 1:
        raise ValueError(f"tensor parallelism takes a 1-D DeviceMesh (slice an N-D mesh, e.g. mesh['tp']), got "
                         f"{device_mesh.ndim}-D mesh {tuple(device_mesh.shape)}")
    if isinstance(module, QuantLinear) and module.compact is not None:
        raise ValueError(f"{module}: a compacted layer (compact_) holds its codes only in its {module.compact} layout; "
                         "uncompact_() it before sharding, and compact_ the shards after")
    dev = module.qweight.device.type
    if dev != device_mesh.device_type:
        raise ValueError(f"{module}: weights on {dev} but the DeviceMesh is on {device_mesh.device_type}")
    return device_mesh.get_local_rank(), device_mesh.size()


def _broadcast_from(module: QuantLinear, device_mesh: DeviceMesh, src: int) -> QuantLinear:
    """A copy of ``module`` holding rank ``src``'s tensors (``module`` itself is not modified)."""
    group = device_mesh.get_group()
    full = QuantLinear.from_quantized(module.quantized_weight(), None if module.bias is None else module.bias.detach(),
                                      act_mode=module.act_mode, act_block=module.act_block)
    for name in ("qweight", "scales", "zeros", "offsets", "input_perm"):
        t = getattr(module, name, None)
        if t is None:
            continue
        t = t.clone()
        if t.numel():
            dist.broadcast(t, group=group, group_src=src)
        if name in full._buffers:
            setattr(full, name, t)
        else:
            full.register_buffer(name, t)
    if full.bias is not None:
        dist.broadcast(full.bias.data, group=group, group_src=src)
    return full.train(module.training)


def _adopt(module: QuantLinear, shard: QuantLinear) -> None:
    """Make ``module`` the shard in place (parallelize_module keeps the module objects it is given)."""
    module.in_features, module.out_features = shard.in_features, shard.out_features
    module.config = shard.config  # (a row split that re-grouped the weight: the shard's group size)
    for name, buf in shard._buffers.items():
        module._buffers[name] = buf
    if shard.bias is not None:
        module.bias = shard.bias


def _shard_in_place(module: QuantLinear, device_mesh: DeviceMesh, dim: int, src_data_rank: int | None,
                    parts: int = 1, uneven: bool = False) -> None:
    if getattr(module, "_distribute_module_applied", False):
        raise RuntimeError(f"{module} is already sharded: a module is parallelized once")
    if module.auto_compact:
        module._restore_plain()  # sharding cuts the plain codes; the shard keeps one layout again below
    rank, world = _check_mesh(device_mesh, module)
    full = module if src_data_rank is None or world == 1 else _broadcast_from(module, device_mesh, src_data_rank)
    _adopt(module, shard_quant_linear(full, dim, rank, world, parts=parts, uneven=uneven))
    module._distribute_module_applied = True  # torch's flag: distribute_module refuses a second pass too
    module._auto_compact()


def _local_input(input_layouts, desired_layouts, device_mesh, module, inputs):
    x = inputs[0]
    if not isinstance(x, DTensor):
        if input_layouts == desired_layouts:
            return inputs
        x = DTensor.from_local(x, device_mesh, input_layouts, run_check=False)
    if x.placements != desired_layouts:
        x = x.redistribute(device_mesh, desired_layouts)
    return (x.to_local(), *inputs[1:])


def _output(local_layouts, output_layouts, use_local_output, device_mesh, module, inputs, out):
    if use_local_output and local_layouts == output_layouts:
        return out
    y = DTensor.from_local(out, device_mesh, local_layouts, run_check=False)
    if y.placements != output_layouts:
        y = y.redistribute(device_mesh, output_layouts)
    return y.to_local() if use_local_output else y


@dataclass(frozen=True)
class _Placement:
    """How a plain-tensor shard (ColwiseQuantLinear / RowwiseQuantLinear) meets the other ranks."""

    group: object  # the mesh's ProcessGroup
    world: int
    mesh: DeviceMesh
    needed: tuple  # the input layout the shard reads (a DTensor input is redistributed to it)
    gather: bool = False  # column parallel: the output shards gathered (output_layouts Replicate)
    columns: int = 0  # gathered: the layer's N (an uneven split's padding rows past it are dropped)
    one_shot: object = None  # row parallel: the group's one-shot sum (collectives.one_shot_sums), None for NCCL


def _plain_input(module, x):
    """A DTensor input as the local tensor of the layout the shard needs (a plain tensor is taken as it is)."""
    p = module.__dict__["_tp"]
    if x.placements != p.needed:
        x = x.redistribute(p.mesh, p.needed)
    return x.to_local()


class ColwiseQuantLinear(QuantLinear):
    """A column-parallel QuantLinear shard on plain tensors (what ColwiseParallel makes of a QuantLinear with its
    default layouts, or with a gathered output): the replicated input in, this rank's output columns out, or every
    rank's joined (``gather``). No hook, no DTensor: a decode step's host work is one GPU's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, DTensor):
            x = _plain_input(self, x)
        y = super().forward(x)
        p = self.__dict__["_tp"]
        if not p.gather:
            return y
        y = gather_columns(y, p.group, p.world)
        return y if y.shape[-1] == p.columns else y[..., :p.columns]


class RowwiseQuantLinear(QuantLinear):
    """A row-parallel QuantLinear shard on plain tensors (RowwiseParallel's default layouts): this rank's slice of
    the input features in, the partial outputs summed over the ranks (one all-reduce; rank 0 holds the bias)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, DTensor):
            x = _plain_input(self, x)
        p = self.__dict__["_tp"]
        return sum_over_ranks(super().forward(x), p.group, p.one_shot)


def gathers_output(style) -> bool:
    """Whether ``style`` makes a QuantLinear a column-parallel shard whose output is gathered (lm_head's
    "colwise_gather_output"): a split that may be uneven (mixgemm.distributed.shard)."""
    return (isinstance(style, ColwiseParallel) and not isinstance(style, PackedColwiseParallel)
            and _plain_class(style, COLWISE, (Replicate(),)) is ColwiseQuantLinear
            and tuple(style.output_layouts) == (Replicate(),))


def _plain_class(style, dim: int, needed: tuple) -> type | None:
    """The plain-tensor shard class for ``style``'s layouts, or None when they need DTensor's redistribution."""
    if not style.use_local_output or tuple(style.input_layouts) != needed:
        return None
    out = tuple(style.output_layouts)
    if dim == COLWISE and out in ((Shard(-1),), (Replicate(),)):
        return ColwiseQuantLinear
    if dim == ROWWISE and out == (Replicate(),):
        return RowwiseQuantLinear
    return None


def _apply_quant(style, module: QuantLinear, device_mesh: DeviceMesh, dim: int, parts: int = 1) -> QuantLinear:
    gather = dim == COLWISE and gathers_output(style)
    columns = module.out_features
    _shard_in_place(module, device_mesh, dim, style.src_data_rank, parts, uneven=gather)
    needed, local_out = ((Replicate(),), (Shard(-1),)) if dim == COLWISE else ((Shard(-1),), (Partial(),))
    plain = _plain_class(style, dim, needed)
    if plain is not None:
        group = device_mesh.get_group()
        one_shot = (one_shot_sums(group, module.scales.device) if plain is RowwiseQuantLinear and one_shot_enabled()
                    else None)
        module.__dict__["_tp"] = _Placement(group, device_mesh.size(), device_mesh, needed, gather, columns, one_shot)
        module.__class__ = plain
        return module
    module.register_forward_pre_hook(partial(_local_input, style.input_layouts, needed, device_mesh))
    module.register_forward_hook(partial(_output, local_out, style.output_layouts, style.use_local_output,
                                         device_mesh))
    return module


def _apply_experts(style, experts: ExpertList, device_mesh: DeviceMesh, dim: int, parts: int = 1) -> ExpertList:
    """Every expert's layer of a quantized experts projection sharded in place, with no hooks: each expert's input is
    the replicated hidden state (column split) or its own column shard's output (row split), and the experts
    module's style (ExpertsParallel) sums the module's output over the ranks once."""
    for layer in experts:
        _shard_in_place(layer, device_mesh, dim, style.src_data_rank, parts)
    return experts


class ColwiseParallel(_TorchColwise):
    """torch's ColwiseParallel (same options: input_layouts default Replicate, output_layouts default Shard(-1),
    use_local_output default True) that also shards QuantLinear: each rank keeps N / world output rows. On a
    quantized experts projection (mixgemm.nn.experts.ExpertList) it splits every expert's layer (ExpertsParallel)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if isinstance(module, ExpertList):
            return _apply_experts(self, module, device_mesh, COLWISE)
        if isinstance(module, QuantLinear):
            return _apply_quant(self, module, device_mesh, COLWISE)
        if isinstance(module, nn.Linear):
            _LINEAR_STYLES[module] = (self, device_mesh)
        return super()._apply(module, device_mesh)


class RowwiseParallel(_TorchRowwise):
    """torch's RowwiseParallel (same options: input_layouts default Shard(-1), output_layouts default Replicate,
    use_local_output default True) that also shards QuantLinear: each rank keeps K / world input features (whole
    groups), the partial outputs are summed by torch.distributed, the bias is added once."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if isinstance(module, ExpertList):
            return _apply_experts(self, module, device_mesh, ROWWISE)
        if isinstance(module, QuantLinear):
            return _apply_quant(self, module, device_mesh, ROWWISE)
        if isinstance(module, nn.Linear):
            _LINEAR_STYLES[module] = (self, device_mesh)
        return super()._apply(module, device_mesh)


class PackedColwiseParallel(ColwiseParallel):
    """transformers' "packed_colwise" for QuantLinear and quantized experts projections: a column split of a layer
    whose rows are two packed blocks (gate; up), each split alike, so each rank keeps [gate_r; up_r] and the model's
    cut of the output in two halves still pairs them (mixgemm.distributed.shard). Its output stays local (Shard(-1)
    gathered would interleave the blocks): the options are ColwiseParallel's defaults."""

    def __init__(self):
        super().__init__()

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if isinstance(module, ExpertList):
            return _apply_experts(self, module, device_mesh, COLWISE, parts=2)
        if isinstance(module, QuantLinear):
            return _apply_quant(self, module, device_mesh, COLWISE, parts=2)
        raise ValueError(f"packed_colwise shards QuantLinear layers and quantized experts projections, not a "
                         f"{type(module).__name__}: quantize it first")


class ExpertsParallel(ParallelStyle):
    """transformers' "moe_tp_experts" for a quantized experts module (mixgemm.nn.experts.QuantizedExperts) whose
    projections the plan splits (gate / up packed column-parallel, down row-parallel): every rank computes its slice
    of every expert's intermediate features, routed exactly as unsharded, and its down projections' partial output;
    this style sums the module's output over the ranks (an all-reduce through DTensor, as RowwiseParallel's)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _summed_over_ranks(quantized_experts(module, "moe_tp_experts"), device_mesh)
        return module


def quantized_experts(module: nn.Module, style: str) -> QuantizedExperts:
    """``module``, which the experts styles (named by ``style``) take only as a quantized experts module."""
    if not isinstance(module, QuantizedExperts):
        raise ValueError(f"{style}: mixgemm.distributed parallelizes quantized experts modules, not a "
                         f"{type(module).__name__} (quantize its experts first)")
    return module


def _summed_over_ranks(module: nn.Module, device_mesh: DeviceMesh) -> None:
    """The module's output is each rank's partial sum: summed over the ranks (one all-reduce on the plain tensor, as
    RowwiseQuantLinear's)."""
    group = device_mesh.get_group()
    device = next(t.device for t in (*module.buffers(), *module.parameters()))
    one_shot = one_shot_sums(group, device) if one_shot_enabled() else None
    module.register_forward_hook(partial(_sum_hook, group, one_shot))


def _sum_hook(group, one_shot, module, inputs, out):
    return sum_over_ranks(out, group, one_shot)


class LocalExpertsParallel(ParallelStyle):
    """transformers' "grouped_gemm" of an expert-parallel plan, for a quantized experts projection
    (mixgemm.nn.experts.ExpertList): rank r keeps experts [r E / world, (r + 1) E / world), numbered from 0, each
    whole (rank ``src_data_rank``'s weights, broadcast, unless None); the experts module's ExpertDispatchParallel
    maps the router's ids to them."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, ExpertList):
            raise ValueError(f"grouped_gemm: mixgemm.distributed keeps the local experts of quantized experts "
                             f"projections, not of a {type(module).__name__} (quantize its experts first)")
        rank, world = device_mesh.get_local_rank(), device_mesh.size()
        local = len(module) // world
        if self.src_data_rank is not None and world > 1:
            for e, layer in enumerate(module):  # (every rank takes part in every expert's broadcast)
                layout = layer.compact
                layer._restore_plain()  # (the broadcast sends plain codes)
                full = _broadcast_from(layer, device_mesh, self.src_data_rank)
                if e // local == rank:
                    layer._weight_changes()
                    _adopt(layer, full)
                    if layout is not None:
                        layer.compact_(layout)
        module.keep_only(rank * local, (rank + 1) * local)
        module.stack().join()  # (now, where the experts keep one layout: not in a later CUDA-graph pool)
        return module


def _local_expert_ids(start: int, local: int, module, args, kwargs):
    """The router's expert ids as this rank's: ``local`` (no local expert, whose slots add nothing) outside
    [start, start + local)."""
    def mine(ids):
        ids = ids - start
        return torch.where((ids >= 0) & (ids < local), ids, local)

    if len(args) >= 2:
        return (args[0], mine(args[1]), *args[2:]), kwargs
    return args, {**kwargs, "top_k_index": mine(kwargs["top_k_index"])}


class ExpertDispatchParallel(ParallelStyle):
    """transformers' "ep_dispatch_experts" for a quantized experts module, every rank holding the same batch (the
    all-reduce form of expert parallelism): each rank runs the slots routed to its experts (LocalExpertsParallel),
    the others' ids become its "no local expert" id, whose slots add nothing (the routed GEMV writes zeros, the sorted
    path skips them), and the module's output is summed over the ranks."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        quantized_experts(module, "ep_dispatch_experts")
        rank, world = device_mesh.get_local_rank(), device_mesh.size()
        local = module.num_experts // world
        module.num_experts = local
        module.register_forward_pre_hook(partial(_local_expert_ids, rank * local, local), with_kwargs=True)
        _summed_over_ranks(module, device_mesh)
        return module


def sharded_linear_source(linear: nn.Linear, name: str = "linear"):
    """For an nn.Linear that a mixgemm style sharded (its weight a DTensor): (a plain nn.Linear holding the full
    weight and bias, a function that shards a QuantLinear made from it the same way, in place). quantize_ uses it
    to quantize after sharding exactly as before. Raises ValueError for a Linear sharded some other way."""
    entry = _LINEAR_STYLES.get(linear)
    if entry is None:
        raise ValueError(f"{name}: its weight is a DTensor, sharded by something other than mixgemm.distributed's "
                         "styles; quantize before sharding, or shard with mixgemm.distributed (tensor_parallel_ or "
                         "its ColwiseParallel / RowwiseParallel)")
    style, mesh = entry

    def full(t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    plain = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
    plain.weight = nn.Parameter(full(linear.weight.detach()), requires_grad=False)
    if linear.bias is not None:
        plain.bias = nn.Parameter(full(linear.bias.detach()), requires_grad=False)
    plain.train(linear.training)

    def shard_like(q: QuantLinear) -> QuantLinear:
        local = type(style)(input_layouts=style.input_layouts[0], output_layouts=style.output_layouts[0],
                            use_local_output=style.use_local_output)
        local.src_data_rank = None  # the full weight was gathered from the shards: the same on every rank
        return local._apply(q, mesh)

    return plain, shard_like


__all__ = ["ColwiseParallel", "ColwiseQuantLinear", "ExpertDispatchParallel", "ExpertsParallel", "LocalExpertsParallel",
           "PackedColwiseParallel", "RowwiseParallel", "RowwiseQuantLinear", "gathers_output", "quantized_experts",
           "sharded_linear_source"]
