"""Act-order down projections whose input permutation moves into the gate and up projections, exactly.

An act-order (GPTQ ``desc_act``) QuantLinear multiplies ``x[..., input_perm]``, and its GEMV gathers x through the
permutation in every thread block. In a gated MLP, ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``, down's input
is elementwise over the intermediate features, so with gate's and up's output rows (codes, scales, zero points,
offsets, bias) taken in down's permutation order (Phi-3's fused gate_up_proj: each half alike) the intermediate
comes out already gathered:
``act(gate_P(x)) * up_P(x) == (act(gate(x)) * up(x))[..., P]``. Reordering those rows once at load is exact (no
arithmetic changes, only where each row sits), and down then runs as a plain layer. Why down: its K (the
intermediate size) is the largest of a decoder block, so its per-block gather of x and the permutation cost the
most (docs/architecture.md, act-order).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from mixgemm.nn.linear import QuantLinear


@dataclass(frozen=True)
class GatedMLP:
    """One form of gated MLP: ``forward`` is a whitespace-free fragment of its forward's source, ``producers`` the
    children whose output rows feed down's input, each holding ``halves`` stacked copies of the intermediate
    features (1: gate_proj and up_proj apart; 2: one gate_up_proj whose output is chunked into gate and up)."""

    forward: str
    producers: tuple[str, ...]
    halves: int


# As transformers writes them: Llama, Mistral, Qwen2/3, Gemma and their relatives (gate and up apart); Phi-3 (one
# fused gate_up_proj, chunked in two).
GATED_MLPS = (
    GatedMLP("self.down_proj(self.act_fn(self.gate_proj(x))*self.up_proj(x))", ("gate_proj", "up_proj"), 1),
    GatedMLP("up_states=self.gate_up_proj(hidden_states)gate,up_states=up_states.chunk(2,dim=-1)"
             "up_states=up_states*self.activation_fn(gate)returnself.down_proj(up_states)", ("gate_up_proj",), 2),
)


def gated_mlp_form(module: nn.Module) -> GatedMLP | None:
    """The GatedMLP form whose forward ``module`` runs (read from its forward's source: a module that only has
    layers of those names, but combines them otherwise, has none), or None."""
    try:
        source = "".join(inspect.getsource(type(module).forward).split())
    except (OSError, TypeError):
        return None
    return next((form for form in GATED_MLPS if form.forward in source), None)


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
    """For every gated MLP (GATED_MLPS) whose down_proj is an act-order QuantLinear and whose producers are Linears
    (QuantLinear or nn.Linear) of halves x down's in_features outputs: reorder the producers' rows by down's
    permutation (each half alike) and drop it from down. Returns the names of the down projections changed; the model
    computes the same function (the same products, only stored in other rows)."""
    folded = []
    for name, mlp in model.named_modules():
        down = getattr(mlp, "down_proj", None)
        if not isinstance(down, QuantLinear) or down.input_perm is None:
            continue
        form = gated_mlp_form(mlp)
        if form is None:
            continue
        inter = down.in_features
        producers = [getattr(mlp, p, None) for p in form.producers]
        if not all(isinstance(p, (QuantLinear, nn.Linear)) and p.out_features == form.halves * inter
                   for p in producers):
            continue
        perm = down.input_perm
        rows = torch.cat([perm + h * inter for h in range(form.halves)])
        for producer in producers:
            permute_output_rows(producer, rows)
        down.input_perm = None
        folded.append(f"{name}.down_proj" if name else "down_proj")
    return folded
