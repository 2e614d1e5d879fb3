"""``mixgemm.quantize_(model, config, filter_fn=None)``: replace a model's nn.Linear layers by QuantLinear.

Configs are named by precision (weights W, activations A):

=========  =================================  ====================================================
config     what                               on CUDA
=========  =================================  ====================================================
W4A16      int4 weights, fp activations       CUDA GEMV (M <= 16) / Triton GEMM (mixgemm.matmul)
W8A16      int8 weights, fp activations       same
W8A8       int8 weights, int8 activations     activation quantizer + int8 tensor-core Triton GEMM
                                              (mixgemm.ops.int8.matmul_a8)
W4A8       int4 weights, int8 activations     same; K must be a multiple of 64 (group 32) or 128,
                                              other layers run the float64 reference (a warning)
=========  =================================  ====================================================

On the CPU the A16 formats run PyTorch's own int4 / int8 CPU kernels on bfloat16 activations and a blockwise
dequantized float32 GEMM otherwise (mixgemm.kernels.cpu); the A8 ones run the reference (quantize_activation +
block_int_gemm in float64). ``group_size`` is 32, 64, 128, 256 or -1
(per-channel), or 16 for W8A16 (the groups GGUF's Q6_K / Q3_K / Q2_K load into; the Triton GEMM runs them on a
GPU); ``mode`` is "sym", "zero_point" or "offset" (mixgemm.formats.weight). The activation formats quantize each
token per block of the weight's group size (``act_mode`` "sym" or "asym"), or with
``act_block="token"`` once per token over the whole row (e.g. ``W4A8(act_block="token")``: int4 group-128 weights
with per-token int8 activations, torchao's "8da4w"). With per-token activations W4A8 quantizes the weights with
integer group scales by default (``int_scales``: mixgemm.formats.int_scales, each group scale an integer multiple
1..16 of a per-channel step, as QServe's W4A8; as accurate as max-abs scales), which the int8 GEMM runs without a
per-group fold: ~1.9x fp16 cuBLAS in prefill on an H100 against ~1.5x (``int_scales=False``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from mixgemm._checks import ACT_DTYPES
from mixgemm.formats.activation import act_block_size, check_act
from mixgemm.formats.int_scales import quantize_weight_int_scales
from mixgemm.formats.weight import NARROW_GROUP, QuantConfig, QuantizedWeight, quantize_weight
from mixgemm.nn.conv import QuantConv2d
from mixgemm.nn.experts import experts_shape, holds_fused_experts, quantize_experts_, why_not_experts
from mixgemm.nn.linear import QuantLinear
from mixgemm.quantize.hqq import hqq_quantize_weight
from mixgemm.quantize.input_moments import (
    RANDOM_SEED,
    RANDOM_TOKENS_PER_LENGTH,
    input_second_moments,
    random_token_batches,
)
from mixgemm.quantize.sequential import calibration_batches

METHODS = ("rtn", "hqq", "gptq")
HQQ_WEIGHTINGS = ("inputs", "none")


@dataclass(frozen=True)
class _Precision:
    """``method``: how the codes are chosen: "rtn" (round to nearest, default), "hqq" (half-quadratic optimization of
    each group's parameters, no data: mixgemm.quantize.hqq) or "gptq" (quantize_'s ``calibration`` data, layer by
    layer: mixgemm.quantize.gptq); all three write the same format. ``act_order`` (GPTQ only): columns taken in
    decreasing Hessian diagonal, stored with the layer's input permutation (weight-only configs). ``hqq_weighting``
    (HQQ only): "inputs" (default) weighs each input channel's error by its mean squared activation, measured by
    quantize_ on random tokens (or on ``calibration`` when given: mixgemm.quantize.input_moments); "none" minimizes
    the weight's own error, as published."""

    group_size: int = 128
    mode: str = "sym"
    scale_dtype: torch.dtype = torch.float16
    method: str = field(default="rtn", kw_only=True)
    act_order: bool = field(default=False, kw_only=True)
    hqq_weighting: str = field(default="inputs", kw_only=True)
    bits = 4
    act_mode = None
    act_block = "group"

    def weight_config(self) -> QuantConfig:
        return QuantConfig(bits=self.bits, group_size=self.group_size, mode=self.mode, scale_dtype=self.scale_dtype)

    @property
    def name(self) -> str:
        """Short label, e.g. "W4A16 g128 sym" or "W8A8 per-channel sym, act sym"."""
        g = "per-channel" if self.group_size in (-1, None) else f"g{self.group_size}"
        act = "" if self.act_mode is None else f", act {self.act_mode}" + (" per token" if self.act_block == "token"
                                                                             else "")
        how = "" if self.method == "rtn" else f", {self.method}" + (" act-order" if self.act_order else "")
        return f"{type(self).__name__} {g} {self.mode}{act}{how}"

    @property
    def activation_quantized(self) -> bool:
        return self.act_mode is not None

    def __post_init__(self):
        self.weight_config()  # validate early
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.hqq_weighting not in HQQ_WEIGHTINGS:
            raise ValueError(f"hqq_weighting must be one of {HQQ_WEIGHTINGS}, got {self.hqq_weighting!r}")
        if not isinstance(self.act_order, bool):
            raise TypeError(f"act_order must be a bool, got {type(self.act_order).__name__}")
        if self.act_order and self.method != "gptq":
            raise ValueError(f"act_order=True orders GPTQ's columns: it needs method='gptq', got {self.method!r}")
        if self.act_order and self.act_mode is not None:
            raise ValueError(f"{type(self).__name__} cannot hold act_order=True: input permutations run in "
                             "weight-only layers (W4A16 / W8A16)")


@dataclass(frozen=True)
class W4A16(_Precision):
    """int4 weights (default group 128, symmetric), fp16/bf16/fp32 activations. Kernel-backed on CUDA."""

    group_size: int = 128
    bits = 4


@dataclass(frozen=True)
class W8A16(_Precision):
    """int8 weights (default per-channel, symmetric), fp activations. Kernel-backed on CUDA."""

    group_size: int = -1
    bits = 8


@dataclass(frozen=True)
class W8A8(_Precision):
    """int8 weights (default per-channel) and int8 activations per token (per weight group). Int8 tensor-core
    kernels on CUDA; the float64 reference on the CPU."""

    group_size: int = -1
    act_mode: str = "sym"
    act_block: str = "group"
    bits = 8

    def __post_init__(self):
        super().__post_init__()
        check_act(self.act_mode, self.act_block)
        if self.group_size == NARROW_GROUP:
            raise ValueError(f"W8A8 cannot hold group_size={NARROW_GROUP}: groups of {NARROW_GROUP} are for "
                             "weight-only 8-bit layers (W8A16); the int8-activation kernels take groups of 32 or more")


@dataclass(frozen=True)
class W4A8(_Precision):
    """int4 weights (default group 128) and int8 activations per token and group (``act_block="token"``: per
    token). Int8 tensor-core kernels on CUDA (K a multiple of 64 / 128, else the reference); the float64
    reference on the CPU."""

    group_size: int = 128
    act_mode: str = "sym"
    act_block: str = "group"
    # integer group scales (mixgemm.formats.int_scales; sym groups only). None: with act_block "token" (where the
    # int8 GEMM then runs without a per-group fold) and sym groups
    int_scales: bool | None = None
    bits = 4

    def __post_init__(self):
        super().__post_init__()
        check_act(self.act_mode, self.act_block)
        if self.int_scales and (self.mode != "sym" or self.group_size in (-1, None)):
            raise ValueError(f"W4A8(int_scales=True) takes mode 'sym' with groups, got mode={self.mode!r} "
                             f"group_size={self.group_size}")
        if self.int_scales and self.method != "rtn":
            raise ValueError(f"W4A8(int_scales=True) cannot hold method={self.method!r}: integer group scales are "
                             "chosen by their own rule (mixgemm.formats.int_scales); use int_scales=False")

    @property
    def uses_int_scales(self) -> bool:
        if self.int_scales is not None:
            return self.int_scales
        return (self.act_block == "token" and self.mode == "sym" and self.group_size not in (-1, None)
                and self.method == "rtn")

    @property
    def name(self) -> str:
        return super().name + (", int scales" if self.uses_int_scales else "")


@dataclass
class QuantizeReport:
    """What quantize_ did: ``replaced`` (names), ``skipped`` ({name: why}), ``excluded`` (filter_fn said no),
    ``hqq_inputs`` (method "hqq": where its input weighting came from, or why it had none), ``norm_kernels`` (the
    norms computed by mixgemm's norm kernel on CUDA: those feeding only the new layers, eager and compiled, and the
    model's other RMSNorms in eager mode: mixgemm.nn.norms.norm_kernels), ``sibling_groups`` (the new layers reading
    one tensor, which compiled one-row calls run as one launch: mixgemm.nn.siblings.join_siblings),
    ``experts_joined`` (the experts modules whose decoding runs routed, their layouts joined now:
    mixgemm.nn.experts.join_experts)."""

    config: object
    replaced: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    excluded: list[str] = field(default_factory=list)
    norm_kernels: list[str] = field(default_factory=list)
    sibling_groups: list[list[str]] = field(default_factory=list)
    experts_joined: list[str] = field(default_factory=list)
    rounded: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    hqq_inputs: str = ""

    def __str__(self) -> str:
        lines = [f"quantize_ {self.config}: {len(self.replaced)} replaced, {len(self.skipped)} skipped, "
                 f"{len(self.excluded)} excluded by filter_fn"]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped.items()]
        lines += [f"  rounded to nearest {name}: {why}" for name, why in self.rounded.items()]
        if self.hqq_inputs:
            lines.append(f"  HQQ's input weighting: {self.hqq_inputs}")
        return "\n".join(lines)


# A layer computes in its weight's dtype; mixgemm's layers take fp16 / bf16 / fp32 activations only, so a float64
# layer, once replaced, would reject the inputs the model feeds it.
_FLOAT_DTYPE_REASON = ("weight dtype {dtype}: mixgemm layers take float16 / bfloat16 / float32 activations; "
                       "convert the model (e.g. model.float()) before quantize_")


def _why_not(linear: nn.Linear, cfg: QuantConfig, tied: set[int], act_mode: str | None) -> str | None:
    return _why_not_weight(linear.weight, linear.in_features, cfg, tied, act_mode)


def _why_not_weight(w: torch.Tensor, in_features: int, cfg: QuantConfig, tied: set[int],
                    act_mode: str | None = None) -> str | None:
    """Why a float weight with ``in_features`` columns cannot be quantized in ``cfg`` (with int8 activations in
    ``act_mode``, or weight-only for None), or None."""
    if id(w) in tied:
        return "weight is shared (tied) with another module; quantizing it would untie it"
    if w.device.type == "meta":
        return "weight is on the meta device (no values)"
    if not w.is_floating_point():
        return f"weight dtype {w.dtype} is not floating point"
    if w.dtype not in ACT_DTYPES:
        return _FLOAT_DTYPE_REASON.format(dtype=w.dtype)
    try:
        cfg.groups(in_features)
        if act_mode is not None:
            act_block_size(in_features, cfg.group_size, "group")
    except ValueError as e:
        return str(e)
    return None


def _why_not_conv(mod: nn.Conv2d, config: _Precision, tied: set) -> str | None:
    """Why a Conv2d cannot be quantized with this config, or None. (QuantConv2d.from_conv adapts the group
    size to Ci/groups, with a warning.)"""
    if config.act_mode is not None:
        return "no activation-quantized convolution yet: use a weight-only config (W4A16 / W8A16) for convs"
    if id(mod.weight) in tied:
        return "the weight is shared with another module (tied)"
    if mod.weight.device.type == "meta" or not mod.weight.is_floating_point():
        return f"weight is {mod.weight.dtype} on {mod.weight.device}: needs real floating-point values"
    if mod.weight.dtype not in ACT_DTYPES:
        return _FLOAT_DTYPE_REASON.format(dtype=mod.weight.dtype)
    return None


def _is_sharded(linear: nn.Module) -> bool:
    """True when the Linear's weight is a DTensor (a tensor-parallel shard)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(linear.weight, DTensor)


def quantize_(model: nn.Module, config: _Precision,
              filter_fn: Callable[[nn.Module, str], bool] | None = None, compact: bool = True,
              calibration=None, progress: bool = True) -> QuantizeReport:
    """Replace, in place, every nn.Linear of ``model`` (for which ``filter_fn(module, name)`` is True, when
    given) by a QuantLinear in ``config``'s format (W4A16 / W8A16 / W8A8 / W4A8), quantized on the layer's
    device, every nn.Conv2d by a QuantConv2d (weight-only configs; blocks along Ci within each tap), and the
    experts of transformers' fused mixture-of-experts modules (Mixtral, Qwen-MoE, DeepSeek, GPT-OSS, ...: 3-D
    expert weights, which are not Linears) by one QuantLinear per expert and projection (mixgemm.nn.experts;
    ``filter_fn`` sees the experts module, the report lists ``<experts>.gate_up_proj.<e>`` ...).
    Layers it cannot handle (K not divisible by the group size, tied weights,
    meta / non-float / float64 / non-finite weights) are left as they are and listed in the returned report.
    A Linear already sharded by mixgemm.distributed (tensor parallel, its weight a DTensor) is quantized from its
    full weight and sharded the same way, so quantizing before or after sharding gives the same model (call it on
    every rank, as the sharding itself).

    compact (default True): each QuantLinear keeps its codes in one resident layout wherever it is on an sm_90 GPU
    (QuantLinear.auto_compact: now, and when the model is moved there later), so a model that decodes and prefills
    holds its weights once, about 1.0-1.06x their packed size, instead of once per kernel family (two to three
    times). ``state_dict()`` still writes the plain format. compact=False keeps the plain codes and builds each
    kernel's layout beside them as calls need it: the fastest kernel per M at up to three times the memory
    (docs/architecture.md, Models, says where that is faster).

    ``config.method`` chooses the codes (the same format either way): "rtn" rounds to nearest, "hqq" optimizes each
    group's parameters without data (mixgemm.quantize.hqq), each input channel's error weighed by its mean square
    over random tokens run through the float model (over ``calibration`` when given; ``report.hqq_inputs`` says
    which, or why none), "gptq" runs GPTQ block by block over ``calibration``
    (an iterable of token-id batches: tensors [B, T], lists, or tokenizer outputs; mixgemm.quantize.sequential), with
    a tqdm bar unless ``progress=False``. Convolutions (and, under "gptq", fused experts) are rounded to nearest and
    listed in ``report.rounded``.
    """
    if not isinstance(config, _Precision):
        raise TypeError(f"config must be W4A16, W8A16, W8A8 or W4A8, got {type(config).__name__}")
    cfg = config.weight_config()
    batches = None
    if config.method == "gptq" or (calibration is not None and config.method == "hqq"):
        device = next(iter(model.parameters()), torch.empty(0)).device
        batches = calibration_batches(calibration, device)
    elif calibration is not None:
        raise ValueError(f"calibration is read by method='gptq' and 'hqq'; this config has method={config.method!r}")
    if calibration is not None and config.method == "hqq" and config.hqq_weighting == "none":
        raise ValueError("calibration weighs HQQ's inputs, which hqq_weighting='none' turns off: drop one of them")
    report = QuantizeReport(config=config)
    importance: dict[str, torch.Tensor] = {}
    if config.method == "hqq":
        importance, report.hqq_inputs = _hqq_importance(model, config, batches)
        batches = None  # read: HQQ quantizes layer by layer below
    gptq_names: list[str] = []
    counts: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    tied = {i for i, c in counts.items() if c > 1}
    targets = [(name, mod) for name, mod in model.named_modules()
               if (isinstance(mod, nn.Linear) and not isinstance(mod, QuantLinear)) or type(mod) is nn.Conv2d]
    for name, mod in targets:
        if name == "":
            report.skipped["<model>"] = "the model itself is a single layer: use QuantLinear / QuantConv2d directly"
            continue
        if filter_fn is not None and not filter_fn(mod, name):
            report.excluded.append(name)
            continue
        conv = type(mod) is nn.Conv2d
        reshard = None
        if not conv and _is_sharded(mod):  # tensor-parallel: quantize the full weight, then shard it the same way
            from mixgemm.distributed.styles import sharded_linear_source

            mod, reshard = sharded_linear_source(mod, name)
        why = _why_not_conv(mod, config, tied) if conv else _why_not(mod, cfg, tied, config.act_mode)
        if why is None and batches is not None and reshard is not None:
            why = "a tensor-parallel shard: GPTQ runs on whole layers; quantize_ before sharding"
        if why is not None:
            report.skipped[name] = why
            continue
        if batches is not None and not conv:
            gptq_names.append(name)  # quantized below, block by block over the calibration data
            continue
        if conv and config.method != "rtn":
            report.rounded[name] = f"method {config.method!r} applies to Linear layers; convolutions round to nearest"
        try:
            q = QuantConv2d.from_conv(mod, cfg) if conv else quantize_linear(mod, config, importance.get(name))
        except ValueError as e:  # quantize_weight's input checks: NaN / Inf weights, scales out of range
            report.skipped[name] = str(e)
            continue
        q.train(mod.training)
        if reshard is not None:
            q = reshard(q)
        if isinstance(q, QuantLinear):
            q.set_auto_compact(compact)  # (layer by layer: the plain codes go before the next layer is quantized)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, q)
        report.replaced.append(name)
    if gptq_names:
        _gptq_(model, config, gptq_names, batches, compact, progress, report)
    experts_config = config
    if batches is not None:
        experts_config = replace(config, method="rtn", act_order=False)
        for name, mod in model.named_modules():
            if name and holds_fused_experts(mod):
                report.rounded[name] = "GPTQ runs on Linear layers; fused experts round to nearest"
    quantize_experts(model, experts_config, filter_fn, tied, compact, report.replaced, report.skipped,
                     report.excluded)
    if report.replaced:
        from mixgemm.checkpoints.native import attach_quantization_config
        from mixgemm.nn.experts import join_experts
        from mixgemm.nn.norms import norm_kernels
        from mixgemm.nn.siblings import join_siblings

        attach_quantization_config(model)  # transformers models: save_pretrained records every layer's format
        report.norm_kernels = norm_kernels(model)
        report.sibling_groups = join_siblings(model)
        report.experts_joined = join_experts(model)
    return report


def _gptq_(model: nn.Module, config: _Precision, names: list[str], batches: list, compact: bool, progress: bool,
           report: QuantizeReport) -> None:
    """quantize_'s GPTQ: the selected float Linears ``names``, block by block over the calibration ``batches``;
    Linears no batch reached are rounded to nearest. Act-order layers are arranged as from_pretrained arranges
    them (mixgemm.nn.norms.arrange_act_order) before any compaction."""
    from mixgemm.quantize.gptq import GPTQParams
    from mixgemm.quantize.sequential import gptq_quantize_model

    def make(qw, bias, perm):
        return QuantLinear.from_quantized(qw, bias, act_mode=config.act_mode, act_block=config.act_block,
                                          input_perm=perm)

    run = gptq_quantize_model(model, names, config.weight_config(), batches, GPTQParams(act_order=config.act_order),
                              make, progress)
    report.seconds = run.seconds
    rtn = replace(config, method="rtn", act_order=False)
    for name in run.unreached:
        lin = model.get_submodule(name)
        parent, _, child = name.rpartition(".")
        q = quantize_linear(lin, rtn)
        q.train(lin.training)
        setattr(model.get_submodule(parent), child, q)
        report.rounded[name] = "no calibration input reached this layer"
    if config.act_order:
        from mixgemm.nn.norms import arrange_act_order

        arrange_act_order(model)
    for name in names:
        model.get_submodule(name).set_auto_compact(compact)
        report.replaced.append(name)


def quantize_experts(model: nn.Module, config: _Precision, filter_fn, tied: set, compact: bool,
                     replaced: list, skipped: dict, excluded: list) -> None:
    """quantize_ for transformers' fused experts modules (mixgemm.nn.experts): each expert's projections become
    QuantLinear layers of ``config``'s format, added to ``replaced`` by their names (``<experts>.gate_up_proj.<e>``);
    modules left float go to ``skipped`` (name: why) or ``excluded`` (filter_fn said no)."""
    targets = [(name, mod) for name, mod in model.named_modules() if name and holds_fused_experts(mod)]
    for name, mod in targets:
        quantize_experts_module(name, mod, config, filter_fn, tied, compact, replaced, skipped, excluded)


def quantize_experts_module(name: str, mod: nn.Module, config: _Precision, filter_fn, tied: set, compact: bool,
                            replaced: list, skipped: dict, excluded: list) -> None:
    """quantize_experts for the one fused experts module ``mod`` called ``name`` (the loaders quantize each module as
    soon as its weights are read)."""
    if filter_fn is not None and not filter_fn(mod, name):
        excluded.append(name)
        return
    cfg = config.weight_config()
    shape = experts_shape(mod)
    why = shape if isinstance(shape, str) else why_not_experts(
        mod, shape, lambda w, k: _why_not_weight(w, k, cfg, tied, config.act_mode))
    if why is None:
        try:
            quantize_experts_(mod, shape, lambda w, b: quantize_weight_tensor(w, b, config))
        except ValueError as e:  # quantize_weight's input checks on one expert: the module stays float
            why = str(e)
    if why is not None:
        skipped[name] = why
        return
    for proj in shape.names:
        for e, q in enumerate(getattr(mod, proj)):
            q.train(mod.training)
            q.set_auto_compact(compact)
            replaced.append(f"{name}.{proj}.{e}")


def quantize_weight_tensor(weight: torch.Tensor, bias: torch.Tensor | None, config: _Precision,
                           importance: torch.Tensor | None = None) -> QuantLinear:
    """A QuantLinear in ``config``'s format of a float weight [out, in] (and bias); neither is modified.
    ``importance``: HQQ's input weighting (scheme_weight)."""
    return QuantLinear.from_quantized(scheme_weight(weight, config, importance), bias, act_mode=config.act_mode,
                                      act_block=config.act_block)


def scheme_weight(weight: torch.Tensor, config: _Precision, importance: torch.Tensor | None = None
                  ) -> QuantizedWeight:
    """``weight`` [N, K] quantized in ``config``'s format: integer group scales where the config uses them, else
    quantize_weight with its weight_config (method "hqq": HQQ, its error weighted by ``importance`` [K], the mean
    squared input of each channel, when given). The weight is not modified."""
    cfg = config.weight_config()
    if getattr(config, "uses_int_scales", False):
        return quantize_weight_int_scales(weight, cfg.group_size, cfg.scale_dtype)
    if config.method == "hqq":
        return hqq_quantize_weight(weight, cfg, importance=importance)
    if config.method == "gptq":
        raise ValueError("method='gptq' needs calibration data: quantize the float model with "
                         "mixgemm.quantize_(model, config, calibration=batches)")
    return quantize_weight(weight, cfg)


def quantize_linear(linear: nn.Linear, config: _Precision, importance: torch.Tensor | None = None) -> QuantLinear:
    """One nn.Linear as a QuantLinear in ``config``'s format (integer group scales where the config uses them),
    quantized on the layer's device; the nn.Linear is not modified. ValueError from quantize_weight's checks.
    ``importance``: HQQ's input weighting (scheme_weight)."""
    return quantize_weight_tensor(linear.weight.detach(), None if linear.bias is None else linear.bias.detach(),
                                  config, importance)


def _hqq_importance(model: nn.Module, config: _Precision, batches: list | None) -> tuple[dict[str, torch.Tensor], str]:
    """HQQ's input weighting for quantize_: {Linear name: E[x_k^2]} of the model's float Linears over ``batches``
    (calibration) or random tokens, and what it came from (or why there is none). Tensor-parallel shards get none:
    their inputs on one rank are part of what the whole weight reads."""
    if config.hqq_weighting == "none":
        return {}, "none (hqq_weighting='none')"
    linears = {name: mod for name, mod in model.named_modules()
               if name and type(mod) is nn.Linear and not _is_sharded(mod)}
    if not linears:
        return {}, "none (no float Linear to weigh)"
    if batches is not None:
        groups, source = [batches], f"calibration ({len(batches)} batches)"
    else:
        groups, why = random_token_batches(model)
        if not groups:
            return {}, f"none ({why})"
        lengths = ", ".join(str(g[0]["input_ids"].shape[1]) for g in groups)
        source = f"random tokens (seed {RANDOM_SEED}, {RANDOM_TOKENS_PER_LENGTH} at each context length of {lengths})"
    try:
        moments = input_second_moments(model, linears, groups)
    except (TypeError, ValueError, RuntimeError, IndexError) as e:  # a model random ids cannot drive
        return {}, f"none (the model did not run on them: {type(e).__name__}: {str(e)[:200]})"
    missing = len(linears) - len(moments)
    return moments, source + (f"; {missing} Linears no input reached are unweighted" if missing else "")


__all__ = ["W4A8", "W4A16", "W8A8", "W8A16", "QuantizeReport", "quantize_", "quantize_linear", "quantize_weight_tensor"]


@dataclass
class CompactReport:
    """What mixgemm.compact_ did: the layers now holding one layout, and the ones left as they were with why."""

    compacted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def auto_compact_(model: nn.Module, compact: bool = True) -> None:
    """Set every QuantLinear's auto_compact to ``compact`` and compact the ones it applies to now (quantize_'s and
    from_pretrained's ``compact`` argument)."""
    for mod in model.modules():
        if isinstance(mod, QuantLinear):
            mod.set_auto_compact(compact)


def compact_(model: nn.Module) -> CompactReport:
    """Keep each QuantLinear of ``model`` in one resident layout (QuantLinear.compact_: the codes only in the layout
    its Hopper kernels read, the plain copy released; ``state_dict()`` still writes the plain format), now and on any
    device (quantize_ / from_pretrained already do it on sm_90 GPUs unless given compact=False). Layers that
    cannot (QuantLinear.compact_reason: an asym int8-activation layer, a format the int8 layout does not hold) keep
    their buffers and are listed with the reason."""
    report = CompactReport()
    for name, mod in model.named_modules():
        if not isinstance(mod, QuantLinear) or mod.compact is not None:
            continue
        why = mod.compact_reason()
        if why is None:
            mod.compact_()
            report.compacted.append(name)
        else:
            report.skipped[name] = why
    from mixgemm.nn.experts import join_experts

    join_experts(model)  # (experts compacted now: their routed decoding's layouts joined before any capture)
    return report
