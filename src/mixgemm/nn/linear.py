"""QuantLinear: a drop-in replacement for nn.Linear with a block-quantized weight.

The weight lives in buffers (the plain interchange layout of mixgemm.formats.weight), so that
``state_dict`` / ``load_state_dict`` / safetensors, ``.to()`` / ``.cuda()`` and ``copy.deepcopy`` work as for
any module; the format (bits, group size, mode, activation quantization) is also stored in the state dict
(``_extra_state``, an int64 tensor, so safetensors can hold it) and checked on load.

forward(x): x float16 / bfloat16 / float32 [..., in_features] on the module's device -> [..., out_features]
in x.dtype, through torch.ops.mixgemm.linear_wxa16 (CUDA kernels; the CPU fallback on the CPU) or, for
activation-quantized formats (W8A8 / W4A8), torch.ops.mixgemm.linear_wxa8 (int8 tensor-core kernels on
CUDA; the float64 reference on the CPU). An eager weight-only forward on the CPU with nothing for autograd to
record calls mixgemm.matmul directly: the same computation as the op's CPU implementation, without torch.library's
dispatch wrapper, whose first call imports torch._dynamo and with it triton.

Act-order (GPTQ ``desc_act``) layers carry ``input_perm`` int64 [in_features]: forward computes
``x[..., input_perm] @ dequant(W).T`` with W's columns stored in that order, so that every weight group is a
contiguous run of K. Ordinary layers have no ``input_perm`` (None, left out of the state dict). When the module
that feeds an act-order layer already gathers its output through the same permutation
(mixgemm.nn.norms, under torch.compile), ``input_gathered_by`` names it and forward takes x as
already gathered there.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

import torch
from torch import nn

import mixgemm.ops.custom_ops  # noqa: F401  (registers torch.ops.mixgemm.*)
from mixgemm.formats.activation import ACT_MODES, SYMMETRIC_ACT_MODES, check_act
from mixgemm.formats.packing import packed_width
from mixgemm.formats.weight import (
    MODES,
    PER_CHANNEL,
    QuantConfig,
    QuantizedWeight,
    compact_placeholder,
    dequantize_weight,
    is_compact_placeholder,
    narrow_group_reason,
    quantize_weight,
)
from mixgemm.ops.custom_ops import cache_weight, compact_weight, drop_cached, weight_from_tensors
from mixgemm.ops.eager import eager_applies, eager_forward, fast_call
from mixgemm.ops.kept_launches import forget

_MODE_ID = {m: i for i, m in enumerate(MODES)}
# (act_mode, act_block) -> the id in the format tensor, fixed as saved files hold them; ids 0-2 are the version-1
# ones (per weight group)
_ACT_ID = {(None, "group"): 0, ("sym", "group"): 1, ("asym", "group"): 2, ("sym", "token"): 3, ("asym", "token"): 4,
           ("sym_full", "group"): 5, ("sym_full", "token"): 6}
assert {m for m, _ in _ACT_ID} == {None, *ACT_MODES}
_DTYPE_ID = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}


# The group whose joined layout holds this layer's, in its __dict__: the SiblingGroup (mixgemm.nn.siblings) of a layer
# that reads the same tensor as other layers, or an expert's ExpertStack (mixgemm.nn.expert_stack). Its protocol:
# release() before the layer's weight tensors change, try_join() after it is compacted, traced_output() under compile.
SIBLINGS_ATTR = "_mixgemm_siblings"
_WEIGHT_TENSORS = frozenset({"qweight", "scales", "zeros", "offsets", "bias", "input_perm"})


class QuantLinear(nn.Module):
    """y = x @ dequant(W).T + bias with W [out_features, in_features] block-quantized along in_features.

    Build it with ``QuantLinear.from_linear(linear, QuantConfig(...))``, ``QuantLinear.from_quantized(qw,
    bias)``, or empty with the constructor (then ``load_state_dict``).

    Buffers: qweight uint8 [N, ceil(K * bits / 8)]; scales [N, G] (scale dtype); zeros uint8 [N, G] for mode
    "zero_point", else empty; offsets [N, G] for mode "offset", else empty; input_perm int64 [K] for act-order
    layers (``act_order=True``; the stored weight's columns are in that order), else None. bias: a Parameter [N]
    (requires_grad=False) or None. ``act_mode`` None (weight-only) or "sym" / "asym" / "sym_full" (int8 activations,
    mixgemm.formats.activation's schemes, per token and per weight group, or per token over the whole row with
    ``act_block="token"``).

    ``.to(dtype)`` / ``.half()`` convert the bias like nn.Linear does but never the scales and offsets:
    re-rounding them would change the quantized weight.

    ``auto_compact``: True (quantize_ / from_pretrained set it) keeps the codes in one resident layout wherever the
    layer lands on an sm_90 GPU (compact_), also after ``.to()``, ``load_state_dict`` and unpickling; elsewhere the
    plain codes. ``uncompact_()`` clears it.

    ``input_gathered_by``: None, or (act-order layers) the name of the module whose output arrives already gathered
    through ``input_perm`` (mixgemm.nn.norms): under torch.compile forward then multiplies x as it
    comes (gathers_input). Not part of the state dict, which keeps ``input_perm``.
    """

    input_gathered_by: str | None = None
    _mixgemm_siblings = None  # (SIBLINGS_ATTR: the instance's group where it has one)
    # Keep the codes in one resident layout wherever the layer lands on a GPU whose kernels read one (an sm_90 GPU:
    # _auto_compact). quantize_ and from_pretrained set it (their ``compact`` argument, default True); a layer built
    # directly keeps its plain codes unless asked (compact_), and uncompact_ clears it.
    auto_compact: bool = False
    # The fields forward hands the ops, kept together as one tuple (_op_fields) that __setattr__ refreshes: under
    # torch.compile each attribute a layer's forward reads is a guard evaluated on every call of the compiled
    # function, and a tuple of constants is one.
    _OP_FIELDS = ("config", "out_features", "in_features", "act_mode", "act_block")

    def __init__(self, in_features: int, out_features: int, bias: bool = True, bits: int = 4,
                 group_size: int = 128, mode: str = "sym", scale_dtype: torch.dtype = torch.float16,
                 act_mode: str | None = None, device=None, bias_dtype: torch.dtype | None = None,
                 act_block: str = "group", act_order: bool = False):
        super().__init__()
        config = QuantConfig(bits=bits, group_size=group_size, mode=mode, scale_dtype=scale_dtype)
        _, ng = config.groups(in_features)
        check_act(act_mode, act_block, optional=True)
        if act_mode is not None and narrow_group_reason(group_size, ng):
            raise ValueError(f"act_mode={act_mode!r} with group_size={group_size}: groups of {group_size} are for "
                             "weight-only layers; the int8-activation kernels take groups of 32 or more")
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.config = config
        self.act_mode = act_mode
        self.act_block = act_block if act_mode is not None else "group"
        n = self.out_features
        self.register_buffer("qweight", torch.zeros(n, packed_width(in_features, bits), dtype=torch.uint8,
                                                  device=device))
        self.register_buffer("scales", torch.zeros(n, ng, dtype=scale_dtype, device=device))
        self.register_buffer("zeros", torch.zeros((n, ng) if mode == "zero_point" else (0,), dtype=torch.uint8,
                                                  device=device))
        self.register_buffer("offsets", torch.zeros((n, ng) if mode == "offset" else (0,), dtype=scale_dtype,
                                                    device=device))
        # None (not in the state dict) unless act-order: old checkpoints of ordinary layers load unchanged.
        self.register_buffer("input_perm", torch.arange(in_features, dtype=torch.int64, device=device)
                             if act_order else None)
        if bias:
            self.bias = nn.Parameter(torch.zeros(n, dtype=bias_dtype or scale_dtype, device=device),
                                     requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def __setattr__(self, name, value):
        if name in _WEIGHT_TENSORS and self.__dict__.get(SIBLINGS_ATTR) is not None:
            self._weight_changes()  # a tensor assigned: a joined layout over the old one is stale (nn/siblings.py)
        super().__setattr__(name, value)
        if name in self._OP_FIELDS and all(f in self.__dict__ for f in self._OP_FIELDS):
            c = self.config
            # (the output clamp last: none, -inf..inf; constants read from here cost no guard of their own)
            self.__dict__["_op_fields"] = (c.bits, c.group_size, c.mode, self.out_features, self.in_features,
                                           self.act_mode, self.act_block, -math.inf, math.inf)

    # ---- construction -------------------------------------------------------------------------------
    @classmethod
    def from_quantized(cls, qw: QuantizedWeight, bias: torch.Tensor | None = None,
                       act_mode: str | None = None, act_block: str = "group",
                       input_perm: torch.Tensor | None = None) -> QuantLinear:
        """A QuantLinear holding ``qw`` (its tensors are used as the buffers, not copied) and ``bias`` [N].

        input_perm: None, or a permutation of range(K) (integer [K]) for act-order weights whose columns are
        stored in that order: the layer then computes ``x[..., input_perm] @ dequant(qw).T``."""
        if not isinstance(qw, QuantizedWeight):
            raise TypeError(f"qw must be a QuantizedWeight, got {type(qw).__name__}")
        n, k = qw.shape
        if bias is not None and tuple(bias.shape) != (n,):
            raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
        if input_perm is not None:
            input_perm = _check_perm(input_perm, k).to(qw.device)
            if act_mode is not None:
                raise ValueError("input_perm (act-order) is supported for weight-only layers, not with act_mode")
        c = qw.config
        mod = cls(k, n, bias=bias is not None, bits=c.bits, group_size=c.group_size, mode=c.mode,
                  scale_dtype=c.scale_dtype, act_mode=act_mode, device="meta", act_block=act_block,
                  act_order=input_perm is not None)
        mod.qweight = qw.qweight
        mod.scales = qw.scales
        if qw.zeros is not None:
            mod.zeros = qw.zeros
        else:
            mod.zeros = torch.empty(0, dtype=torch.uint8, device=qw.device)
        if qw.offsets is not None:
            mod.offsets = qw.offsets
        else:
            mod.offsets = torch.empty(0, dtype=c.scale_dtype, device=qw.device)
        if input_perm is not None:
            mod.input_perm = input_perm
        if bias is not None:
            mod.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
        return mod

    @classmethod
    def from_linear(cls, linear: nn.Linear, config: QuantConfig | None = None, act_mode: str | None = None,
                    act_block: str = "group", **kwargs) -> QuantLinear:
        """Quantize an nn.Linear's weight (on its device) with ``config`` (or QuantConfig(**kwargs)).
        The bias is copied in its dtype. The nn.Linear is not modified."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"from_linear needs an nn.Linear, got {type(linear).__name__}")
        qw = quantize_weight(linear.weight.detach(), config, **kwargs)
        return cls.from_quantized(qw, None if linear.bias is None else linear.bias.detach(), act_mode=act_mode,
                                  act_block=act_block)

    # ---- views --------------------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return self.config.bits

    @property
    def group_size(self) -> int:
        return self.config.group_size

    @property
    def mode(self) -> str:
        return self.config.mode

    @property
    def activation_quantized(self) -> bool:
        """True for W8A8 / W4A8 (int8 activations), False for weight-only formats."""
        return self.act_mode is not None

    @property
    def act_order(self) -> bool:
        """True when the layer permutes its input features (``input_perm``) before the product."""
        return self.input_perm is not None

    def quantized_weight(self) -> QuantizedWeight:
        """The QuantizedWeight over this module's buffers (shared, not copied); for act-order layers its
        columns are in ``input_perm`` order."""
        c = self.config
        return weight_from_tensors(self.qweight, self.scales, self.zeros, self.offsets, c.bits, c.group_size,
                                   c.mode, self.out_features, self.in_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight [out_features, in_features] this module multiplies by, in the original input order
        (for act-order layers the stored columns are put back: ``x @ dequantize().T`` is the layer's product)."""
        w = dequantize_weight(self.quantized_weight(), dtype)
        if self.input_perm is None:
            return w
        return torch.empty_like(w).index_copy_(1, self.input_perm, w)  # column input_perm[j] <- stored column j

    @property
    def weight(self) -> torch.Tensor:
        """Read-only convenience for code that inspects ``.weight`` (dtype, device, shape): the dequantized
        weight in the scale dtype. Computed on each access; forward never uses it."""
        return self.dequantize(self.scales.dtype)

    # ---- forward ------------------------------------------------------------------------------------
    def gathers_input(self) -> bool:
        """Whether forward applies input_perm itself: always, except for a layer whose feeding norm gathers x
        (input_gathered_by) while torch.compile traces it. Why only then: the norm's gather is one launch for the
        layers it feeds, which pays where the GPU's time counts (a compiled, graph-replayed decode step); in eager
        mode it would be host work on a host-bound loop, so the layers gather in their kernels there."""
        return self.input_gathered_by is None or not torch.compiler.is_compiling()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Under torch.compile the eager paths are not traced at all: tracing into ops/eager.py reached the torch
        # module through that module's globals too, and dynamo guarded the two references alike with Python lambda
        # guards, two per layer on every call of the compiled function.
        eager = not torch.compiler.is_compiling()
        if eager:
            y = fast_call(self, x)  # this input shape seen before: its kept launch (ops/eager.py)
            if y is not None:
                return y
        else:
            siblings = self._mixgemm_siblings
            if siblings is not None:  # the layers reading this x as one launch (mixgemm.nn.siblings)
                y = siblings.traced_output(self, x)
                if y is not None:
                    return y
        # act-order weight-only layers hand input_perm to the kernels (the GEMVs gather x while reading it, the
        # GEMMs after one gather: mixgemm.ops.dispatch.run_linear); activation-quantized ones gather here
        bits, group_size, mode, n, k, act_mode, act_block, lo, hi = self._op_fields
        perm = self._buffers.get("input_perm") if self.gathers_input() else None
        if perm is not None and act_mode is not None:
            x, perm = x[..., perm], None
        if eager and eager_applies(self, x):  # nothing for autograd to record: no op dispatch (ops/eager.py)
            y = eager_forward(self, x)
            if y is not None:
                return y
        # only the tensors the mode reads: torch.compile guards each tensor handed to the op on every call
        b = self._buffers
        zeros = b["zeros"] if mode == "zero_point" else None  # (mode_params, inline: a function is one more guard)
        offsets = b["offsets"] if mode == "offset" else None
        bias = self.bias
        # no gradient to record: the ops' no_grad overload, without the Python autograd kernel in front of each call
        grad = torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad))
        if act_mode is None:
            op = torch.ops.mixgemm.linear_wxa16
            return (op.default if grad else op.no_grad)(x, b["qweight"], b["scales"], zeros, offsets, bias, bits,
                                                        group_size, mode, n, k, lo, hi, perm)
        op = torch.ops.mixgemm.linear_wxa8
        return (op.default if grad else op.no_grad)(x, b["qweight"], b["scales"], zeros, offsets, bias, bits,
                                                    group_size, mode, n, k, act_mode, lo, hi, act_block)

    # ---- one resident layout -------------------------------------------------------------------------
    @property
    def compact(self) -> str | None:
        """The one layout this layer keeps its codes in (compact_), or None: the plain codes are held."""
        return self.quantized_weight().resident if is_compact_placeholder(self.qweight) else None

    def compact_reason(self, layout: str | None = None) -> str | None:
        """Why this layer cannot keep its codes in ``layout`` only (compact_), or None when it can. layout None: the
        one its kernels read, wgmma_v1 for weight-only layers (int8 ones may keep rows_v1 instead, opt-in),
        wgmma_a8_v1 for int8-activation ones."""
        layout = layout or self._resident_layout()
        want = self._resident_layout()
        if layout == "rows_v1" and self.act_mode is None:
            if self.config.bits != 8:
                return f"rows_v1 holds int8 weights, the layer is int{self.config.bits}"
        elif layout != want:
            return f"a {'weight-only' if self.act_mode is None else 'int8-activation'} layer's kernels read {want}"
        narrow = narrow_group_reason(*self.config.groups(self.in_features))
        if narrow and self.act_mode is None:
            return f"{layout} (a CUDA kernels' layout): {narrow}"
        dev = self.qweight.device
        if dev.type == "meta":
            return "the layer is on the meta device (no values)"
        if dev.type == "cuda" and torch.cuda.get_device_capability(dev) < (9, 0):
            major, minor = torch.cuda.get_device_capability(dev)
            return f"the {layout} layout is read by the Hopper kernels (sm_90); {dev} is sm_{major}{minor}"
        if self.act_mode is not None:
            from mixgemm.formats.layouts_wgmma_a8 import a8_layout_supported

            if self.act_mode not in SYMMETRIC_ACT_MODES:
                return (f"act_mode {self.act_mode!r}: the int8 GEMM that reads {layout} takes sym activations "
                        f"{SYMMETRIC_ACT_MODES}")
            if not a8_layout_supported(self.quantized_weight()):
                return (f"{layout} holds sym int4 / int8 weights with group 128, 256 or per-channel, the layer is "
                        f"{self.config.mode} group {self.config.group_size}")
        return None

    def _resident_layout(self) -> str:
        return "wgmma_v1" if self.act_mode is None else "wgmma_a8_v1"

    def compact_(self, layout: str | None = None) -> QuantLinear:
        """Keep the weight's codes only in ``layout`` (None: the Hopper GEMM's, wgmma_v1 for weight-only layers,
        wgmma_a8_v1 for int8-activation ones; int8 weight-only layers may ask for rows_v1, kernels/cuda/rows_layout.py):
        it is built now, the plain codes' memory is released (``qweight`` becomes a placeholder of its shape without
        the bytes), the kernel layouts built so far are dropped, and from then on only kernels reading that layout run
        the layer (mixgemm.explain says which). About 1.0-1.06x the packed size on the GPU at any M, where a layer that
        decodes and prefills otherwise keeps two or three copies.
        ``state_dict()`` still writes the plain codes (rebuilt from the layout); ``load_state_dict``, ``.to()`` and
        ``uncompact_()`` restore them first. On the CPU or an sm_90 GPU; compact_reason says why a layer cannot.
        Compact a model once it is on its device: code that moves buffers itself (not through ``Module.to``) would
        carry only the placeholder. Returns self."""
        layout = layout or self._resident_layout()
        if self.compact is not None:
            if self.compact != layout:
                raise ValueError(f"the layer keeps its {self.compact} layout; uncompact_() it before compacting to "
                                 f"{layout}")
            return self
        why = self.compact_reason(layout)
        if why is not None:
            raise ValueError(f"compact_({layout!r}): {why}")
        old = self.qweight
        placeholder = compact_placeholder(old)
        qw = compact_weight(self.quantized_weight(), placeholder, layout)
        self._weight_changes()  # kept launches and a joined layout hold the layouts being dropped
        self._buffers["qweight"] = placeholder
        cache_weight(placeholder, qw)
        drop_cached(old)  # (so that the plain codes and the other layouts go now, not at the next garbage collection)
        siblings = self.__dict__.get(SIBLINGS_ATTR)
        if siblings is not None:
            siblings.try_join()  # (joined once the last of the group is compacted)
        return self

    def uncompact_(self) -> QuantLinear:
        """Undo compact_: the plain codes are rebuilt from the resident layout and held again (the layout stays
        cached, so the kernels that read it need not rebuild it), and kept from now on (auto_compact cleared: a move
        or a reload does not compact the layer again). Returns self."""
        self.auto_compact = False
        return self._restore_plain()

    def set_auto_compact(self, on: bool) -> QuantLinear:
        """Set auto_compact (quantize_'s and from_pretrained's ``compact``) and compact the layer now where it applies.
        Returns self."""
        self.auto_compact = on
        self._auto_compact()
        return self

    def _auto_compact(self) -> None:
        """compact_() where auto_compact is set and the layer is on an sm_90 GPU, whose kernels serve every M from
        one layout; on the CPU (its kernels read the plain codes), another GPU or a layer compact_reason refuses it
        keeps the plain codes, without a warning: one layout is the default there, not a request."""
        if (self.auto_compact and self.compact is None and one_layout_device(self.qweight.device)
                and self.compact_reason() is None):
            self.compact_()

    def _restore_plain(self) -> QuantLinear:
        """The plain codes rebuilt from the resident layout and held again (compact_ undone; auto_compact kept)."""
        if self.compact is None:
            return self
        qw = self.quantized_weight()
        plain = qw.packed()
        self._weight_changes()
        old = self._buffers["qweight"]
        self._buffers["qweight"] = plain
        cache_weight(plain, replace(qw, qweight=plain, resident=None))
        drop_cached(old)  # (the placeholder and its cached weight refer to each other: a cycle until gc otherwise)
        return self

    def _weight_changes(self) -> None:
        """Before this layer's weight tensors are replaced: drop what holds their layouts (the eager path's kept
        launches, the joined layer of its sibling group)."""
        forget(self.__dict__)
        siblings = self.__dict__.get(SIBLINGS_ATTR)
        if siblings is not None:
            siblings.release()

    # ---- state ---------------------------------------------------------------------------------------
    def _format_tensor(self) -> torch.Tensor:
        c = self.config
        fmt = [1, c.bits, c.group_size, _MODE_ID[c.mode], _DTYPE_ID[c.scale_dtype],
               _ACT_ID[(self.act_mode, self.act_block)], self.out_features, self.in_features]
        if self.input_perm is not None:  # version 2 only for act-order layers: ordinary ones keep version 1
            fmt[0] = 2
            fmt.append(1)
        return torch.tensor(fmt, dtype=torch.int64)

    def get_extra_state(self) -> torch.Tensor:
        """The format as int64 [8]: (version 1, bits, group_size, mode, scale dtype, act mode, N, K); act-order
        layers write version 2 with a 9th field, 1 (an input permutation is stored)."""
        return self._format_tensor()

    def set_extra_state(self, state) -> None:
        mine = self._format_tensor()
        got = torch.as_tensor(state).to(torch.int64).cpu()
        if got.shape != mine.shape or not torch.equal(got, mine):
            if got.dim() == 1 and got.numel() in (8, 9) and (got.numel() == 9) != self.act_order:
                raise ValueError("QuantLinear checkpoint format differs from this module: act-order (input_perm) "
                                 f"is {'present' if got.numel() == 9 else 'absent'} in the checkpoint and "
                                 f"{'present' if self.act_order else 'absent'} in the module (build it with "
                                 f"act_order={got.numel() == 9})")
            names = ("version", "bits", "group_size", "mode", "scale_dtype", "act_mode", "N", "K", "act_order")
            diff = [f"{nm}: checkpoint {int(a)} vs module {int(b)}"
                    for nm, a, b in zip(names, got.flatten().tolist(), mine.tolist(), strict=False) if a != b]
            raise ValueError("QuantLinear checkpoint format differs from this module (" + "; ".join(diff or
                             [f"shape {tuple(got.shape)}"]) + ")")
        if self.input_perm is not None and self.input_perm.device.type != "meta":
            # load_state_dict copies the buffers before the extra state: a corrupt permutation is caught here
            _check_perm(self.input_perm, self.in_features)

    def __getstate__(self):
        # pickle / deepcopy: a compacted layer travels with its plain codes (the cache that holds its resident layout
        # hangs on the placeholder tensor and is not pickled) and compacts itself again on arrival
        state = dict(super().__getstate__())
        state.pop(SIBLINGS_ATTR, None)  # (a copy runs its layers one by one: the group is the original model's)
        layout = self.compact
        if layout is not None:
            state["_buffers"] = {**state["_buffers"], "qweight": self.quantized_weight().packed()}
            state["_compact_on_load"] = layout
        return state

    def __setstate__(self, state):
        layout = state.pop("_compact_on_load", None)
        super().__setstate__(state)
        if self.auto_compact:
            self._auto_compact()
        elif layout is not None:
            self._compact_again(layout, "unpickled")

    def _compact_again(self, layout: str, what: str) -> None:
        """compact_(layout) after a move or an unpickling, or a warning saying why the layer keeps its plain codes."""
        why = self.compact_reason(layout)
        if why is None:
            self.compact_(layout)
        else:
            warnings.warn(f"QuantLinear {what} to {self.qweight.device} keeps its plain codes: {why}", stacklevel=3)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if prefix + "qweight" in destination and self.compact is not None:
            destination[prefix + "qweight"] = self.quantized_weight().packed()  # the plain codes, as checkpoints hold

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        layout = self.compact
        if layout is None:
            return super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._restore_plain()  # load into the plain buffers, then keep the loaded codes in the layout again
        try:
            super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        finally:
            self.compact_(layout)

    def _apply(self, fn, recurse=True):
        layout = self.compact
        if layout is not None:  # moved as plain codes, kept in the layout again where it can be
            self._restore_plain()
            out = self._apply(fn, recurse)  # (an auto_compact layer compacts itself there, where its device allows)
            if not self.auto_compact:
                self._compact_again(layout, "moved")
            return out
        self._weight_changes()  # the eager path's kept launches hold the layouts of the tensors being replaced
        # Keep the scale dtype: only move scales / offsets to the device fn would send them to.
        keep = {id(self.scales), id(self.offsets)}

        def keep_dtype(t):
            r = fn(t)
            if id(t) in keep and r.dtype != t.dtype:
                return t.to(device=r.device)
            return r

        out = super()._apply(keep_dtype, recurse)
        self._auto_compact()
        return out

    def extra_repr(self) -> str:
        c = self.config
        g = "per-channel" if c.group_size == PER_CHANNEL else c.group_size
        fmt = f"W{c.bits}A{8 if self.act_mode else 16}"
        s = (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
             f"format={fmt}, group_size={g}, mode={c.mode}, scale_dtype={str(c.scale_dtype).replace('torch.', '')}")
        if self.act_mode:
            s += f", act_mode={self.act_mode}" + (", act_block=token" if self.act_block == "token" else "")
        if self.act_order:
            s += ", act_order=True"
        if self.input_gathered_by:
            s += f", input gathered by {self.input_gathered_by}"
        return s


def one_layout_device(device: torch.device) -> bool:
    """True where QuantLinear.auto_compact keeps a layer in one resident layout: an sm_90 GPU, whose kernels (the
    GEMVs and the wgmma GEMMs) all read the Hopper GEMM's layout. Elsewhere the kernels read the plain codes."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


def _check_perm(perm: torch.Tensor, k: int) -> torch.Tensor:
    """perm as int64 [k], checked to be a permutation of range(k)."""
    if not isinstance(perm, torch.Tensor) or perm.is_floating_point() or perm.is_complex() or perm.dtype == torch.bool:
        raise TypeError(f"input_perm must be an integer tensor, got {getattr(perm, 'dtype', type(perm).__name__)}")
    if tuple(perm.shape) != (k,):
        raise ValueError(f"input_perm must have shape ({k},), got {tuple(perm.shape)}")
    perm = perm.to(torch.int64)
    if not torch.equal(torch.sort(perm.cpu()).values, torch.arange(k)):
        raise ValueError(f"input_perm is not a permutation of range({k})")
    return perm
