"""GPTQ over a whole model, layer by layer, as the GPTQ paper runs it (quantize_'s ``method="gptq"``).

The calibration batches run once up to the first block of the model's stack of repeated blocks (the decoder layers:
the largest nn.ModuleList of modules holding Linears); that block's inputs (positional and keyword: masks, position
embeddings) are kept. Then block after block: forward hooks on its Linears accumulate each one's Hessian
H = 2 X^T X / tokens over the kept inputs, each Linear is quantized by GPTQ (mixgemm.quantize.gptq) and replaced by
its QuantLinear, and the block runs again, now quantized, to make the next block's inputs: every block is
calibrated on what the already-quantized blocks before it produce. Linears outside the stack (a BERT pooler, an
untied lm_head) get their Hessians from one more pass of the whole, by then quantized, model. Everything runs where
the model is (the GPU when it is there); the Hessians accumulate in float32.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from mixgemm.quantize.gptq import GPTQParams, gptq_quantize_weight


@dataclass
class GPTQRun:
    """What gptq_quantize_model did: ``quantized`` (Linear names), ``unreached`` (selected Linears no calibration
    input reached: left float, for the caller to round), ``seconds`` per phase ("capture", "hessians", "gptq",
    "propagate")."""

    quantized: list[str] = field(default_factory=list)
    unreached: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


class _Stop(Exception):
    """Raised by the first block's pre-hook once its inputs are kept: the rest of the model need not run."""


def calibration_batches(calibration, device) -> list[dict]:
    """The calibration set as a list of model inputs {"input_ids": int64 [B, T], ...} on ``device``: each item a
    tensor [B, T] (or [T]), a list of token ids or of equal-length lists, or a mapping with "input_ids" (a
    tokenizer's output; its "attention_mask" is kept). ValueError / TypeError naming the bad item."""
    if calibration is None:
        raise ValueError("calibration is None: method='gptq' needs calibration=an iterable of token-id batches")
    if isinstance(calibration, (torch.Tensor, str, Mapping)) or not isinstance(calibration, Iterable):
        raise TypeError(f"calibration must be an iterable of token-id batches (tensors [B, T] or lists), got "
                        f"{type(calibration).__name__}; wrap a single batch in a list")
    out = []
    for i, item in enumerate(calibration):
        extra = {}
        if isinstance(item, Mapping):
            if "input_ids" not in item:
                raise ValueError(f"calibration[{i}] is a mapping without 'input_ids'")
            if item.get("attention_mask") is not None:
                extra["attention_mask"] = torch.as_tensor(item["attention_mask"]).to(device)
            item = item["input_ids"]
        try:
            ids = torch.as_tensor(item)
        except (TypeError, ValueError) as e:
            raise TypeError(f"calibration[{i}] is not a batch of token ids (tensor [B, T] or lists): {e}") from None
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"calibration[{i}] must hold integer token ids, got dtype {ids.dtype}")
        if ids.dim() == 1:
            ids = ids[None]
        if ids.dim() != 2 or ids.numel() == 0:
            raise ValueError(f"calibration[{i}] must be token ids [B, T] with B, T >= 1, got shape {tuple(ids.shape)}")
        if extra and tuple(extra["attention_mask"].reshape(ids.shape[0], -1).shape) != tuple(ids.shape):
            raise ValueError(f"calibration[{i}]: attention_mask's shape differs from input_ids' {tuple(ids.shape)}")
        out.append({"input_ids": ids.to(device=device, dtype=torch.int64), **extra})
    if not out:
        raise ValueError("calibration is empty: method='gptq' needs at least one batch of token ids")
    return out


def block_stack(model: nn.Module) -> nn.ModuleList | None:
    """The model's stack of repeated blocks: the nn.ModuleList of two or more modules each holding a Linear with
    the most parameters, or None."""
    best, size = None, 0
    for mod in model.modules():
        if not isinstance(mod, nn.ModuleList) or len(mod) < 2:
            continue
        if not all(any(isinstance(m, nn.Linear) for m in block.modules()) for block in mod):
            continue
        n = sum(p.numel() for p in mod.parameters())
        if n > size:
            best, size = mod, n
    return best


class _Hessian:
    """H = 2 X^T X / tokens of one Linear's inputs, accumulated by a forward hook."""

    def __init__(self, k: int, device):
        self.h = torch.zeros(k, k, dtype=torch.float32, device=device)
        self.tokens = 0

    def __call__(self, mod, args, output):
        x = args[0].detach().reshape(-1, args[0].shape[-1]).to(torch.float32)
        t = x.shape[0]
        if t == 0:
            return
        self.h.mul_(self.tokens / (self.tokens + t))
        self.tokens += t
        x = x * math.sqrt(2.0 / self.tokens)
        self.h.addmm_(x.t(), x)


def run_model(model: nn.Module, batch: dict) -> None:
    try:
        model(**batch, use_cache=False)
    except TypeError as e:
        if "use_cache" not in str(e):
            raise
        model(**batch)


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class _Timer:
    def __init__(self, seconds: dict, name: str, device):
        self.seconds, self.name, self.device = seconds, name, device

    def __enter__(self):
        import time

        self._sync()
        self.t = time.perf_counter()

    def __exit__(self, *exc):
        import time

        self._sync()
        self.seconds[self.name] = self.seconds.get(self.name, 0.0) + time.perf_counter() - self.t

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _quantize_linears(model: nn.Module, names: list[str], stats: dict, make: Callable, run: GPTQRun,
                      params: GPTQParams, config) -> None:
    for name in names:
        st = stats[name]
        if st.tokens == 0:
            run.unreached.append(name)
            continue
        lin = model.get_submodule(name)
        res = gptq_quantize_weight(lin.weight.detach(), st.h, config, params)
        q = make(res.weight, None if lin.bias is None else lin.bias.detach(), res.perm)
        q.train(lin.training)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, q)
        run.quantized.append(name)
        del stats[name]


def _hooked(model: nn.Module, names: list[str]) -> tuple[dict, list]:
    stats, handles = {}, []
    for name in names:
        lin = model.get_submodule(name)
        stats[name] = _Hessian(lin.in_features, lin.weight.device)
        handles.append(lin.register_forward_hook(stats[name]))
    return stats, handles


@torch.no_grad()
def gptq_quantize_model(model: nn.Module, names: list[str], config, batches: list[dict], params: GPTQParams,
                        make: Callable, progress: bool = True) -> GPTQRun:
    """Quantize the Linears ``names`` of ``model`` (float, selected by the caller) by GPTQ in ``config`` (a
    mixgemm.formats.weight.QuantConfig), block by block (module docstring), each replaced in place by
    ``make(qw, bias, perm)`` (a QuantLinear). ``batches``: calibration_batches' output."""
    from tqdm.auto import tqdm

    run = GPTQRun()
    device = next(iter(model.parameters())).device
    stack = block_stack(model)
    prefix = {id(m): n for n, m in model.named_modules()}
    blocks = [] if stack is None else [prefix[id(b)] for b in stack]
    inside = lambda name, block: name.startswith(block + ".")
    was_training = model.training
    model.eval()
    try:
        if blocks:
            kept = []

            def keep(mod, args, kwargs):
                kept.append((args, kwargs))
                raise _Stop

            handle = stack[0].register_forward_pre_hook(keep, with_kwargs=True)
            with _Timer(run.seconds, "capture", device):
                try:
                    for batch in batches:
                        with contextlib.suppress(_Stop):
                            run_model(model, batch)
                finally:
                    handle.remove()
            for b, block_name in enumerate(tqdm(blocks, desc="mixgemm: GPTQ", unit="layer", disable=not progress)):
                block = stack[b]
                mine = [n for n in names if inside(n, block_name)]
                stats, handles = _hooked(model, mine)
                with _Timer(run.seconds, "hessians", device):
                    try:
                        for args, kwargs in kept:
                            block(*args, **kwargs)
                    finally:
                        for h in handles:
                            h.remove()
                with _Timer(run.seconds, "gptq", device):
                    _quantize_linears(model, mine, stats, make, run, params, config)
                if b + 1 < len(blocks):
                    with _Timer(run.seconds, "propagate", device):
                        kept = [(_next_args(args, kwargs, _first(block(*args, **kwargs)))) for args, kwargs in kept]
            del kept
        rest = [n for n in names if not any(inside(n, b) for b in blocks)]
        if rest:
            stats, handles = _hooked(model, rest)
            with _Timer(run.seconds, "hessians", device):
                try:
                    for batch in batches:
                        run_model(model, batch)
                finally:
                    for h in handles:
                        h.remove()
            with _Timer(run.seconds, "gptq", device):
                _quantize_linears(model, rest, stats, make, run, params, config)
    finally:
        model.train(was_training)
    return run


def _next_args(args: tuple, kwargs: dict, hidden: torch.Tensor) -> tuple[tuple, dict]:
    """A block's inputs with its hidden states (the first positional argument, or ``hidden_states``) replaced."""
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


__all__ = ["GPTQRun", "block_stack", "calibration_batches", "gptq_quantize_model"]
