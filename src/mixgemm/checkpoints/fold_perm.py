"""Act-order down projections whose input permutation moves into the gate and up projections, exactly.

An act-order (GPTQ ``desc_act``) QuantLinear multiplies ``x[..., input_perm]``, and its GEMV gathers x through the
permutation in every thread block. In a gated MLP, ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``, down's input
is elementwise over the intermediate features, so with gate's and up's output rows (codes, scales, zero points,
offsets, bias) taken in down's permutation order the intermediate comes out already gathered:
``act(gate_P(x)) * up_P(x) == (act(gate(x)) * up(x))[..., P]``. Reordering those rows once at load is exact (no
arithmetic changes, only where each row sits), and down then runs as a plain layer. Why down: its K (the
intermediate size) is the largest of a decoder block, so its per-block gather of x and the permutation cost the
most (docs/design.md, act-order).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from mixgemm.nn.linear import QuantLinear

# The gated MLP's forward (whitespace removed) as transformers writes it for Llama, Mistral, Qwen2/3, Gemma and
# their relatives: down's input is act(gate) * up, elementwise.
_GATED_MLP = "self.down_proj(self.act_fn(self.gate_proj(x))*self.up_proj(x))"


def is_gated_mlp(module: nn.Module) -> bool:
    """True when ``module``'s forward computes down_proj(act_fn(gate_proj(x)) * up_proj(x)) (read from its source:
    a module that only has layers of those names, but combines them otherwise, is left alone)."""
    try:
        source = inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        return False
    return _GATED_MLP in "".join(source.split())


def permute_output_rows(layer: nn.Module, perm: torch.Tensor) -> None:
    """Reorder the output features of a QuantLinear or nn.Linear: row j of the result is row perm[j] (new tensors;
    the old ones are not modified)."""
    perm = perm.to(device=_device_of(layer), dtype=torch.long)
    if isinstance(layer, QuantLinear):
        for name in ("qweight", "scales", "zeros", "offsets"):
            t = getattr(layer, name)
            if t.numel():  # zeros / offsets are empty outside their weight modes
                setattr(layer, name, t.index_select(0, perm))
    elif isinstance(layer, nn.Linear):
        layer.weight = nn.Parameter(layer.weight.detach().index_select(0, perm), requires_grad=False)
    else:
        raise TypeError(f"cannot reorder the rows of a {type(layer).__name__}")
    if layer.bias is not None:
        layer.bias = nn.Parameter(layer.bias.detach().index_select(0, perm), requires_grad=False)


def _device_of(layer: nn.Module) -> torch.device:
    return (layer.qweight if isinstance(layer, QuantLinear) else layer.weight).device


def fold_mlp_input_perms(model: nn.Module) -> list[str]:
    """For every gated MLP whose down_proj is an act-order QuantLinear and whose gate_proj / up_proj are Linears
    (QuantLinear or nn.Linear) of down's in_features outputs: reorder gate's and up's rows by down's permutation
    and drop it from down. Returns the names of the down projections changed; the model computes the same
    function (bit for bit: the same products, only stored elsewhere)."""
    folded = []
    for name, mlp in model.named_modules():
        down = getattr(mlp, "down_proj", None)
        if not isinstance(down, QuantLinear) or down.input_perm is None:
            continue
        producers = (getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None))
        if not all(isinstance(p, (QuantLinear, nn.Linear)) and p.out_features == down.in_features
                   for p in producers) or not is_gated_mlp(mlp):
            continue
        for producer in producers:
            permute_output_rows(producer, down.input_perm)
        down.input_perm = None
        folded.append(f"{name}.down_proj" if name else "down_proj")
    return folded
