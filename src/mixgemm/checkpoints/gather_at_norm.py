"""Act-order layers that share one input permutation take it from the norm that feeds them, once.

GPTQ's act-order permutation of a layer sorts its input features by the Hessian of that layer's inputs, so layers
that read the same tensor (q / k / v after the attention norm, gate / up after the MLP norm) get the same
permutation. Their GEMVs each gather x through it in every thread block before the first weight tile (1.2-1.3x a
plain decode GEMV's time at M = 1). When a norm's output reaches only such layers, the norm can hand them
``norm(x)[..., perm]`` instead: a forward hook on the norm gathers once, and the layers skip their own gather
(``QuantLinear.input_gathered_by`` names the norm) and run the plain kernels on the same numbers, bit for bit.

Under torch.compile only: there the hook gathers through ``torch.ops.mixgemm.gather_columns`` (mixgemm's PDL
gather kernel at decode sizes; an op inductor cannot fuse into the norm, whose fused kernel reloaded its inputs at
the gathered positions), one launch for the layers it feeds instead of a gather in each of them (H100, W4 g128
act-order, compiled with CUDA graphs, tools.checks.actorder_model: with down folded and the norms gathering,
Llama-3-8B shapes 0.96x and Qwen2-7B shapes 0.98x the plain model's tokens/s; down folded alone 0.92x). In eager
mode the hook leaves the output alone and the layers gather in their kernels (``QuantLinear.gathers_input``): eager
decoding is host-bound, and a hook plus a launch per norm would be host time. mixgemm.from_pretrained applies it
(``arrange_act_order``).

Which layers a norm feeds is read from the forward sources (``ast``), not from module names: in the parent's
forward, ``v = self.<norm>(...)`` must be used exactly once before ``v`` is reassigned, as an argument of a call to
a child ``self.<block>(...)``; in the block's forward, that parameter must be used only as the sole argument of
calls ``self.<layer>(p)`` (and for ``p.shape``), never reassigned, and each such layer read nowhere else in the
block's class (nor the norm in the parent's). Every such layer must be an act-order QuantLinear with the same
permutation, held by no other module (nor the norm).
Anything else (another use of the tensor, a branch, a layer without the permutation) leaves the model as it was. The
permutation stays in each layer's state dict and the hook is not saved: ``save_pretrained`` writes the same
checkpoint as without it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from dataclasses import dataclass

import torch
from torch import nn

from mixgemm.nn.linear import QuantLinear
from mixgemm.ops.dispatch import kernel_perm

PERM_BUFFER = "mixgemm_output_perm"


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


def _gather_output(module: nn.Module, args, output: torch.Tensor) -> torch.Tensor | None:
    perm = module._buffers[PERM_BUFFER]
    if not torch.compiler.is_compiling():  # eager: the layers gather x in their kernels (QuantLinear.gathers_input)
        if output.is_cuda:  # the gather kernel's copy of the permutation, made here outside any CUDA graph's pool
            kernel_perm(perm)
        return None
    return torch.ops.mixgemm.gather_columns(output, perm)


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


def gather_act_order_at_norms(model: nn.Module) -> list[str]:
    """Move the shared input permutation of act-order QuantLinears into a forward hook on the norm that feeds them
    (module docstring). Returns the names of the layers that no longer gather; the model computes the same
    outputs. Running it again changes nothing."""
    changed = []
    seen: dict[int, int] = {}
    for _, module in model.named_modules(remove_duplicate=False):
        seen[id(module)] = seen.get(id(module), 0) + 1
    for pname, parent in model.named_modules():
        fn = _forward_def(parent) if any(True for _ in parent.children()) else None
        if fn is None:
            continue
        for feed in norm_feeds(fn):
            norm = getattr(parent, feed.norm, None)
            if not isinstance(norm, nn.Module) or isinstance(norm, QuantLinear) or PERM_BUFFER in norm._buffers:
                continue
            if seen[id(norm)] != 1 or _self_references(type(parent), feed.norm) != 1:
                continue  # a norm run elsewhere too (another call, another parent) would gather those outputs as well
            consumers = _consumers(parent, feed)
            if not consumers or any(seen[id(layer)] != 1 for _, layer in consumers):
                continue  # (a layer shared by two parents sees other inputs too)
            perms = [layer.input_perm for _, layer in consumers]
            if perms[0] is None or any(p is None or p.device != perms[0].device or not torch.equal(p, perms[0])
                                       for p in perms) or any(layer.input_gathered_by for _, layer in consumers):
                continue
            prefix = f"{pname}." if pname else ""
            norm.register_buffer(PERM_BUFFER, perms[0].clone(), persistent=False)
            if perms[0].is_cuda:  # the gather kernel's copy, made now rather than inside a CUDA graph's memory pool
                kernel_perm(norm._buffers[PERM_BUFFER])
            norm.register_forward_hook(_gather_output)
            for name, layer in consumers:
                layer.input_gathered_by = prefix + feed.norm
                changed.append(prefix + name)
    return changed


def arrange_act_order(model: nn.Module) -> tuple[list[str], list[str]]:
    """What mixgemm.from_pretrained (and the transformers quantizer) do to a model's act-order layers, both exact:
    fold gated MLPs' down permutations into gate / up (mixgemm.checkpoints.fold_perm), then let the norms feed the
    layers that share their output gathered under torch.compile. Returns (folded down projections, layers fed
    gathered by a norm)."""
    from mixgemm.checkpoints.fold_perm import fold_mlp_input_perms

    return fold_mlp_input_perms(model), gather_act_order_at_norms(model)
