"""QuantConv2d: a drop-in, inference-only replacement for torch.nn.Conv2d with block-quantized weights.

The weight is stored as the buffers of a QuantizedConvWeight (plain interchange packing, see
mixgemm.formats.conv): ``qweight`` uint8 [Co, ceil(Kh*Kw*Ci_g*bits/8)], ``scales`` [Co, G], ``zeros`` uint8
[Co, G] (mode "zero_point") and ``offsets`` [Co, G] (mode "offset"), plus ``bias`` [Co] or None. The
quantization config (bits, group size, mode, scale dtype), the kernel geometry and the fused activation
travel in the state dict's extra state, so ``load_state_dict`` refuses a checkpoint of another format.

Forward: ``mixgemm.conv2d`` (the conv registry's kernels on CUDA, the float64 reference on the CPU); under
torch.compile the custom op ``torch.ops.mixgemm.conv2d_wxa16``, which runs the same and which the compiler and CUDA
graphs see as one node. The input may be NCHW or channels_last, float16 / bfloat16 / float32; the output keeps its
layout and dtype.

Formats the conv layout cannot hold, and what ``from_conv`` does about them (``strict=False``, the default;
``strict=True`` raises instead), each with a warning naming the layer's shape:
* group_size must divide Ci/groups (one block inside one (kh, kw) tap): the largest supported group size
  below the requested one that divides it is used, else per-channel (-1). Depthwise (Ci/groups = 1) is
  therefore always per-channel.

An odd K = Kh*Kw*Ci/groups at 4 bits (7x7 or 3x3 depthwise, the 3-channel 7x7 stem: K = 147) is held as it is: each
row's last byte carries one padding nibble (mixgemm.formats.packing).
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import torch
from torch import nn

import mixgemm.ops.custom_ops  # noqa: F401  (registers torch.ops.mixgemm.conv2d_wxa16, forward's compiled call)
from mixgemm.epilogue import clamp_bounds
from mixgemm.formats.conv import QuantizedConvWeight, check_conv_config, quantize_conv_weight
from mixgemm.formats.packing import packed_width
from mixgemm.formats.weight import GROUP_SIZES, PER_CHANNEL, QuantConfig
from mixgemm.ops.conv import _pair, conv2d

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


def fit_conv_config(config: QuantConfig, weight_shape, strict: bool = False) -> QuantConfig:
    """The config actually used for a conv kernel of shape [Co, Ci_g, Kh, Kw] (see the module docstring)."""
    check_conv_config(config)
    co, ci_g, kh, kw = weight_shape
    cfg = config
    if cfg.group_size != PER_CHANNEL and ci_g % cfg.group_size:
        fits = [g for g in GROUP_SIZES if g <= cfg.group_size and ci_g % g == 0]
        new = max(fits) if fits else PER_CHANNEL
        msg = (
            f"conv weight {tuple(weight_shape)}: group_size={cfg.group_size} does not divide Ci/groups={ci_g}"
        )
        if strict:
            raise ValueError(msg + "; use group_size=-1 or a divisor of Ci/groups")
        warnings.warn(f"{msg}; using group_size={new}", stacklevel=3)
        cfg = replace(cfg, group_size=new)
    return cfg


class QuantConv2d(nn.Module):
    """nn.Conv2d with a block-quantized INT4/INT8 kernel (inference only; no gradients).

    Same constructor arguments as nn.Conv2d (padding_mode "zeros" only; padding may be an int, a pair,
    "valid", or "same" when the implied padding is symmetric) plus the quantization format (bits,
    group_size, mode, scale_dtype) and ``activation`` (None, "relu", "relu6") fused into the kernel epilogue.
    Buffers start zeroed; fill them with ``from_conv`` or ``load_state_dict``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        *,
        bits: int = 4,
        group_size: int = 128,
        mode: str = "sym",
        scale_dtype: torch.dtype = torch.float16,
        activation: str | None = None,
        device=None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if padding_mode != "zeros":
            raise ValueError(f"QuantConv2d supports padding_mode='zeros' only, got {padding_mode!r}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"in_channels={in_channels} and out_channels={out_channels} must be divisible by "
                f"groups={groups}"
            )
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.dilation = _pair(dilation, "dilation")
        self.padding = self._resolve_padding(padding)
        self.padding_mode = padding_mode
        clamp_bounds(activation)
        self.activation = activation
        ci_g = in_channels // groups
        kh, kw = self.kernel_size
        self.qconfig = QuantConfig(bits=bits, group_size=group_size, mode=mode, scale_dtype=scale_dtype)
        check_conv_config(self.qconfig, ci_g)
        _, ng = self.qconfig.groups(kh * kw * ci_g)
        kbytes = packed_width(kh * kw * ci_g, bits)
        self.register_buffer("qweight", torch.zeros(out_channels, kbytes, dtype=torch.uint8, device=device))
        self.register_buffer("scales", torch.zeros(out_channels, ng, dtype=scale_dtype, device=device))
        self.register_buffer(
            "zeros",
            torch.zeros(out_channels, ng, dtype=torch.uint8, device=device) if mode == "zero_point" else None,
        )
        self.register_buffer(
            "offsets",
            torch.zeros(out_channels, ng, dtype=scale_dtype, device=device) if mode == "offset" else None,
        )
        self.register_buffer(
            "bias", torch.zeros(out_channels, dtype=dtype or torch.float32, device=device) if bias else None
        )
        self._qw_cache: tuple | None = None

    def _resolve_padding(self, padding) -> tuple[int, int]:
        if padding == "valid":
            return (0, 0)
        if padding == "same":
            if self.stride != (1, 1):
                raise ValueError("padding='same' needs stride 1 (as in nn.Conv2d)")
            out = []
            for k, d in zip(self.kernel_size, self.dilation, strict=True):
                total = d * (k - 1)
                if total % 2:
                    raise ValueError(
                        f"padding='same' with kernel {self.kernel_size} and dilation {self.dilation} "
                        "needs asymmetric padding, which QuantConv2d does not support"
                    )
                out.append(total // 2)
            return tuple(out)
        return _pair(padding, "padding")

    @classmethod
    def from_conv(
        cls,
        conv: nn.Conv2d,
        config: QuantConfig | None = None,
        activation: str | None = None,
        strict: bool = False,
        **kwargs,
    ) -> QuantConv2d:
        """Quantize a trained nn.Conv2d (its weight is read, never modified).

        config: QuantConfig or its fields as keywords (default bits=4, group_size=128, mode="sym"); adjusted
        per layer by ``fit_conv_config`` (see the module docstring) unless strict=True.
        activation: fuse a following relu / relu6 into this layer's epilogue (the caller removes that module).
        """
        if not isinstance(conv, nn.Conv2d):
            raise TypeError(f"from_conv expects an nn.Conv2d, got {type(conv).__name__}")
        if conv.padding_mode != "zeros":
            raise ValueError(f"padding_mode={conv.padding_mode!r} is not supported (only 'zeros')")
        if config is None:
            config = QuantConfig(**kwargs)
        elif kwargs:
            config = replace(config, **kwargs)
        w = conv.weight.detach()
        cfg = fit_conv_config(config, tuple(w.shape), strict)
        qcw = quantize_conv_weight(w, cfg)
        mod = cls(
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size,
            conv.stride,
            conv.padding,
            conv.dilation,
            conv.groups,
            conv.bias is not None,
            bits=cfg.bits,
            group_size=cfg.group_size,
            mode=cfg.mode,
            scale_dtype=cfg.scale_dtype,
            activation=activation,
            device=w.device,
            dtype=conv.bias.dtype if conv.bias is not None else None,
        )
        mod.load_quantized(qcw)
        if conv.bias is not None:
            mod.bias.copy_(conv.bias.detach())
        return mod

    @torch.no_grad()
    def load_quantized(self, qcw: QuantizedConvWeight) -> None:
        """Copy a QuantizedConvWeight (same shape and format) into the buffers."""
        qm = qcw.matrix
        ci_g = self.in_channels // self.groups
        if (
            qcw.kernel_size != self.kernel_size
            or qcw.in_channels_per_group != ci_g
            or qcw.out_channels != self.out_channels
        ):
            raise ValueError("QuantizedConvWeight geometry does not match this layer")
        a, b = qm.config, self.qconfig
        if (a.bits, a.mode, a.scale_dtype) != (b.bits, b.mode, b.scale_dtype) or tuple(
            qm.scales.shape
        ) != tuple(self.scales.shape):
            raise ValueError(
                f"QuantizedConvWeight format {qm.config} does not match this layer's {self.qconfig}"
            )
        self.qweight.copy_(qm.qweight)
        self.scales.copy_(qm.scales)
        if self.zeros is not None:
            self.zeros.copy_(qm.zeros)
        if self.offsets is not None:
            self.offsets.copy_(qm.offsets)
        self._qw_cache = None

    def quantized_weight(self) -> QuantizedConvWeight:
        """The buffers as a QuantizedConvWeight: a view around the QuantizedWeight cached on the qweight tensor
        (mixgemm.ops.custom_ops.weight_from_tensors), the same object the compiled op finds, so the eager and compiled
        calls share one set of kernel layouts and call plans (the op building its own during a CUDA-graph warm-up
        would allocate them in the graph's pool)."""
        from mixgemm.ops.custom_ops import weight_from_tensors

        b, c = self._buffers, self.qconfig
        kh, kw = self.kernel_size
        ci_g = self.in_channels // self.groups
        qm = weight_from_tensors(b["qweight"], b["scales"], b["zeros"], b["offsets"], c.bits, c.group_size, c.mode,
                                 self.out_channels, kh * kw * ci_g)
        if self._qw_cache is None or self._qw_cache[0] is not qm:
            self._qw_cache = (qm, QuantizedConvWeight(qm, self.kernel_size, ci_g))
        return self._qw_cache[1]

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float kernel [Co, Ci/groups, Kh, Kw] these buffers represent."""
        return self.quantized_weight().dequantize(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            # one opaque node (torch.ops.mixgemm.conv2d_wxa16): the dispatch, its races and the NVRTC launches are not
            # traceable, and CUDA graphs capture the op whole. The op finds the kernel layouts cached on qweight.
            b = self._buffers
            lo, hi = clamp_bounds(self.activation)
            c, (kh, kw) = self.qconfig, self.kernel_size
            shape = [self.out_channels, self.in_channels // self.groups, kh, kw]
            return torch.ops.mixgemm.conv2d_wxa16(
                x, b["qweight"], b["scales"], b["zeros"], b["offsets"], self.bias, c.bits, c.group_size, c.mode, shape,
                list(self.stride), list(self.padding), list(self.dilation), self.groups, lo, hi)
        return conv2d(
            x,
            self.quantized_weight(),
            self.bias,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
            self.activation,
        )

    # the format travels with the weights: a checkpoint of another format is refused, not misread
    def get_extra_state(self):
        c = self.qconfig
        return {
            "bits": c.bits,
            "group_size": c.group_size,
            "mode": c.mode,
            "scale_dtype": _DTYPE_NAMES[c.scale_dtype],
            "kernel_size": list(self.kernel_size),
            "activation": self.activation,
        }

    def set_extra_state(self, state):
        mine = self.get_extra_state()
        for key in ("bits", "group_size", "mode", "scale_dtype", "kernel_size"):
            if key in state and state[key] != mine[key]:
                raise ValueError(
                    f"checkpoint has {key}={state[key]!r} but this QuantConv2d has {mine[key]!r}"
                )
        self.activation = state.get("activation", self.activation)
        self._qw_cache = None

    def _apply(self, fn, recurse=True):
        # model.half() / .to(dtype) must move the quantization parameters but not re-round them: they keep
        # the config's scale dtype (the bias follows the model's dtype like nn.Conv2d's).
        orig = {n: self._buffers[n] for n in ("scales", "offsets") if self._buffers.get(n) is not None}
        super()._apply(fn, recurse)
        for n, t in orig.items():
            if self._buffers[n].dtype != t.dtype:
                self._buffers[n] = t.to(self._buffers[n].device)
        self._qw_cache = None  # .to()/.cuda() replace the buffers: rebuild the view (and kernel layouts)
        return self

    def extra_repr(self) -> str:
        c = self.qconfig
        s = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
            f"bias={self.bias is not None}, bits={c.bits}, group_size={c.group_size}, mode={c.mode!r}"
        )
        return s + (f", activation={self.activation!r}" if self.activation else "")


def swap_conv2d(
    model: nn.Module, config: QuantConfig | None = None, filter_fn=None, strict: bool = False, **kwargs
) -> nn.Module:
    """Replace, in place, every nn.Conv2d of ``model`` (for which ``filter_fn(module, fqn)`` is true, if
    given) by QuantConv2d.from_conv(conv, config). Returns ``model``. This is the hook for ``quantize_``."""
    if config is None:
        config = QuantConfig(**kwargs)
    for fqn, mod in list(model.named_modules()):
        for name, child in list(mod.named_children()):
            full = f"{fqn}.{name}" if fqn else name
            if type(child) is nn.Conv2d and (filter_fn is None or filter_fn(child, full)):
                setattr(mod, name, QuantConv2d.from_conv(child, config, strict=strict))
    return model
