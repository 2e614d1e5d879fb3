"""mixgemm.explain / mixgemm.explain_conv: which kernel runs a call, with which config, and why each earlier entry
of its op declined; and mixgemm.resident_bytes: what a weight (or a model's weights) hold in memory."""

from __future__ import annotations

import torch

from mixgemm.formats.activation import act_block_size
from mixgemm.formats.conv import QuantizedConvWeight
from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.registry import Choice, DeviceInfo, KernelEntry, choose, device_info

CPU_FALLBACK = KernelEntry("cpu_reference", "cpu", lambda p: None, lambda p: None, None,
                           doc="the CPU fallback (mixgemm.ops.matmul / reference)")
CPU_KERNELS = KernelEntry("cpu_torch_kernels", "cpu", lambda p: None, lambda p: None, None,
                          doc="PyTorch's int4 / int8 CPU kernels (mixgemm.kernels.cpu.linear)")
CPU_DEQUANT = KernelEntry("cpu_dequant", "cpu", lambda p: None, lambda p: None, None,
                          doc="the blockwise dequantizing float32 GEMM (mixgemm.kernels.cpu.dequant)")


def _cpu_choice(x: torch.Tensor, qweight: QuantizedWeight, act_mode: str | None) -> Choice:
    gpu = ("GPU kernels", f"x is on {x.device}")
    if act_mode is not None:  # activation-quantized formats run the block-wise integer reference on the CPU
        return Choice(CPU_FALLBACK, None, (gpu,))
    from mixgemm.kernels.cpu.linear import cpu_can_run

    ok, why = cpu_can_run(x, qweight)
    return Choice(CPU_KERNELS, None, (gpu,)) if ok else Choice(CPU_DEQUANT, None, (gpu, (CPU_KERNELS.name, why)))


def _device(x: torch.Tensor, device) -> DeviceInfo | None:
    if device is None:
        return device_info(x.device) if x.device.type == "cuda" else None
    return device if isinstance(device, DeviceInfo) else device_info(torch.device(device))


def explain(x: torch.Tensor, qweight: QuantizedWeight, act_mode: str | None = None, act_block: str = "group",
            device: DeviceInfo | torch.device | str | None = None, act_order: bool = False) -> Choice:
    """The kernel mixgemm.matmul (act_mode None) or mixgemm.ops.int8.matmul_a8 (act_mode "sym" / "asym" / "sym_full",
    act_block "group" / "token") runs for x [..., K] and qweight on x's device -- or on ``device`` (a DeviceInfo
    describes a GPU that is not here) -- with its config and the declined entries' reasons. str(result) prints it.
    act_order: the call of an act-order weight-only layer (QuantLinear with input_perm): the choice then says whether
    the kernel gathers x through the permutation itself (``perm_in_kernel``, ``perm_note``).
    Under kernel_options, the options' choice."""
    from mixgemm.kernels.int8_activations import a8_problem
    from mixgemm.kernels.linear_common import linear_problem

    dev = _device(x, device)
    if dev is None:
        return _cpu_choice(x, qweight, act_mode)
    m = x.shape[:-1].numel()
    if act_mode is None:
        return choose(linear_problem(m, qweight, x.dtype, dev, act_order))
    k = qweight.in_features
    return choose(a8_problem(m, qweight, x.dtype, dev, act_mode, act_block_size(k, qweight.group_size, act_block) == k))


def explain_conv(x: torch.Tensor, qweight: QuantizedConvWeight, stride=1, padding=0, dilation=1,
                 groups: int = 1) -> Choice:
    """The conv analogue of explain for mixgemm.conv2d(x, qweight, ...) on x's device."""
    from mixgemm.kernels.conv_geometry import conv_output_size, conv_problem
    from mixgemm.ops.conv import check_conv_inputs

    stride, padding, dilation = check_conv_inputs(x, qweight, None, stride, padding, dilation, groups)
    if x.device.type != "cuda":
        return Choice(CPU_FALLBACK, None, (("GPU kernels", f"x is on {x.device}"),))
    ho, wo = conv_output_size(x.shape[2], x.shape[3], qweight.kernel_size, stride, padding, dilation)
    return choose(conv_problem(x, qweight, x.shape[0] * ho * wo, stride, padding, groups, dilation))


def _tensor_bytes(obj, seen: set) -> int:
    """Bytes of the tensors an object holds (a layout dataclass, a tensor, a tuple / dict of them) whose storage is not
    in ``seen`` (then added): a layout that reads the plain buffers themselves (gemv_v2's codes, a sym weight's scales)
    or another layout's tensors holds no memory of its own for them."""
    if isinstance(obj, torch.Tensor):
        key = (obj.device, obj.untyped_storage().data_ptr())
        if key in seen:
            return 0
        seen.add(key)
        # (a compacted weight's qweight placeholder views one byte: its storage, not its shape, is what it holds)
        return min(obj.numel() * obj.element_size(), obj.untyped_storage().nbytes())
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(_tensor_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dataclass_fields__"):
        return sum(_tensor_bytes(getattr(obj, f), seen) for f in obj.__dataclass_fields__)
    return 0


def resident_bytes(obj) -> dict:
    """Memory a QuantizedWeight, a QuantizedConvWeight, or every quantized weight of a module holds: {"plain": the
    packed size (bytes of the plain interchange tensors: codes, scales, zeros / offsets), "plain_held": the bytes of
    those tensors held (less than "plain" for a compacted weight, whose codes live only in its resident layout),
    "layouts": {layout name: bytes of the cached kernel layouts}, "total": plain_held + layouts, "ratio": total /
    plain}, and for a module "by_precision": the same per "w<bits>"."""
    weights = _weights(obj)
    out = _summary(weights)
    if not isinstance(obj, (QuantizedWeight, QuantizedConvWeight)):
        groups: dict[str, list] = {}
        for qw in weights:
            groups.setdefault(f"w{qw.bits}", []).append(qw)
        out["by_precision"] = {key: _summary(v) for key, v in sorted(groups.items())}
    return out


def _summary(weights) -> dict:
    plain = sum(qw.nbytes() for qw in weights)
    held = 0
    layouts: dict[str, int] = {}
    for qw in weights:
        seen: set = set()
        held += _tensor_bytes([qw.qweight, qw.scales, qw.zeros, qw.offsets], seen)
        for name, lay in qw._layouts.items():
            layouts[name] = layouts.get(name, 0) + _tensor_bytes(lay, seen)
    total = held + sum(layouts.values())
    return {"plain": plain, "plain_held": held, "layouts": layouts, "total": total,
            "ratio": total / plain if plain else 0.0}


def _weights(obj) -> list[QuantizedWeight]:
    if isinstance(obj, QuantizedWeight):
        return [obj]
    if isinstance(obj, QuantizedConvWeight):
        return [obj.matrix]
    if isinstance(obj, torch.nn.Module):
        from mixgemm.ops.custom_ops import cached_weight

        found, seen = [], set()
        for mod in obj.modules():
            for qw in _module_weights(mod, cached_weight):
                if id(qw) not in seen:
                    seen.add(id(qw))
                    found.append(qw)
        return found
    raise TypeError(f"resident_bytes takes a QuantizedWeight, a QuantizedConvWeight or an nn.Module, got "
                    f"{type(obj).__name__}")


def _module_weights(mod, cached_weight):
    """The QuantizedWeights a mixgemm module's calls use: the one cached on its qweight buffer by the ops (with its
    layouts), else a plain view of its buffers."""
    qweight = getattr(mod, "qweight", None)
    if not isinstance(qweight, torch.Tensor) or not hasattr(mod, "scales"):
        return []
    qw = cached_weight(qweight)
    if qw is None and hasattr(mod, "quantized_weight"):
        qw = mod.quantized_weight()
        qw = qw.matrix if isinstance(qw, QuantizedConvWeight) else qw
    return [] if qw is None else [qw]
