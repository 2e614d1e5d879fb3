"""The model skeleton a checkpoint is loaded into: built on the meta device, filled tensor by tensor.

Nothing is allocated until a tensor is read from the checkpoint: ``build`` makes the transformers model on the
meta device, ``put_module`` swaps a layer (an nn.Linear for its QuantLinear), ``put_tensor`` assigns one
parameter / buffer / format tensor, and ``finish`` rebuilds the non-persistent buffers (rotary frequencies),
ties the tied weights and refuses a model that still has a tensor without values.
"""

from __future__ import annotations

import torch
from torch import nn


def build(config, trust_remote_code: bool = False) -> nn.Module:
    """The causal LM of a transformers ``config`` on the meta device, in eval mode."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return model.eval()


def tied_parameters(model: nn.Module) -> dict[int, list[str]]:
    """id(parameter) -> the names it has, for parameters shared by several modules."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return {i: n for i, n in names.items() if len(n) > 1}


def put_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    old = model.get_submodule(name)
    module.train(old.training)
    setattr(model.get_submodule(parent), child, module)


def put_tensor(model: nn.Module, key: str, value: torch.Tensor) -> None:
    """Assign ``value`` to the parameter / buffer / ``_extra_state`` called ``key`` (a state_dict key), checking
    shape; dtype and device are the caller's (value is used as is)."""
    path, _, attr = key.rpartition(".")
    module = model.get_submodule(path)
    if attr == "_extra_state":
        module.set_extra_state(value)
        return
    if attr in module._parameters:
        old = module._parameters[attr]
        if old is None or tuple(old.shape) != tuple(value.shape):
            raise ValueError(f"tensor {key!r} has shape {tuple(value.shape)}, the model expects "
                             f"{None if old is None else tuple(old.shape)}")
        module._parameters[attr] = nn.Parameter(value, requires_grad=False)
    elif attr in module._buffers:
        old = module._buffers[attr]
        if old is not None and tuple(old.shape) != tuple(value.shape):
            raise ValueError(f"tensor {key!r} has shape {tuple(value.shape)}, the model expects {tuple(old.shape)}")
        module._buffers[attr] = value
    else:
        raise ValueError(f"tensor {key!r}: the model has no parameter or buffer {attr!r} in {path!r}")


def expected_keys(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state_dict keys of the skeleton (persistent tensors and format tensors), with their meta tensors."""
    return dict(model.state_dict(keep_vars=True))


def check_float(key: str, stored, expected: torch.Tensor) -> None:
    """A ValueError when the model's float tensor ``key`` is stored (a tensor, or a StoredTensor of the checkpoint's
    header) as something else: integer codes never fill a float tensor."""
    if expected.is_floating_point() and not stored.is_floating_point():
        raise ValueError(f"tensor {key!r} is {stored.dtype} in the checkpoint, the model expects a float tensor "
                         f"(quantized codes of a layer its quantization_config does not describe?)")


def finish(model: nn.Module, device) -> None:
    """Non-persistent buffers rebuilt on ``device``, tied weights tied, and no tensor left on the meta device."""
    for name, module in model.named_modules():
        meta = [b for b in module._non_persistent_buffers_set
                if module._buffers.get(b) is not None and module._buffers[b].device.type == "meta"]
        if not meta:
            continue
        if any(p is not None for p in module._parameters.values()) or not hasattr(model, "_init_weights"):
            raise ValueError(f"cannot rebuild the non-persistent buffers {meta} of {name!r}")
        for b in meta:
            module._buffers[b] = torch.empty_like(module._buffers[b], device=device)
        model._init_weights(module)  # transformers' own initialisation recomputes them (e.g. rotary inv_freq)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.device.type == "meta"]
    if left:
        raise ValueError(f"the checkpoint has no values for {len(left)} tensors of the model, e.g. {left[:5]}")


__all__ = ["build", "check_float", "expected_keys", "finish", "put_module", "put_tensor", "tied_parameters"]
