"""Mixture-of-experts layers with quantized experts: transformers 5's fused experts modules (Mixtral, Qwen2 / Qwen3
MoE, DeepSeek V2 / V3, OLMoE, GPT-OSS, ...) hold every expert's weights in two 3-D parameters, which are not
Linears, so quantizing a model's Linears leaves the experts -- most of an MoE model's bytes -- in float.

A fused experts module is one built with transformers' ``use_experts_implementation``: it has ``num_experts``, the
flags ``has_gate`` / ``has_bias`` / ``is_transposed`` / ``has_post_expert_norm``, 3-D ``gate_up_proj`` (``up_proj``
without a gate) ``[E, out, in]`` (``[E, in, out]`` when transposed) and ``down_proj``, optional ``*_bias`` ``[E,
out]``, and ``forward(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H]``.

``quantize_experts_`` turns one into its quantized twin in place: each 3-D parameter becomes a ModuleList of one
QuantLinear per expert under the same name (``experts.gate_up_proj.3`` is expert 3's gate / up projection, its
rows in the module's own order, so the module's ``_apply_gate`` reads them as before), and the module's class
becomes a subclass of its own (``QuantizedExperts`` first) whose forward runs each expert's tokens through those
layers -- the kernels, call plans and resident layout of every other QuantLinear, one expert at a time. Everything
else of the module (act_fn, _apply_gate, a post-expert norm, GPT-OSS's clamp) stays the module's own. The state
dict keeps the names (``<experts>.gate_up_proj.<e>.qweight`` ...), so save_pretrained / from_pretrained treat each
expert's projection as a quantized layer of its own (``prepare_skeleton`` gives a model being loaded the same
structure before its layers are filled).

Calls in fp16 / bf16 on an sm_90 GPU, where each projection's experts keep one wgmma_v1 layout, run each projection
as one launch over every (token, expert) slot with the routing read on the GPU, over the experts' layouts joined in
one buffer (mixgemm.nn.expert_stack): decoding and a few slots per expert through the routed GEMV
(mixgemm.kernels.cuda.routed_gemv), prefill through the grouped tensor-core GEMM (mixgemm.kernels.cuda.grouped_gemm),
the slots sorted by expert; ``path`` chooses. Elsewhere (the CPU, other GPUs, fp32, autograd, int8-activation or
act-order experts) the (token, expert) pairs are sorted by expert and each expert's tokens run through its layers;
that reads the routing on the host once per layer (transformers' own eager experts do the same).

Under torch.compile (no gradient recorded) the whole experts call is one opaque op, ``torch.ops.mixgemm.experts``,
whose kernel is the eager forward above: a decoding step compiles to one graph (fullgraph=True) and, routed, captures
in CUDA graphs (mode "reduce-overhead"), where a graph break would otherwise split every MoE layer. The op finds its
module through an integer key (``_KEY_ATTR``, registered weakly in ``_BY_KEY``): ops take tensors and scalars, not
modules, and the module's tensors (2 x E layers a module) are too many to pass -- dynamo guards each tensor an op is
handed on every call. A copy (deepcopy, pickle) gets a key of its own.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from mixgemm.nn.expert_stack import ExpertStack
from mixgemm.nn.linear import SIBLINGS_ATTR
from mixgemm.ops.custom_ops import define_op, register_fake_ops

# the 3-D parameters of a fused experts module, by whether it gates: (first projection, second projection)
_PROJ = {True: ("gate_up_proj", "down_proj"), False: ("up_proj", "down_proj")}
_FLAGS = ("num_experts", "has_gate", "has_bias", "is_transposed")


@dataclass(frozen=True)
class ExpertsShape:
    """One fused experts module: its projections' names and each expert's (out, in) per projection."""

    num_experts: int
    names: tuple[str, str]
    shapes: tuple[tuple[int, int], tuple[int, int]]  # [out_features, in_features] of one expert's projection
    has_bias: bool
    transposed: bool


def holds_fused_experts(module: nn.Module) -> bool:
    """True for a module holding experts as 3-D float parameters (a fused experts module, known or not)."""
    down = module._parameters.get("down_proj")
    return isinstance(down, torch.Tensor) and down.dim() == 3


def experts_shape(module: nn.Module) -> ExpertsShape | str:
    """The ExpertsShape of a fused experts module with transformers' experts interface, else why it is not one."""
    missing = [a for a in _FLAGS if not hasattr(module, a)]
    if missing:
        return (f"{type(module).__name__} holds 3-D expert weights without transformers' experts interface "
                f"(no {missing}): mixgemm does not know how it applies them")
    names = _PROJ[bool(module.has_gate)]
    params = [module._parameters.get(n) for n in names]
    if any(not isinstance(p, torch.Tensor) or p.dim() != 3 for p in params):
        return f"{type(module).__name__} has no 3-D {names[0]} / {names[1]} parameters"
    e = int(module.num_experts)
    if any(p.shape[0] != e for p in params):
        return f"{type(module).__name__}: num_experts {e}, but {names} hold {[p.shape[0] for p in params]} experts"
    transposed = bool(module.is_transposed)
    shapes = tuple((int(p.shape[1]), int(p.shape[2])) if not transposed else (int(p.shape[2]), int(p.shape[1]))
                   for p in params)
    return ExpertsShape(e, names, shapes, bool(module.has_bias), transposed)


def why_not_experts(module: nn.Module, shape: ExpertsShape, check_weight) -> str | None:
    """Why quantize_ cannot quantize this experts module, or None. ``check_weight(weight, in_features)`` is
    quantize_'s per-layer check of a float weight (dtype, device, group size against K)."""
    if getattr(module, "_is_expert_parallel", False):
        return "the experts are sharded for expert parallelism; quantize before sharding"
    for name, (_, k) in zip(shape.names, shape.shapes, strict=True):
        why = check_weight(module._parameters[name], k)
        if why is not None:
            return f"{name}: {why}"
    return None


def expert_weight(param: torch.Tensor, e: int, transposed: bool) -> torch.Tensor:
    """Expert e's weight of a 3-D parameter as a Linear's [out, in] (a view; transposed layouts are [E, in, out])."""
    w = param.detach()[e]
    return w.t() if transposed else w


def quantized_experts_class(cls: type) -> type:
    """The class a quantized ``cls`` module takes: QuantizedExperts before ``cls`` (one per class, kept)."""
    if issubclass(cls, QuantizedExperts):
        return cls
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Quantized{cls.__name__}", (QuantizedExperts, cls),
                             {"__module__": cls.__module__, "__doc__": f"{cls.__name__} with quantized experts "
                              "(mixgemm.nn.experts)."})
    return _CLASSES[cls]


_CLASSES: dict[type, type] = {}


def quantize_experts_(module: nn.Module, shape: ExpertsShape, to_quant_linear) -> None:
    """Replace, in place, the module's 3-D projections (and their biases) by one QuantLinear per expert,
    ``to_quant_linear(weight [out, in], bias or None) -> QuantLinear`` (quantize_'s format), and give the module
    its quantized class. Expert by expert, so the float copy of one expert at a time is all that is added; the
    3-D parameters go at the end. ValueError from the quantizer leaves the module as it was."""
    lists = []
    for name in shape.names:
        param, bias = module._parameters[name], module._parameters.get(f"{name}_bias") if shape.has_bias else None
        lists.append(nn.ModuleList(
            to_quant_linear(expert_weight(param, e, shape.transposed).contiguous(),
                            None if bias is None else bias.detach()[e])
            for e in range(shape.num_experts)))
    _install(module, shape, lists)


class ExpertList(nn.ModuleList):
    """One projection's per-expert layers (a ModuleList: state-dict names ``<projection>.<e>``) and the ExpertStack
    its routed calls use (``stack()``), made on first use and dropped when an expert is replaced."""

    def __setattr__(self, name, value):
        if name in self._modules:  # (ModuleList.__setitem__ and a loader's setattr both come here)
            self.__dict__.pop("_stack", None)
        super().__setattr__(name, value)

    def __delitem__(self, idx):
        self.__dict__.pop("_stack", None)
        super().__delitem__(idx)

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_stack", None)  # (holds device buffers and prepared launches: a copy makes its own)
        return state

    def keep_only(self, start: int, stop: int) -> None:
        """Keep experts [start, stop), numbered from 0 (expert parallelism's local experts); the others are dropped,
        and so is the stack (the next ``stack()`` joins the kept ones)."""
        kept = [self._modules[str(e)] for e in range(start, stop)]
        for layer in self:
            if isinstance(layer.__dict__.get(SIBLINGS_ATTR), ExpertStack):
                del layer.__dict__[SIBLINGS_ATTR]  # (the old stack's join would hold the dropped experts too)
        self.__dict__.pop("_stack", None)
        self._modules.clear()
        for e, layer in enumerate(kept):
            self._modules[str(e)] = layer

    def stack(self) -> ExpertStack:
        st = self.__dict__.get("_stack")
        if st is None:
            st = self.__dict__["_stack"] = ExpertStack(list(self))
            st.attach()
        return st


def _install(module: nn.Module, shape: ExpertsShape, lists: list[nn.ModuleList]) -> None:
    for name, layers in zip(shape.names, lists, strict=True):
        del module._parameters[name]
        module._parameters.pop(f"{name}_bias", None)
        module.add_module(name, ExpertList(layers))
    module.__class__ = quantized_experts_class(type(module))
    _register(module)
    # transformers' weight initialisation of a model being loaded would write the float 3-D parameters this
    # module no longer has; its tensors are the per-expert layers', which initialise (and load) as layers
    module._is_hf_initialized = True


def prepare_skeleton(model: nn.Module, layer_names) -> list[str]:
    """Give the fused experts modules of ``model`` (a skeleton being loaded) whose per-expert layers
    ``layer_names`` lists (``<experts>.gate_up_proj.<e>``) the quantized structure, with meta nn.Linear
    placeholders that the loader then replaces by each expert's QuantLinear. Returns the modules prepared;
    ValueError when the list names only some of a module's experts."""
    listed: dict[str, set[str]] = {}
    for name in layer_names:
        parent, _, idx = name.rpartition(".")
        owner, _, proj = parent.rpartition(".")
        if idx.isdigit() and any(proj in names for names in _PROJ.values()):
            listed.setdefault(owner, set()).add(f"{proj}.{idx}")
    prepared = []
    for owner, have in listed.items():
        try:
            module = model.get_submodule(owner)
        except AttributeError:
            continue  # the loader names the layer the model lacks
        if not holds_fused_experts(module):
            continue
        shape = experts_shape(module)
        if isinstance(shape, str):
            raise ValueError(f"the checkpoint quantizes the experts of {owner!r}, but {shape}")
        want = {f"{n}.{e}" for n in shape.names for e in range(shape.num_experts)}
        if have != want:
            raise ValueError(f"the checkpoint quantizes {len(have)} of the {len(want)} expert projections of "
                             f"{owner!r} (e.g. missing {sorted(want - have)[:3]}): all or none are needed")
        lists = [nn.ModuleList(nn.Linear(k, n, bias=shape.has_bias, device="meta")
                               for _ in range(shape.num_experts)) for n, k in shape.shapes]
        _install(module, shape, lists)
        prepared.append(owner)
    return prepared


def dequantize_experts_(module: nn.Module, dtype: torch.dtype) -> None:
    """The inverse, in place: the module's QuantLinear lists back to 3-D ``dtype`` parameters of the dequantized
    weights (and biases) and the module back to its own class (the float model a quantized one must reproduce)."""
    base = _base_class(type(module))
    for name in _PROJ[bool(module.has_gate)]:
        layers = module._modules.pop(name)
        w = torch.stack([q.dequantize(dtype) for q in layers])
        module._parameters[name] = nn.Parameter(w.transpose(1, 2).contiguous() if module.is_transposed else w,
                                                requires_grad=False)
        if module.has_bias:
            module._parameters[f"{name}_bias"] = nn.Parameter(torch.stack([q.bias.detach().to(dtype)
                                                                           for q in layers]), requires_grad=False)
    module.__class__ = base


def _base_class(cls: type) -> type:
    return next(c for c in cls.__mro__[1:] if not issubclass(c, QuantizedExperts))


def _rebuild(base: type) -> nn.Module:
    """Unpickling (and deepcopy): an empty instance of ``base``'s quantized class, with a key of its own (its state,
    which follows, carries none)."""
    module = object.__new__(quantized_experts_class(base))
    _register(module)
    return module


# The op's way back to its module (module docstring): key -> module, weakly (a dropped model's entries go with it).
_KEY_ATTR = "_mixgemm_experts_key"
_BY_KEY: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_KEYS = itertools.count()


def _register(module: nn.Module) -> None:
    key = next(_KEYS)
    module.__dict__[_KEY_ATTR] = key  # (past nn.Module.__setattr__: a plain int attribute)
    _BY_KEY[key] = module


@define_op("experts(Tensor hidden_states, Tensor top_k_index, Tensor top_k_weights, int key) -> Tensor")
def experts_op(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
               key: int) -> torch.Tensor:
    """The experts module registered under ``key``, called as it is eagerly (QuantizedExperts.experts_forward):
    [T, H] -> a new [T, H] tensor in hidden_states.dtype."""
    module = _BY_KEY.get(key)
    if module is None:
        raise RuntimeError(f"mixgemm::experts: the experts module of key {key} no longer exists (a compiled function "
                           "outlived the model it was compiled for)")
    return module.experts_forward(hidden_states, top_k_index, top_k_weights)


@register_fake_ops("experts")
def _(hidden_states, top_k_index, top_k_weights, key):
    torch._check(top_k_index.shape == top_k_weights.shape, lambda: f"top_k_index {tuple(top_k_index.shape)} and "
                 f"top_k_weights {tuple(top_k_weights.shape)} differ")
    return hidden_states.new_empty(hidden_states.shape)


class QuantizedExperts(nn.Module):
    """The forward of a fused experts module whose projections are per-expert QuantLinear lists (module
    docstring). Placed before the transformers class in the quantized class's bases; everything else is the
    module's own."""

    def __reduce_ex__(self, protocol):
        # the quantized class is made at run time, so pickle (torch.save of a whole model) names the
        # transformers class it derives from and makes it again on loading
        state = self.__dict__.copy()
        state.pop(_KEY_ATTR, None)  # (the copy registers its own)
        return _rebuild, (_base_class(type(self)),), state

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() and not (torch.is_grad_enabled() and hidden_states.requires_grad):
            # one node in the graph, no break (module docstring); its kernel is experts_forward
            return torch.ops.mixgemm.experts(hidden_states, top_k_index, top_k_weights, self.__dict__[_KEY_ATTR])
        return self.experts_forward(hidden_states, top_k_index, top_k_weights)

    def experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
        """The eager forward: one launch a projection (routed GEMV or grouped GEMM, ``path``) where the experts allow
        it, else each expert's tokens through its layers."""
        first, down = (self.gate_up_proj if self.has_gate else self.up_proj), self.down_proj
        t, h = hidden_states.shape
        k = top_k_index.shape[-1]
        if t > 0 and hidden_states.dtype in (torch.float16, torch.bfloat16) \
                and not (torch.is_grad_enabled() and hidden_states.requires_grad):
            y = self._routed(hidden_states, top_k_index, top_k_weights)
            if y is not None:
                return y

        def expert(e: int, x: torch.Tensor) -> torch.Tensor:
            y = first[e](x)
            y = self._apply_gate(y) if self.has_gate else self.act_fn(y)
            y = down[e](y)
            return self.post_expert_norm(y) if getattr(self, "has_post_expert_norm", False) else y

        if t == 1:  # decoding one token: its k experts in turn, no sorting
            ids = top_k_index.reshape(-1).tolist()  # the one host synchronisation
            keep = [s for s, e in enumerate(ids) if e < self.num_experts]  # expert-parallel sentinels add nothing
            if not keep:
                return torch.zeros_like(hidden_states)
            ys = torch.cat([expert(ids[s], hidden_states) for s in keep])
            w = top_k_weights.reshape(-1)
            return _slot_sum(ys, w if len(keep) == k else w[keep], 1, len(keep), hidden_states.dtype)
        # the (token, slot) pairs sorted by expert: each expert's tokens are one contiguous run
        ids = top_k_index.reshape(-1)
        order = torch.argsort(ids, stable=True)
        counts = torch.bincount(ids, minlength=self.num_experts).tolist()  # the one host synchronisation
        rows = hidden_states[order // k]
        parts, start = [], 0
        for e, c in enumerate(counts[:self.num_experts]):
            if c:
                parts.append(expert(e, rows[start:start + c]))
            start += c
        if start < t * k:  # sentinel pairs (ids past the local experts) sort last and add nothing
            parts.append(hidden_states.new_zeros(t * k - start, h))
        ys = torch.cat(parts) if parts else hidden_states.new_zeros(0, h)
        pairs = torch.empty_like(ys)
        pairs[order] = ys
        return _slot_sum(pairs, top_k_weights, t, k, hidden_states.dtype)

    @torch.compiler.disable
    def _routed(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor | None:
        """Every (token, expert) slot in one launch per projection, the routing read on the GPU (module docstring):
        the routed GEMV or, for many tokens, the grouped tensor-core GEMM (``path``); slots of no local expert give
        zeros. None where the experts cannot run so (_joined says why) or the rule sends the call to the sorted
        per-expert path."""
        from mixgemm import tuning
        from mixgemm.kernels.cuda.grouped_gemm import grouped_config, grouped_gemm, tile_table
        from mixgemm.kernels.cuda.routed_gemv import routed_gemv

        if hidden_states.device.type != "cuda":
            return None
        stacks = _joined(self)
        if isinstance(stacks, str):
            return None
        t = hidden_states.shape[0]
        k = top_k_index.shape[-1]
        how = path(t, k, self.num_experts, tuning.routed_experts(tuning.table_for(hidden_states.device)))
        if how == "sorted":
            return None
        route = top_k_index.reshape(-1).to(torch.int64).contiguous()
        x, x_div, order = hidden_states.contiguous(), k, None
        if how == "grouped" or t > ROUTED_TOKENS:
            # slots in expert order (no host round trip: argsort): grouped, each expert's slots are one run of rows, BM
            # of them a tile; routed, the blocks on the SMs at one time mostly read the same expert's weights, so each
            # expert's bytes come from DRAM about once and its other slots' reads hit L2
            order = torch.argsort(route, stable=True)
            route, x, x_div = route[order], x[order // k], 1
        if how == "grouped":
            cfg = grouped_config(route.shape[0], self.num_experts)
            table = tile_table(route, self.num_experts, cfg["BM"])  # one for both projections

            def project(inp, stack, div, first):
                return grouped_gemm(inp, route, stack, cfg, zero_unrouted=not first, table=table)
        else:
            def project(inp, stack, div, first):
                return routed_gemv(inp, route, stack, div)  # [t k, out]: x row s // div

        y = project(x, stacks[0], x_div, True)
        y = self._apply_gate(y) if self.has_gate else self.act_fn(y)
        y = project(y.contiguous(), stacks[1], 1, False)
        if getattr(self, "has_post_expert_norm", False):
            y = self.post_expert_norm(y)
        if order is not None:
            pairs = torch.empty_like(y)
            pairs[order] = y
            y = pairs
        return _slot_sum(y, top_k_weights, t, k, hidden_states.dtype)


def _slot_sum(ys: torch.Tensor, weights: torch.Tensor, t: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """Each token's k slot outputs (ys [t k, H], slot-major per token) weighted by the routing and summed, in fp32
    in slot order (deterministic, as transformers' batched experts) -> [t, H] in ``dtype``."""
    return (ys.float().view(t, k, ys.shape[-1]) * weights.float().view(t, k, 1)).sum(dim=1).to(dtype)


# Which path a call takes (QuantizedExperts._routed, ``path``):
# * the routed GEMV (mixgemm.kernels.cuda.routed_gemv): one launch a projection over every slot, each slot multiplying
#   all of its expert's weights on the CUDA cores (past a few tokens in expert order, so each expert's bytes come from
#   DRAM about once). Always up to ROUTED_TOKENS tokens (decoding).
# * the grouped GEMM (mixgemm.kernels.cuda.grouped_gemm): one tensor-core launch a projection, BM rows of one expert a
#   tile, each expert's weights read once per tile; it pays a sort, a tile table and tiles of few rows.
# The routed GEMV's cost grows with the slots, the grouped GEMM's with the experts they reach, so the choice is the
# slots per reached expert: grouped from the GPU's ``grouped_from_rows`` (mixgemm.tuning routed_experts, measured
# where the two meet on Qwen3-MoE's 128 small experts and Mixtral's 8 large ones: on the H100 at about 2.2 slots per
# expert both, 32 and 8 tokens; on the H200 2.4-2.6). Without those costs (a table without the section) calls past the
# few tokens take the sorted per-expert layers, which also run what the other two cannot (int8-activation or act-order
# experts, the CPU).
ROUTED_TOKENS = 4
PATHS = ("routed", "grouped", "sorted")


def path(tokens: int, k: int, num_experts: int, costs: dict | None = None) -> str:
    """'routed', 'grouped' or 'sorted': the path of a call of ``tokens`` tokens with top-``k`` routing over
    ``num_experts`` experts under ``costs`` (mixgemm.tuning.routed_experts; None: only the few-token rule) (above)."""
    if tokens <= ROUTED_TOKENS:
        return "routed"
    if costs is None:
        return "sorted"
    from mixgemm.kernels.cuda.grouped_gemm import reached_experts

    slots = tokens * k
    return "grouped" if slots >= costs["grouped_from_rows"] * reached_experts(slots, num_experts) else "routed"


def _joined(module: nn.Module):
    """The two projections' joined ExpertLayouts (joined on the first ask), or why the routed GEMV cannot run them."""
    lists = [getattr(module, name) for name in _PROJ[bool(module.has_gate)]]
    if not all(isinstance(layers, ExpertList) for layers in lists):
        return "the experts are a plain ModuleList (an old pickle): no stack to join"
    # each projection's stack is made (and attached: its members' compaction joins it later) even where another's
    # join is refused
    why = [layers.stack().join() for layers in lists]
    return next((w for w in why if w is not None), None) or tuple(layers.stack().stacked for layers in lists)


def join_experts(model: nn.Module) -> list[str]:
    """Join the experts of every quantized experts module of ``model`` that the routed GEMV can run (each projection's
    layouts in one buffer, mixgemm.nn.expert_stack), now rather than at the first routed call: quantize_ and
    from_pretrained call it, so that a first step under torch.compile's CUDA graphs allocates nothing that outlives
    it. Returns the names of the modules joined."""
    return [name for name, mod in model.named_modules()
            if isinstance(mod, QuantizedExperts) and not isinstance(_joined(mod), str)]


def routed_why_not(module: nn.Module) -> str | None:
    """Why a quantized experts module's decoding calls do not run routed (None: they do; the experts joined)."""
    stacks = _joined(module)
    return stacks if isinstance(stacks, str) else None


__all__ = ["ExpertList", "ExpertsShape", "QuantizedExperts", "dequantize_experts_", "experts_shape",
           "holds_fused_experts", "join_experts", "path", "prepare_skeleton", "quantize_experts_", "routed_why_not",
           "why_not_experts"]
