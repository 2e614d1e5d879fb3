"""``tensor_parallel_(model, device_mesh)``: shard a Hugging Face model along its own tensor-parallel plan.

The plan is the model's: ``config.base_model_tp_plan`` (keys relative to the base model, e.g.
``"layers.*.self_attn.q_proj": "colwise"``) plus the head's class-level ``_tp_plan`` (e.g. ``lm_head``), or one
passed in. Its string styles map to mixgemm's ColwiseParallel / RowwiseParallel (mixgemm.distributed.styles), which
shard QuantLinear layers and hand float nn.Linear / nn.Embedding layers to torch's own styles; the plan is applied
with torch's ``parallelize_module``. Every split is checked, for every rank alike, before anything is sharded.
Mixture-of-experts plans (Mixtral, Qwen2 / Qwen3 MoE, DeepSeek, OLMoE) split every quantized expert's intermediate
features: "packed_colwise" on the gate / up projections (PackedColwiseParallel), "rowwise" on down, and
"moe_tp_experts" (ExpertsParallel) sums the experts module's output over the ranks. ``model_ep_plan`` gives the
expert-parallel form instead (the config's ``base_model_ep_plan``: "grouped_gemm", each rank keeping whole experts,
and "ep_dispatch_experts", the all-reduce form: every rank holds the batch and runs the slots of its experts; older
transformers' "ep_router" + "moe_tp_experts" form of it is read as this one, ``ep_dispatch_form``). Styles
that keep a module whole at inference ("replicated_with_grad_allreduce": Qwen3's and Gemma 3's q / k norms;
"mla_kv_a_proj": the joint kv projection of MLA attention, DeepSeek-V2's and its kin's) leave it replicated;
"local_params" (Granite-SWA, Hunyuan-V4, MiMo-V2-Flash attention) has nothing to do here. A plan entry naming a bare
parameter (their attention "sinks": "colwise") keeps this rank's slice of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatch

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from mixgemm.distributed.agree import agree_on_every_rank
from mixgemm.distributed.shard import COLWISE, ROWWISE, check_split
from mixgemm.distributed.styles import (
    ColwiseParallel,
    ExpertDispatchParallel,
    ExpertsParallel,
    LocalExpertsParallel,
    PackedColwiseParallel,
    RowwiseParallel,
    gathers_output,
    quantized_experts,
)
from mixgemm.nn.experts import ExpertList
from mixgemm.nn.linear import QuantLinear

# transformers' style names (transformers.distributed.tensor_parallel) that this module implements
_STYLES = {
    "colwise": lambda: ColwiseParallel(),
    "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
    "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
    "rowwise": lambda: RowwiseParallel(),
    "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
    "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate()),
    "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
    "packed_colwise": lambda: PackedColwiseParallel(),
    "moe_tp_experts": lambda: ExpertsParallel(),
    "grouped_gemm": lambda: LocalExpertsParallel(),
    "ep_dispatch_experts": lambda: ExpertDispatchParallel(),
}
# styles that leave the module whole on every rank at inference (they all-reduce gradients in training): skipped,
# with this reason
_REPLICATED = {"replicated_with_grad_allreduce": "replicated on every rank (its style only all-reduces gradients)",
               # MLA's kv_a_proj_with_mqa (DeepSeek-V2 and kin): its output feeds the column-parallel kv_b_proj and
               # the rope keys every rank uses whole; the style only all-reduces the rope part's gradient
               "mla_kv_a_proj": "replicated on every rank (its style only all-reduces the rope keys' gradient)"}
# styles with nothing to do here, with the reason: transformers' "local_params" runs a module's forward with its own
# sharded parameters (DTensors there) as local tensors, which mixgemm's shards already are (the parameters themselves
# are split by their own plan entries, e.g. Granite-SWA's attention "sinks")
_NOTHING_TO_DO = {"local_params": "its parameters are plain local tensors here; their own plan entries split them"}
_LEFT_AS_IS = _REPLICATED | _NOTHING_TO_DO  # the styles tensor_parallel_ skips, with the reason it reports
# a bare nn.Parameter's plan entry (not a module's): the dimension each style splits, as transformers' shard_param
# (colwise: dim ndim - 2, the output features of a weight, dim 0 of a vector; rowwise: the last)
_PARAM_DIMS = {"colwise": lambda ndim: max(ndim - 2, 0), "rowwise": lambda ndim: ndim - 1}


@dataclass
class TensorParallelReport:
    """What tensor_parallel_ did: ``sharded`` {module name: style}, ``skipped`` {module name: why}."""

    world_size: int
    sharded: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"tensor_parallel_ over {self.world_size} ranks: {len(self.sharded)} modules / parameters sharded, "
                 f"{len(self.skipped)} left as they are"]
        lines += [f"  {name}: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


def model_tp_plan(model: nn.Module) -> dict[str, str | ParallelStyle]:
    """The model's own plan with keys relative to ``model``: its config's ``base_model_tp_plan`` (prefixed with the
    base model's attribute name when ``model`` wraps it, as LlamaForCausalLM wraps ``model``) and the class-level
    ``_tp_plan`` of the head (e.g. {"lm_head": "colwise_gather_output"})."""
    prefix = getattr(model, "base_model_prefix", "")
    head = dict(getattr(type(model), "_tp_plan", None) or {})
    head = {k: v for k, v in head.items() if not (prefix and k.startswith(prefix + "."))}
    return {**_base_model_plan(model, "base_model_tp_plan"), **head}


def model_ep_plan(model: nn.Module) -> dict[str, str | ParallelStyle]:
    """The model's expert-parallel plan: its tensor-parallel plan (model_tp_plan) with the experts' entries of its
    config's ``base_model_ep_plan`` in their place ("grouped_gemm" on the experts projections: each rank keeps whole
    experts; "ep_dispatch_experts" on the experts module). Pass it to tensor_parallel_."""
    ep = _base_model_plan(model, "base_model_ep_plan")
    if not ep:
        raise ValueError(f"{type(model).__name__} has no expert-parallel plan (config.base_model_ep_plan)")
    return {**model_tp_plan(model), **ep_dispatch_form(ep)}


def ep_dispatch_form(ep_plan: dict) -> dict:
    """An expert-parallel plan in the form this module applies. Older transformers (5.17) wrote the all-reduce form
    as "ep_router" on the router (its ids masked to the rank's experts) plus "moe_tp_experts" on the experts module
    (the ranks' outputs summed); later ones (5.24) as "ep_dispatch_experts" on the experts module, which does both. The
    older form becomes the newer: the router entries go (the router stays replicated; the experts module maps its
    ids), the experts modules' "moe_tp_experts" becomes "ep_dispatch_experts". A plan without "ep_router" is
    returned as it is."""
    if "ep_router" not in ep_plan.values():
        return dict(ep_plan)
    return {k: "ep_dispatch_experts" if v == "moe_tp_experts" else v for k, v in ep_plan.items() if v != "ep_router"}


def _base_model_plan(model: nn.Module, attr: str) -> dict[str, str]:
    """The config's plan ``attr`` with keys relative to ``model`` (prefixed with the base model's attribute name when
    ``model`` wraps it)."""
    plan = dict(getattr(getattr(model, "config", None), attr, None) or {})
    prefix = getattr(model, "base_model_prefix", "")
    if prefix and isinstance(getattr(model, prefix, None), nn.Module):
        plan = {f"{prefix}.{k}": v for k, v in plan.items()}
    return plan


def _matches(pattern: str, name: str) -> bool:
    """parallelize_module's matching: dotted tokens, each an fnmatch pattern."""
    p, n = pattern.split("."), name.split(".")
    return len(p) == len(n) and all(fnmatch(a, b) for a, b in zip(n, p, strict=True))


def _style_of(value, name: str) -> ParallelStyle:
    if isinstance(value, ParallelStyle):
        return value
    if value not in _STYLES:
        raise ValueError(f"{name}: tensor-parallel style {value!r} is not supported by mixgemm.distributed "
                         f"(supported: {sorted(_STYLES)}); pass a plan without it, or a ParallelStyle object")
    return _STYLES[value]()


def _check_heads(config, world: int) -> None:
    for attr in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, attr, None)
        if isinstance(heads, int) and heads % world:
            raise ValueError(f"{attr}={heads} is not divisible by the tensor-parallel size {world}: attention heads "
                             "are split whole across ranks")


def _tied(model: nn.Module) -> set[int]:
    counts: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    return {i for i, c in counts.items() if c > 1}


def _check_module(name: str, module: nn.Module, style: ParallelStyle, world: int, given: bool) -> None:
    """The split ``style`` makes of ``module`` is exact (QuantLinear: check_split; float Linear / Embedding: the split
    dimension divides by ``world``). ``given``: the plan held the style object itself (any module is then left to
    it), not a style name."""
    ours = isinstance(style, ColwiseParallel | RowwiseParallel)
    dim = COLWISE if isinstance(style, ColwiseParallel) else ROWWISE
    parts = 2 if isinstance(style, PackedColwiseParallel) else 1
    if isinstance(style, ExpertsParallel | ExpertDispatchParallel):
        quantized_experts(module, f"{name}: {type(style).__name__}")
        if isinstance(style, ExpertDispatchParallel) and module.num_experts % world:
            raise ValueError(f"{name}: expert parallelism over {world} ranks: num_experts={module.num_experts} is not "
                             f"divisible by {world}")
        return  # (the projections are checked as ExpertLists)
    if isinstance(style, LocalExpertsParallel):
        if not isinstance(module, ExpertList) or len(module) % world:
            raise ValueError(f"{name}: grouped_gemm over {world} ranks keeps whole quantized experts: it takes a "
                             f"quantized experts projection whose expert count divides by {world}, not "
                             f"{type(module).__name__} of {len(module)}")
        return
    if isinstance(module, ExpertList) and ours:
        layer = module[0]  # (the experts of a projection share one shape and format)
        check_split((layer.out_features, layer.in_features), layer.config, dim, world, f"{name}.<expert>", parts,
                    regroup=layer.act_mode is None)
    elif isinstance(module, QuantLinear):
        if not ours:
            raise ValueError(f"{name}: {type(style).__name__} ({type(style).__module__}) cannot shard a QuantLinear; "
                             "use mixgemm.distributed.ColwiseParallel / RowwiseParallel (torch's options)")
        check_split((module.out_features, module.in_features), module.config, dim, world, name, parts,
                    uneven=gathers_output(style), regroup=module.act_mode is None)
    elif parts != 1:
        raise ValueError(f"{name}: packed_colwise shards QuantLinear layers and quantized experts projections, not a "
                         f"{type(module).__name__} (quantize it first)")
    elif ours and isinstance(module, nn.Linear | nn.Embedding):
        colwise = isinstance(style, ColwiseParallel)
        if isinstance(module, nn.Linear):
            size = module.out_features if colwise else module.in_features
        else:
            size = module.embedding_dim if colwise else module.num_embeddings
        if size % world:
            raise ValueError(f"{name}: {type(style).__name__} over {world} ranks: the split dimension ({size}) of "
                             f"{type(module).__name__} is not divisible by {world}")
    elif not given:
        raise ValueError(f"{name}: {type(style).__name__} cannot shard a {type(module).__name__} (it shards "
                         "QuantLinear, nn.Linear and nn.Embedding)")


def tensor_parallel_(model: nn.Module, device_mesh: DeviceMesh | None = None, plan: dict | None = None, *,
                     src_data_rank: int | None = 0) -> TensorParallelReport:
    """Shard ``model`` in place over the 1-D ``device_mesh`` (default: every rank of the default process group, on
    the model's device type) along ``plan`` (default: the model's own, ``model_tp_plan``; values are transformers'
    style names or ParallelStyle objects). Quantize before (QuantLinear layers are sliced) or after (quantize_
    quantizes a sharded nn.Linear's full weight, then shards it the same way).

    Checked first, and agreed on by every rank before any weight moves, so that a bad split is one error on every
    rank, never a rank waiting in a collective: torch.distributed initialized (RuntimeError), attention head counts
    divisible by the mesh size, every split exact (mixgemm.distributed.shard.check_split), every style supported,
    every rank holding the same model (the same parameter and buffer names, shapes and dtypes; with
    ``src_data_rank=None`` the same values too) -- ValueError naming the module, the sizes or the ranks. Modules
    whose parameters are tied to another module stay replicated (listed in the report's ``skipped``).
    ``src_data_rank``: as parallelize_module's (rank 0's weights are broadcast; None: each rank uses its own).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("tensor_parallel_: torch.distributed is not initialized: call "
                           "torch.distributed.init_process_group() on every rank first (torchrun sets the environment "
                           "it reads; backend nccl on GPUs, gloo on the CPU)")
    if device_mesh is None:
        from torch.distributed.device_mesh import init_device_mesh

        device = next(iter(model.parameters()), None)
        device_mesh = init_device_mesh("cpu" if device is None else device.device.type, (dist.get_world_size(),))
    if not isinstance(device_mesh, DeviceMesh) or device_mesh.ndim != 1:
        raise ValueError(f"device_mesh must be a 1-D torch DeviceMesh, got {device_mesh!r}")
    world = device_mesh.size()
    try:
        report, resolved, params = _resolve(model, plan, world)
        verdict = None
    except (ValueError, TypeError) as e:
        verdict = (type(e), str(e))
    agree_on_every_rank(model, device_mesh, verdict, values=src_data_rank is None)
    parallelize_module(model, device_mesh, resolved, src_data_rank=src_data_rank)
    for name, (style, dim) in params.items():
        _shard_parameter(model, name, dim, device_mesh, src_data_rank)
        report.sharded[name] = style
    return report


def _resolve(model: nn.Module, plan: dict | None, world: int):
    """(the report so far, {module name: style} to parallelize, {parameter name: (style, dim)}): the plan matched to
    ``model``'s modules and parameters, every split checked (ValueError naming the module and sizes)."""
    plan = model_tp_plan(model) if plan is None else ep_dispatch_form(plan)
    if not plan:
        raise ValueError(f"{type(model).__name__} has no tensor-parallel plan (config.base_model_tp_plan); pass one")
    _check_heads(getattr(model, "config", None), world)
    report = TensorParallelReport(world_size=world)
    tied = _tied(model)
    resolved: dict[str, ParallelStyle] = {}
    for name, module in model.named_modules():
        keys = [k for k in plan if _matches(k, name)]
        if not keys:
            continue
        key = keys[-1]  # later entries override earlier ones (the head's after the base model's)
        if plan[key] in _LEFT_AS_IS:
            report.skipped[name] = f"{plan[key]}: {_LEFT_AS_IS[plan[key]]}"
            continue
        style = _style_of(plan[key], name)
        if any(id(p) in tied for p in module.parameters(recurse=False)):
            report.skipped[name] = f"{plan[key]}: its parameters are tied to another module"
            continue
        _check_module(name, module, style, world, given=isinstance(plan[key], ParallelStyle))
        resolved[name] = style
        report.sharded[name] = plan[key] if isinstance(plan[key], str) else repr(plan[key])
    return report, resolved, _plan_parameters(model, plan, world, tied)


def _plan_parameters(model: nn.Module, plan: dict, world: int, tied: set[int]) -> dict[str, tuple[str, int]]:
    """{parameter name: (style, dimension)} of the plan entries that name a bare parameter (one no module entry
    covers, as Granite-SWA's "layers.*.self_attn.sinks": "colwise"), each split checked: the style one of
    _PARAM_DIMS, the dimension divisible by ``world``, the parameter not tied to another module's."""
    out = {}
    for name, p in model.named_parameters():
        keys = [k for k in plan if _matches(k, name)]
        if not keys:
            continue
        style = plan[keys[-1]]
        if style not in _PARAM_DIMS:
            raise ValueError(f"{name}: a bare parameter's tensor-parallel style {style!r} is not supported by "
                             f"mixgemm.distributed (supported for parameters: {sorted(_PARAM_DIMS)})")
        if id(p) in tied:
            raise ValueError(f"{name}: {style} of a parameter tied to another module")
        dim = _PARAM_DIMS[style](p.ndim)
        if p.ndim == 0 or p.shape[dim] % world:
            raise ValueError(f"{name}: {style} over {world} ranks splits dimension {dim} of shape {tuple(p.shape)}, "
                             f"not divisible by {world}")
        out[name] = (style, dim)
    return out


def _shard_parameter(model: nn.Module, name: str, dim: int, mesh: DeviceMesh, src_data_rank: int | None) -> None:
    """Replace the parameter ``name`` by this rank's slice along ``dim`` (a plain local tensor, as mixgemm's other
    shards), rank ``src_data_rank``'s values first broadcast (as parallelize_module does; None: each rank's own)."""
    import torch.distributed as dist

    owner, _, attr = name.rpartition(".")
    module = model.get_submodule(owner)
    p = module._parameters[attr]
    full = p.detach().clone()
    if src_data_rank is not None:
        dist.broadcast(full, group_src=src_data_rank, group=mesh.get_group())
    local = full.chunk(mesh.size(), dim)[mesh.get_local_rank()].contiguous()
    module._parameters[attr] = nn.Parameter(local, requires_grad=p.requires_grad)


__all__ = ["TensorParallelReport", "ep_dispatch_form", "model_ep_plan", "model_tp_plan", "tensor_parallel_"]
