"""The norms that feed mixgemm layers: under torch.compile mixgemm computes them, and hands act-order layers that
share one input permutation their input gathered once.

* Act-order. GPTQ's act-order permutation of a layer sorts its input features by the Hessian of that layer's inputs,
  so layers that read the same tensor (q / k / v after the attention norm, gate / up after the MLP norm) get the same
  permutation. Their GEMVs each gather x through it in every thread block before the first weight tile (1.2-1.3x a
  plain decode GEMV's time at M = 1). When a norm's output reaches only such layers, the norm can hand them
  ``norm(x)[..., perm]`` instead (gather_act_order_at_norms): the layers skip their own gather
  (``QuantLinear.input_gathered_by`` names the norm) and run the plain kernels.
* mixgemm's norm kernel (``torch.ops.mixgemm.rms_norm``, kernels/cuda/rms_norm.cu). A norm that computes
  transformers' RMSNorm (checked on a random row: rms_norm_eps) is computed by it on CUDA in its input's dtype,
  gathered for act-order layers or not (norm_kernels_at_norms for the norms of plain layers): launched with
  programmatic dependent launch, so the GEMV after it is resident with its weight loads in flight while the norm
  runs, and with the residual add before it moved in by the inductor pass mixgemm.ops.fuse_norm_add. Elsewhere the
  compiler keeps the model's norm (act-order norms gather through the op's torch composite). A norm of another
  formula (Gemma's 1 + weight) keeps its own output, gathered after it by ``torch.ops.mixgemm.gather_columns`` for
  act-order layers. H100, W4 g128, batch 1, compiled with CUDA graphs (tools.checks.actorder_model): act-order
  models as loaded run at the plain model's tokens/s (see docs/architecture.md for the figures).

Under torch.compile both happen in a forward hook on the norm (``torch.compiler.is_compiling()``, also in
``QuantLinear.gathers_input()``). In eager mode the norm's forward itself is mixgemm's kernel on CUDA
(``EagerNormForward``, an instance-level forward): eager decoding is host-bound, and transformers' RMSNorm is eight
launches (cast, pow, mean, add, rsqrt, mul, cast, mul) where the kernel is one. Its output is not gathered there (a
gather launch would be host time; act-order layers gather in their kernels). For the same reason every other RMSNorm
of the model (the final norm, per-head q / k norms, Gemma's norms of weight 1 + w) gets that eager forward too, without
the hook (eager_norm_kernels), and a norm keeps the launch of its last call for the next one of that shape (KeptNorm).
quantize_, mixgemm.from_pretrained and the transformers quantizer apply it (norm_kernels; ``arrange_act_order``);
use_inductor_norms undoes the norm kernel.

Which layers a norm feeds is read from the forward sources (``ast``), not from module names: in the parent's
forward, ``v = self.<norm>(...)`` must be used exactly once before ``v`` is reassigned, as an argument of a call to
a child ``self.<block>(...)``; in the block's forward, that parameter must be used only as the sole argument of
calls ``self.<layer>(p)`` (and for ``p.shape``), never reassigned, and each such layer read nowhere else in the
block's class (nor the norm in the parent's). Every such layer must be a QuantLinear held by no other module (nor the
norm); for the act-order gather, all with the same permutation. Anything else (another use of the tensor, a branch,
layers with and without the permutation) leaves the model as it was. The permutation stays in each layer's state dict
and the hook is not saved: ``save_pretrained`` writes the same checkpoint as without it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch._C import _len_torch_dispatch_stack as _dispatch_modes
from torch.utils._python_dispatch import _get_current_dispatch_mode

from mixgemm.kernels.options import default_options_active
from mixgemm.nn.linear import QuantLinear
from mixgemm.ops.dispatch import flat_rows, kernel_perm
from mixgemm.ops.kept_launches import version_of

PERM_BUFFER = "mixgemm_output_perm"
RMS_EPS_ATTR = "mixgemm_rms_eps"  # set on a norm that mixgemm's norm kernel computes (eager and compiled, on CUDA)
HOOK_ATTR = "_mixgemm_norm_hook"  # True on a norm that has the forward hook (installed once)
# (eps, unit) on a norm that mixgemm's norm kernel computes in eager mode only (eager_norm_kernels: a norm feeding
# something other than mixgemm layers; unit: Gemma's formula, 1 + weight)
EAGER_NORM_ATTR = "mixgemm_eager_norm"


@dataclass(frozen=True)
class NormFeed:
    """In a parent's forward: the output of child ``norm`` goes only into child ``block``'s forward parameter
    ``param``."""

    norm: str
    block: str
    param: str


def _forward_def(module: nn.Module) -> ast.FunctionDef | None:
    if "forward" in vars(module):  # an instance-level forward (e.g. a wrapping hook library): not the class's source
        return None
    return _class_forward_def(type(module))


@functools.lru_cache(maxsize=256)
def _class_forward_def(cls: type) -> ast.FunctionDef | None:
    """The parsed ``forward`` of a module class (once per class: a model repeats its decoder layer class)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.forward)))
    except (OSError, TypeError, SyntaxError):
        return None
    fn = tree.body[0] if tree.body else None
    return fn if isinstance(fn, ast.FunctionDef) else None


def _self_call(node: ast.AST) -> str | None:
    """``name`` when node is a call ``self.name(...)``."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"):
        return node.func.attr
    return None


def _names(node: ast.AST, name: str, ctx: type) -> list[ast.Name]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ctx)]


def _param_names(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.posonlyargs + fn.args.args]


def norm_feeds(fn: ast.FunctionDef) -> list[NormFeed]:
    """The (norm, block, param) triples of a parent forward (module docstring)."""
    feeds = []
    body = fn.body
    for i, stmt in enumerate(body):
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        norm = _self_call(stmt.value)
        if norm is None or len(stmt.value.args) != 1 or stmt.value.keywords:
            continue
        var = stmt.targets[0].id
        uses: list[tuple[ast.stmt, ast.Name]] = []
        for later in body[i + 1:]:
            uses += [(later, n) for n in _names(later, var, ast.Load)]
            if _names(later, var, ast.Store):
                break
        if len(uses) != 1:
            continue
        later, use = uses[0]
        for call in ast.walk(later):
            block = _self_call(call)
            if block is None:
                continue
            if any(a is use for a in call.args):
                feeds.append(NormFeed(norm, block, f"#{[a is use for a in call.args].index(True)}"))
            elif any(kw.value is use and kw.arg for kw in call.keywords):
                feeds.append(NormFeed(norm, block, next(kw.arg for kw in call.keywords if kw.value is use)))
    return feeds


def param_consumers(fn: ast.FunctionDef, param: str) -> list[str] | None:
    """The children ``self.<layer>(param)`` through which a forward uses its parameter, or None when it uses it in
    any other way (``param.shape`` aside) or reassigns it."""
    if param.startswith("#"):  # positional: the index among the parameters after self
        names = _param_names(fn)[1:]
        index = int(param[1:])
        if index >= len(names):
            return None
        param = names[index]
    elif param not in _param_names(fn) + [a.arg for a in fn.args.kwonlyargs]:
        return None
    if any(_names(stmt, param, ast.Store) for stmt in fn.body):
        return None
    direct, allowed = [], set()
    for node in ast.walk(ast.Module(body=fn.body, type_ignores=[])):
        layer = _self_call(node)
        if layer is not None and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], ast.Name) \
                and node.args[0].id == param:
            direct.append(layer)
            allowed.add(id(node.args[0]))
        elif isinstance(node, ast.Attribute) and node.attr == "shape" and isinstance(node.value, ast.Name) \
                and node.value.id == param:
            allowed.add(id(node.value))
    uses = _names(ast.Module(body=fn.body, type_ignores=[]), param, ast.Load)
    if not direct or any(id(n) not in allowed for n in uses):
        return None
    return sorted(set(direct))


def _norm_hook(module: nn.Module, args, output: torch.Tensor) -> torch.Tensor | None:
    perm = module._buffers.get(PERM_BUFFER)
    if not torch.compiler.is_compiling():  # eager: the norm's own output (act-order layers gather x in their kernels)
        if perm is not None and output.is_cuda:  # the gather kernel's permutation, made outside any CUDA graph's pool
            kernel_perm(perm)
        return None
    eps = getattr(module, RMS_EPS_ATTR, None)
    x = args[0] if len(args) == 1 and isinstance(args[0], torch.Tensor) else None
    weight = module._parameters.get("weight")
    # the op where its CUDA kernel runs (a norm in x's dtype; on other devices only to gather, where it saves a pass)
    if eps is not None and x is not None and weight is not None and weight.device == x.device \
            and weight.dtype == x.dtype and (x.is_cuda or perm is not None) \
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        # the norm computed again by mixgemm's kernel, gathered for act-order layers (the module's own output is left
        # unused: the compiler drops it), with the residual add before it where mixgemm.ops.fuse_norm_add finds one
        return torch.ops.mixgemm.rms_norm(x, weight, eps, perm)
    return None if perm is None else torch.ops.mixgemm.gather_columns(output, perm)


class EagerNormForward:
    """The instance-level forward of a norm that computes transformers' RMSNorm (RMS_EPS_ATTR set) or, in eager mode
    only, one of the formulas eager_norm_kernels finds (EAGER_NORM_ATTR): outside torch.compile, a CUDA input in the
    weight's dtype with nothing for autograd to record runs mixgemm's norm kernel (one launch, the module's output
    ungathered; a repeated input shape through the launch the norm kept, KeptNorm); anything else, and every call under
    torch.compile (where the forward hook, if any, hands the norm to the kernel), the module's class forward."""

    __slots__ = ("norm",)

    def __init__(self, norm: nn.Module):
        self.norm = norm

    def __call__(self, *args, **kwargs):
        norm = self.norm
        if len(args) == 1 and not kwargs and not torch.compiler.is_compiling():
            y = _eager_rms_norm(norm, args[0])
            if y is not None:
                return y
        return type(norm).forward(norm, *args, **kwargs)


@dataclass(frozen=True, slots=True)
class KeptNorm:
    """The norm kernel's launch an eager norm ran its last call through, for the next call of that input shape: an
    eager decode step calls each norm once with the same shape, and is bound by the host time of its calls."""

    key: tuple  # x's shape, dtype, device index
    launch: object  # mixgemm.kernels.cuda.rms_norm.NormLaunch
    weight: torch.Tensor
    weight_ptr: int
    weight_version: int

    # not carried by a deep copy or a pickle of the norm (the launch holds ctypes parameters): a copy keeps its own
    def __deepcopy__(self, memo):
        return None

    def __reduce__(self):
        return type(None), ()


KEPT_NORM_ATTR = "_mixgemm_kept_norm"


def _eager_rms_norm(norm: nn.Module, x) -> torch.Tensor | None:
    """norm(x) by mixgemm's norm kernel, or None where it does not take x (the caller runs the module's forward)."""
    kept = norm.__dict__.get(KEPT_NORM_ATTR)
    if kept is not None and type(x) is torch.Tensor and kept.key == (x.shape, x.dtype, x.get_device()):
        # what can change between two calls of one shape: the weight, x's layout, autograd, modes and options
        weight = norm._parameters.get("weight")
        if weight is kept.weight and weight.data_ptr() == kept.weight_ptr and weight._version == kept.weight_version \
                and x.is_contiguous() and x.data_ptr() % 16 == 0 and not _dispatch_modes() \
                and default_options_active() and not torch.jit.is_tracing() \
                and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
            return kept.launch.rows(x, weight)
    eps, unit = norm.__dict__.get(RMS_EPS_ATTR), False
    if eps is None:
        eps, unit = norm.__dict__.get(EAGER_NORM_ATTR, (None, False))
    weight = norm._parameters.get("weight")
    # plain tensors only, outside dispatch modes and tracers: a tensor subclass (DTensor, fake tensors) has no data
    # pointer the kernel could read, and a tracer would not see the launch
    if eps is None or type(x) is not torch.Tensor or type(weight) not in (torch.Tensor, nn.Parameter) \
            or not x.is_cuda or x.dtype != weight.dtype or weight.device != x.device \
            or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)) \
            or _get_current_dispatch_mode() is not None or torch.jit.is_tracing():
        return None
    from mixgemm.kernels.cuda.rms_norm import norm_launch, unsupported_reason

    k = x.shape[-1]
    x2d = flat_rows(x, k)[1]
    if unsupported_reason(x2d, weight, None) is not None:
        return None
    launch = norm_launch(x2d.shape[0], k, False, False, x.dtype, x.device, eps, unit)
    if x.is_contiguous() and default_options_active() and version_of(weight) >= 0:
        norm.__dict__[KEPT_NORM_ATTR] = KeptNorm((x.shape, x.dtype, x.get_device()), launch, weight,
                                                  weight.data_ptr(), weight._version)
        return launch.rows(x, weight)
    return launch(x2d, None, weight, None)[1].view(x.shape)


def _hook_norm(norm: nn.Module, eps: float | None) -> None:
    """Give ``norm`` (not hooked yet) the forward hook, with its epsilon when it computes transformers' RMSNorm
    (rms_norm_eps: mixgemm's norm kernel computes it under torch.compile, and in eager mode through EagerNormForward,
    unless the norm already has an instance-level forward of someone else's)."""
    if eps is not None:
        from mixgemm.ops import fuse_norm_add  # (imports torch._inductor: only when there is a norm for it)

        setattr(norm, RMS_EPS_ATTR, eps)
        norm.__dict__.pop(KEPT_NORM_ATTR, None)
        fuse_norm_add.install()
        if "forward" not in vars(norm):
            norm.forward = EagerNormForward(norm)
    norm.register_forward_hook(_norm_hook)
    setattr(norm, HOOK_ATTR, True)


def rms_norm_eps(norm: nn.Module, k: int, unit: bool = False) -> float | None:
    """The epsilon of ``norm`` when it computes mixgemm.reference.rms_norm with its ``weight`` [k] (transformers'
    Llama / Qwen2 / Mistral RMSNorm and their copies; with ``unit``, unit_offset_rms_norm: Gemma's), else None.
    Checked on a random row on the norm's device, not by class name: a norm with another formula (Gemma's 1 + weight
    without ``unit``, a LayerNorm) or a weight on the meta device keeps the plain gather."""
    from mixgemm.reference.norm import rms_norm, unit_offset_rms_norm

    weight = norm._parameters.get("weight")
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if not isinstance(eps, float) or not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (k,) \
            or weight.is_meta or not weight.is_floating_point():
        return None
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(2, k, generator=gen) * 2 + 1).to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        try:
            got = norm(x)
        except Exception:  # a norm that cannot take a plain [rows, K] input is not this formula
            return None
        want = (unit_offset_rms_norm if unit else rms_norm)(x, weight, eps)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
        return None
    tol = 4 * torch.finfo(want.dtype).eps
    return eps if torch.allclose(got.float(), want.float(), rtol=tol, atol=tol) else None


def _consumers(parent: nn.Module, feed: NormFeed) -> list[tuple[str, QuantLinear]] | None:
    block = getattr(parent, feed.block, None)
    if isinstance(block, QuantLinear):
        return [(feed.block, block)] if feed.param in ("#0", "x") else None
    if not isinstance(block, nn.Module):
        return None
    fn = _forward_def(block)
    layers = param_consumers(fn, feed.param) if fn is not None else None
    if not layers:
        return None
    if any(_self_references(type(block), name) != 1 for name in layers):
        return None  # a layer also called elsewhere (another input, another method) must keep its own gather
    found = [(f"{feed.block}.{name}", getattr(block, name, None)) for name in layers]
    return found if all(isinstance(layer, QuantLinear) for _, layer in found) else None


@functools.lru_cache(maxsize=1024)
def _self_references(cls: type, name: str) -> int:
    """How many times the source of cls (every method it defines) reads ``self.<name>`` (assignments aside)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return -1
    return sum(1 for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == name
               and isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Name) and n.value.id == "self")


def norm_consumers(model: nn.Module) -> Iterator[tuple[str, nn.Module, list[tuple[str, QuantLinear]]]]:
    """(name, norm, [(name, layer), ...]) for every norm whose output only those QuantLinears read (module
    docstring's rules)."""
    seen: dict[int, int] = {}
    for _, module in model.named_modules(remove_duplicate=False):
        seen[id(module)] = seen.get(id(module), 0) + 1
    for pname, parent in model.named_modules():
        fn = _forward_def(parent) if any(True for _ in parent.children()) else None
        if fn is None:
            continue
        prefix = f"{pname}." if pname else ""
        for feed in norm_feeds(fn):
            norm = getattr(parent, feed.norm, None)
            if not isinstance(norm, nn.Module) or isinstance(norm, QuantLinear):
                continue
            if seen[id(norm)] != 1 or _self_references(type(parent), feed.norm) != 1:
                continue  # a norm run elsewhere too (another call, another parent) would gather those outputs as well
            consumers = _consumers(parent, feed)
            if not consumers or any(seen[id(layer)] != 1 for _, layer in consumers):
                continue  # (a layer shared by two parents sees other inputs too)
            yield prefix + feed.norm, norm, [(prefix + name, layer) for name, layer in consumers]


def gather_act_order_at_norms(model: nn.Module) -> list[str]:
    """Move the shared input permutation of act-order QuantLinears into a forward hook on the norm that feeds them
    (module docstring). Returns the names of the layers that no longer gather; the model computes the same
    outputs. Running it again changes nothing."""
    changed = []
    for norm_name, norm, consumers in norm_consumers(model):
        perms = [layer.input_perm for _, layer in consumers]
        if PERM_BUFFER in norm._buffers or perms[0] is None or any(
                p is None or p.device != perms[0].device or not torch.equal(p, perms[0]) for p in perms) \
                or any(layer.input_gathered_by for _, layer in consumers):
            continue
        norm.register_buffer(PERM_BUFFER, perms[0].clone(), persistent=False)
        if perms[0].is_cuda:  # the gather kernel's copy, made now rather than inside a CUDA graph's memory pool
            kernel_perm(norm._buffers[PERM_BUFFER])
        if HOOK_ATTR not in vars(norm):  # (a norm that quantize_ hooked has its epsilon already)
            _hook_norm(norm, rms_norm_eps(norm, perms[0].numel()))
        for name, layer in consumers:
            layer.input_gathered_by = norm_name
            changed.append(name)
    return changed


def norm_kernels_at_norms(model: nn.Module) -> list[str]:
    """Let mixgemm's norm kernel compute, on CUDA (eager and under torch.compile), every RMSNorm whose output only
    QuantLinears without an input permutation read (act-order ones: gather_act_order_at_norms). Returns the norms'
    names; the model computes the same outputs (the same formula, its mean summed in another order on CUDA; eager on
    the CPU: untouched)."""
    done = []
    for norm_name, norm, consumers in norm_consumers(model):
        if HOOK_ATTR in vars(norm) or any(layer.input_perm is not None for _, layer in consumers):
            continue
        eps = rms_norm_eps(norm, consumers[0][1].in_features)
        if eps is not None:
            _hook_norm(norm, eps)
            done.append(norm_name)
    return done


def eager_norm_kernels(model: nn.Module) -> list[str]:
    """Let mixgemm's norm kernel compute, in eager mode on CUDA, every other RMSNorm of the model (transformers' formula
    or Gemma's, 1 + weight): the norms norm_kernels_at_norms leaves (feeding a residual add, per-head q / k norms, the
    final norm) through an instance-level forward (EagerNormForward), without the forward hook, so torch.compile traces
    their own forward. Why: an eager decode step is bound by its host time, and transformers' RMSNorm is eight
    launches (Gemma-2 has four per layer). Returns the norms' names; the model computes the same outputs (the mean
    summed in another order). A norm whose weight is not [K] of floats, or that already has an instance-level forward,
    is left alone."""
    done = []
    for name, norm in model.named_modules():
        weight = norm._parameters.get("weight") if not isinstance(norm, QuantLinear) else None
        if weight is None or weight.dim() != 1 or "forward" in vars(norm) or HOOK_ATTR in vars(norm) \
                or any(True for _ in norm.children()):
            continue
        k = weight.numel()
        for unit in (False, True):
            eps = rms_norm_eps(norm, k, unit)
            if eps is not None:
                setattr(norm, EAGER_NORM_ATTR, (eps, unit))
                norm.forward = EagerNormForward(norm)
                done.append(name)
                break
    return done


def norm_kernels(model: nn.Module) -> list[str]:
    """What quantize_, mixgemm.from_pretrained and the transformers quantizer give a model's norms:
    norm_kernels_at_norms (the norms feeding only mixgemm layers: eager and compiled), then eager_norm_kernels (the
    model's other RMSNorms: eager). Returns the norms' names."""
    return norm_kernels_at_norms(model) + eager_norm_kernels(model)


def _drop_eager_forward(norm: nn.Module) -> None:
    """The norm's class forward again in eager mode: no instance-level EagerNormForward, no kept launch."""
    norm.__dict__.pop(KEPT_NORM_ATTR, None)
    if isinstance(vars(norm).get("forward"), EagerNormForward):
        del norm.forward


def use_inductor_norms(model: nn.Module) -> list[str]:
    """Undo what norm_kernels (norm_kernels_at_norms, eager_norm_kernels) and gather_act_order_at_norms give the
    norms' computation: eager mode and torch.compile then run each norm as the model's source has it (the norms
    gathering for act-order layers gather its output with gather_columns). For A/B runs, or to rule mixgemm's norm
    kernel out. Returns the norms' names."""
    done = []
    for name, norm in model.named_modules():
        if EAGER_NORM_ATTR in vars(norm):  # (eager_norm_kernels: no hook)
            delattr(norm, EAGER_NORM_ATTR)
            _drop_eager_forward(norm)
            done.append(name)
            continue
        if getattr(norm, RMS_EPS_ATTR, None) is None:
            continue
        delattr(norm, RMS_EPS_ATTR)
        _drop_eager_forward(norm)
        if PERM_BUFFER not in norm._buffers:  # nothing left for the hook to do
            for key in [k for k, hook in norm._forward_hooks.items() if hook is _norm_hook]:
                del norm._forward_hooks[key]
            delattr(norm, HOOK_ATTR)
        done.append(name)
    return done


def arrange_act_order(model: nn.Module) -> tuple[list[str], list[str]]:
    """What mixgemm.from_pretrained (and the transformers quantizer) do to a model's act-order layers, both exact:
    fold gated MLPs' down permutations into gate / up (mixgemm.nn.fold_perm), then let the norms feed the
    layers that share their output gathered under torch.compile. Returns (folded down projections, layers fed
    gathered by a norm)."""
    from mixgemm.nn.fold_perm import fold_mlp_input_perms

    return fold_mlp_input_perms(model), gather_act_order_at_norms(model)
