"""The contract between the checkpoint loader and each quantized-checkpoint format.

A format (GPTQ, AWQ, compressed-tensors, mixgemm's own, ...) turns the tensors a checkpoint stores for one
linear layer into a ``ConvertedLinear``: a QuantizedWeight in mixgemm's plain interchange layout, exactly
equal to the checkpoint's own dequantization wherever mixgemm's formats can hold it, plus the bias and,
for act-order checkpoints, the permutation of the input features that makes the groups contiguous.
The loader builds the model skeleton, asks ``formats.find`` which format a ``quantization_config``
names, and calls ``convert_linear`` once per quantized layer; ``quant_linear`` makes the QuantLinear of each.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from mixgemm.formats.weight import QuantizedWeight


@dataclass
class ConvertedLinear:
    """One linear layer in mixgemm's terms.

    weight: the QuantizedWeight [N, K] (columns already in ``input_perm`` order when that is set).
    bias: float [N] or None.
    input_perm: int64 [K] or None. When set, the layer computes ``x[..., input_perm] @ dequant(weight).T``:
        act-order (GPTQ ``desc_act``) checkpoints store groups scattered along K (``g_idx``); sorting K by
        group once at load makes every group a contiguous run, as mixgemm's kernels need.
    act_mode, act_block: the activation quantization the layer runs with (QuantLinear's arguments); None and
        "group" (weight-only) unless the checkpoint stores an activation-quantized layer (mixgemm's own format).
    """

    weight: QuantizedWeight
    bias: torch.Tensor | None = None
    input_perm: torch.Tensor | None = None
    act_mode: str | None = None
    act_block: str = "group"


class TensorSource(Protocol):
    """Read access to a checkpoint's tensors by name, loaded lazily (e.g. over safetensors' safe_open)."""

    def keys(self) -> Iterable[str]: ...

    def get(self, name: str) -> torch.Tensor: ...


class CheckpointFormat(Protocol):
    """One quantized-checkpoint format."""

    name: str

    def matches(self, quantization_config: dict) -> bool:
        """True when a config.json ``quantization_config`` describes this format."""

    def quantized_linears(self, source: TensorSource, quantization_config: dict) -> list[str]:
        """Module paths (e.g. "model.layers.0.self_attn.q_proj") of the layers this checkpoint stores quantized."""

    def convert_linear(self, source: TensorSource, prefix: str, quantization_config: dict) -> ConvertedLinear:
        """The layer at ``prefix`` as a ConvertedLinear; a ValueError naming the tensor when it cannot be held."""


def cast_to(t: torch.Tensor, dtype, device) -> torch.Tensor:
    """t on ``device``, in ``dtype`` when given and t is floating point."""
    if dtype is not None and t.is_floating_point():
        t = t.to(dtype)
    return t.to(device)


def quant_linear(conv: ConvertedLinear, linear: nn.Module, name: str, device, dtype=None):
    """The QuantLinear of one converted layer, on ``device`` (bias in ``dtype`` when given), checked against the
    skeleton's Linear."""
    from mixgemm.nn.linear import QuantLinear

    want = (linear.out_features, linear.in_features)
    if tuple(conv.weight.shape) != want:
        raise ValueError(f"layer {name!r}: the checkpoint's weight is {tuple(conv.weight.shape)} [out, in], the model "
                         f"expects {want}")
    has_bias = getattr(linear, "bias", None) is not None
    if (conv.bias is not None) != has_bias:
        raise ValueError(f"layer {name!r}: the checkpoint {'has' if conv.bias is not None else 'lacks'} a bias, the "
                         f"model {'has' if has_bias else 'has none'}")
    bias = conv.bias
    if bias is not None and bias.device.type != "meta":
        bias = cast_to(bias, dtype, device)
    ql = QuantLinear.from_quantized(conv.weight.to(device), bias, act_mode=conv.act_mode, act_block=conv.act_block)
    if conv.input_perm is not None:
        if not hasattr(ql, "input_perm"):
            raise ValueError(f"layer {name!r} needs an input permutation (act-order), which this QuantLinear lacks")
        ql.input_perm = conv.input_perm.to(device=device, dtype=torch.int64)
    return ql
