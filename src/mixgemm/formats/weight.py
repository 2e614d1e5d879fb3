"""Block quantization of weights along K: the format every mixgemm kernel reads.

A float weight W [N, K] (nn.Linear orientation: N output channels, K input features) is cut,
per output channel, into runs of ``group_size`` consecutive k. Each run (a *group*, or block)
shares one scale and, for asymmetric modes, one zero point or offset.

Codes are always stored *unsigned*, q in [0, 2**bits - 1]:

================  ===========================  ======================================
mode              dequantized value            stored per group
================  ===========================  ======================================
``"sym"``         w = (q - 2**(bits-1)) * s    s (q4_0 style: int4 carries the +8 bias,
                                               int8 the +128 bias)
``"zero_point"``  w = (q - z) * s              s, z (uint8, integer in [0, 2**bits-1])
``"offset"``      w = q * s + m                s, m (q4_1 style: m is the block minimum)
================  ===========================  ======================================

Byte-level packing (``QuantizedWeight.qweight``, uint8 [N, ceil(K * bits / 8)]):

* 8 bits: byte k of row n is q[n, k].
* 4 bits: byte j of row n holds q[n, 2j] in its low nibble (bits 0-3) and q[n, 2j+1] in its high
  nibble (bits 4-7). An odd K (per-channel weights of 7x7 / 3x3 depthwise convs, odd in_features) ends each row in
  a byte whose high nibble is a padding code no reader uses (mixgemm.formats.packing.PAD_CODE_4BIT).

A K that the group size does not divide ends each row in a *partial group*: group G - 1 (G = ceil(K / group_size))
covers the last K - (G - 1) * group_size k only, and its parameters come from those k alone (GPTQ's ``g_idx = k //
group_size`` grouping). Kernel layouts that tile K pad that group to the tile with codes no output reads (the
activations are zero there).

That plain layout is the interchange format (save, load, convert). Kernels read their own layouts,
made from it by explicit functions in :mod:`mixgemm.formats.layouts`.

Rounding is round-half-to-even with clamping to the code range. Scales are rounded *up* when cast to
the scale dtype (and the offset *down*), so that every weight of a group stays inside the range the
stored parameters can represent: the quantization error is at most s/2 per element, measured against
the stored s, z and m.

Non-finite weights (NaN, +-Inf) are rejected with a ValueError naming the first bad position:
a block scale cannot represent them, and silently saturating would hide a broken checkpoint.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from mixgemm.formats.packing import pack_codes, unpack_codes

MODES = ("sym", "zero_point", "offset")
GROUP_SIZES = (32, 64, 128, 256)
# groups of 16, 8-bit weights only: GGUF's Q6_K / Q3_K / Q2_K scale sub-blocks of 16 weights, held exactly
# (mixgemm.ggml.gguf_types). Not in GROUP_SIZES, whose sizes every kernel family takes: the CUDA kernels decline
# groups of 16 (their k tiles hold whole groups of 32 or more); the Triton GEMM and the CPU paths run them.
NARROW_GROUP = 16
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
PER_CHANNEL = -1


def narrow_group_reason(group_size: int, num_groups: int) -> str | None:
    """Why a CUDA kernel (or its layout) cannot take a weight of ``group_size`` (the effective group) split into
    ``num_groups`` groups, or None: groups of NARROW_GROUP, whose k tiles hold whole groups of 32 or more."""
    if group_size == NARROW_GROUP and num_groups > 1:
        return (f"groups of {NARROW_GROUP} (8-bit, GGUF's Q6_K / Q3_K / Q2_K sub-blocks): the CUDA kernels' k tiles "
                "take groups of 32 or more; the Triton GEMM and the CPU paths run them")
    return None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class QuantConfig:
    """How to quantize a weight.

    bits: 4 or 8. group_size: 32, 64, 128, 256, or -1 (None accepted) for per-channel (one group = all K); 16 for
    8-bit weights (NARROW_GROUP).
    mode: "sym", "zero_point" or "offset" (see the module docstring). scale_dtype: dtype of s and m.
    """

    bits: int = 4
    group_size: int = 128
    mode: str = "sym"
    scale_dtype: torch.dtype = torch.float16

    def __post_init__(self):
        if self.group_size is None:
            object.__setattr__(self, "group_size", PER_CHANNEL)
        # Integers only (4.0 or True would pass the membership tests below and fail deep inside later);
        # numpy integers are normalized to int.
        for name in ("bits", "group_size"):
            v = getattr(self, name)
            if isinstance(v, numbers.Integral) and not isinstance(v, bool):
                object.__setattr__(self, name, int(v))
        if not _is_int(self.bits) or self.bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {self.bits!r}")
        if not _is_int(self.group_size) or (
            self.group_size not in (PER_CHANNEL, NARROW_GROUP) and self.group_size not in GROUP_SIZES
        ):
            raise ValueError(
                f"group_size must be one of {GROUP_SIZES}, -1 (per-channel) or {NARROW_GROUP} (8-bit only), got "
                f"{self.group_size!r}"
            )
        if self.group_size == NARROW_GROUP and self.bits != 8:
            raise ValueError(f"group_size={NARROW_GROUP} is for 8-bit weights only (GGUF's 16-weight sub-blocks), "
                             f"got bits={self.bits}: {self.bits}-bit weights take {GROUP_SIZES} or -1")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.scale_dtype not in SCALE_DTYPES:
            raise ValueError(f"scale_dtype must be one of {SCALE_DTYPES}, got {self.scale_dtype!r}")

    @property
    def symmetric(self) -> bool:
        return self.mode == "sym"

    @property
    def qmax(self) -> int:
        return (1 << self.bits) - 1

    @property
    def sym_bias(self) -> int:
        """The implicit zero point of the symmetric mode: 8 for int4, 128 for int8."""
        return 1 << (self.bits - 1)

    def groups(self, k: int) -> tuple[int, int]:
        """(group size, number of groups) for a reduction length k: ceil(k / group size) groups, the last one partial
        where the group size does not divide k (see the module docstring)."""
        if not _is_int(k) or k <= 0:
            raise ValueError(f"K must be a positive integer, got {k!r}")
        g = k if self.group_size == PER_CHANNEL else self.group_size
        return g, -(-k // g)


@dataclass(frozen=True)
class QuantizedWeight:
    """A block-quantized weight W [N, K] in the plain interchange layout.

    qweight: uint8 [N, packed_width(K, bits)] (ceil(K * bits / 8)), packed as the module docstring says.
    scales:  scale_dtype [N, G], G = ceil(K / group_size).
    zeros:   uint8 [N, G] for mode "zero_point", else None.
    offsets: scale_dtype [N, G] for mode "offset", else None.
    config:  the QuantConfig; config.group_size may be -1 (per-channel): use ``group_size``.
    shape:   (N, K).
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    offsets: torch.Tensor | None
    config: QuantConfig
    shape: tuple[int, int]
    _layouts: dict = field(default_factory=dict, compare=False, repr=False)
    # None: the plain codes are held (``qweight``). A layout name (RESIDENT_LAYOUTS): the weight holds only that
    # kernel layout of its codes, ``qweight`` is a placeholder of the plain shape without the bytes (see
    # compact_placeholder), and ``packed()`` / ``codes()`` rebuild the plain codes from the layout when asked.
    resident: str | None = field(default=None, compare=False)

    def layout(self, name: str, build: Callable[[QuantizedWeight], object]):
        """The kernel layout ``name`` of this weight, built once by ``build(self)`` and cached.

        Kernels repack the plain layout into their own (interleaved nibbles, transposed tiles...) the
        first time they see a weight; later calls reuse it. The plain tensors are never modified. A weight that
        keeps only one resident layout (``resident``) builds no other: that would be a second copy of its codes.
        """
        if name not in self._layouts:
            if self.resident is not None:
                raise ValueError(f"this weight keeps only its {self.resident} layout (a compacted layer, "
                                 f"QuantLinear.compact_); building {name} would hold its codes twice: run it through "
                                 f"a kernel that reads {self.resident}, or uncompact_() the layer first")
            self._layouts[name] = build(self)
        return self._layouts[name]

    def __repr__(self) -> str:
        n, k = self.shape
        g = "per-channel" if self.config.group_size == PER_CHANNEL else self.config.group_size
        return (f"QuantizedWeight(shape=({n}, {k}), bits={self.bits}, group_size={g}, mode={self.mode!r}, "
                f"scale_dtype={self.config.scale_dtype}, device={self.device}, nbytes={self.nbytes()})")

    def has_layout(self, name: str) -> bool:
        """True when the kernel layout ``name`` was already built (and cached) for this weight."""
        return name in self._layouts

    @property
    def bits(self) -> int:
        return self.config.bits

    @property
    def mode(self) -> str:
        return self.config.mode

    @property
    def out_features(self) -> int:
        return self.shape[0]

    @property
    def in_features(self) -> int:
        return self.shape[1]

    @property
    def group_size(self) -> int:
        """The effective group size (K for per-channel)."""
        return self.config.groups(self.shape[1])[0]

    @property
    def num_groups(self) -> int:
        return self.config.groups(self.shape[1])[1]

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    def packed(self) -> torch.Tensor:
        """The plain packed codes uint8 [N, ceil(K * bits / 8)]: ``qweight`` itself, or for a weight that keeps only a
        resident layout, a fresh copy rebuilt from it (the layout is not modified)."""
        if self.resident is None:
            return self.qweight
        return pack_codes(self.codes(), self.bits)

    def codes(self) -> torch.Tensor:
        """Unpacked codes, uint8 [N, K], each in [0, 2**bits - 1]."""
        if self.resident is not None:
            return RESIDENT_LAYOUTS[self.resident].codes(self._layouts[self.resident])
        return unpack_codes(self.qweight, self.bits, self.shape[1])

    def zero_points(self) -> torch.Tensor:
        """Integer zero point per group as int32 [N, G] for "sym" and "zero_point"; error for "offset"."""
        if self.mode == "offset":
            raise ValueError("mode 'offset' has no integer zero point (w = q * s + m)")
        if self.mode == "sym":
            n, g = self.scales.shape
            return torch.full((n, g), self.config.sym_bias, dtype=torch.int32, device=self.device)
        return self.zeros.to(torch.int32)

    def group_params_float64(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(s, m) per group in float64 such that w = q * s + m exactly, for every mode."""
        s = self.scales.double()
        if self.mode == "offset":
            return s, self.offsets.double()
        return s, -self.zero_points().double() * s

    def centered_params_float64(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(s, m) per group in float64 such that w = (q - sym_bias) * s + m for every mode (m = 0 for "sym"): the
        form of the integer paths, whose signed codes c = q - sym_bias fit int8."""
        s = self.scales.double()
        bias = self.config.sym_bias
        if self.mode == "sym":
            return s, torch.zeros_like(s)
        if self.mode == "zero_point":
            return s, (bias - self.zeros.double()) * s  # (q - z) s = (q - bias) s + (bias - z) s
        return s, self.offsets.double() + bias * s  # q s + m0 = (q - bias) s + (m0 + bias s)

    def centered_group_sums(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of c, s * sum of c + g * m) per group for c = q - sym_bias: int32 [N, G] and float64 [N, G], the
        weight-side terms of the block-wise integer GEMM (sum over a group of (c s + m) = s sum(c) + g m)."""
        n, k = self.shape
        g, ng = self.config.groups(k)
        s, m = self.centered_params_float64()
        c = self.codes().to(torch.int32) - self.config.sym_bias
        csum = pad_to_groups(c, g, ng, value=0).reshape(n, ng, g).sum(-1, dtype=torch.int32)
        return csum, s * csum.double() + group_lengths(k, g, ng, m.device).double() * m

    def to(self, device) -> QuantizedWeight:
        """This weight on ``device`` in the plain layout (a resident-only weight gets its plain codes back)."""
        move = lambda t: None if t is None else t.to(device)
        return replace(
            self,
            _layouts={},
            resident=None,
            qweight=move(self.packed()),
            scales=move(self.scales),
            zeros=move(self.zeros),
            offsets=move(self.offsets),
        )

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.zeros, self.offsets)
                   if t is not None)


@dataclass(frozen=True)
class ResidentLayout:
    """A kernel layout a weight may keep as its only copy of the codes: how it is built from a plain weight and how
    the codes uint8 [N, K] are read back from it (module, function names: imported on use, formats import no
    kernel layout module up front)."""

    module: str
    build_fn: str
    unpack_fn: str
    signed: bool = False  # the layout holds c = q - sym_bias

    def build(self, qw: QuantizedWeight):
        import importlib

        return getattr(importlib.import_module(self.module), self.build_fn)(qw)

    def codes(self, layout) -> torch.Tensor:
        import importlib

        c = getattr(importlib.import_module(self.module), self.unpack_fn)(layout)
        return (c + (1 << (layout.bits - 1))).to(torch.uint8) if self.signed else c


# the layouts a weight may keep as its only copy; the weight-only linear kernels' own (wgmma_v1, rows_v1) are
# registered by mixgemm.kernels.layouts, the map of their layouts (register_resident: formats import no kernel)
RESIDENT_LAYOUTS: dict[str, ResidentLayout] = {
    "wgmma_a8_v1": ResidentLayout("mixgemm.formats.layouts_wgmma_a8", "build_wgmma_a8_v1", "unpack_wgmma_a8_v1",
                                  signed=True),
}


def register_resident(name: str, layout: ResidentLayout) -> None:
    """Add ``name`` to the layouts a weight may keep as its only copy of the codes (RESIDENT_LAYOUTS)."""
    if RESIDENT_LAYOUTS.get(name, layout) != layout:
        raise ValueError(f"resident layout {name!r} is already registered as {RESIDENT_LAYOUTS[name]}")
    RESIDENT_LAYOUTS[name] = layout


def stand_in(shape: tuple[int, int], dtype: torch.dtype, device) -> torch.Tensor:
    """A 2-D tensor of ``shape`` over one zero element (all strides 0): the metadata of a tensor whose values live
    elsewhere, without its memory."""
    return torch.zeros(1, dtype=dtype, device=device).as_strided(tuple(shape), (0, 0))


def compact_placeholder(qweight: torch.Tensor) -> torch.Tensor:
    """A stand-in for the plain packed codes of a resident-only weight: qweight's shape, dtype and device over one
    zero byte (all strides 0), so module code, torch.compile and state handling see the same tensor metadata while
    the codes' memory is released. Reading it gives zeros, never the codes: QuantizedWeight.packed() rebuilds them."""
    return stand_in(qweight.shape, qweight.dtype, qweight.device)


def is_compact_placeholder(t: torch.Tensor) -> bool:
    """True for compact_placeholder's stand-ins (a 2-D tensor whose strides are all 0)."""
    return t.dim() == 2 and t.stride() == (0, 0)


def pad_to_groups(t: torch.Tensor, g: int, ng: int, value=None) -> torch.Tensor:
    """t [..., K] widened to [..., ng * g] along its last dim (a partial last group filled up): with ``value``, or by
    repeating each row's last element (which leaves every group's min, max and absmax as they are). t itself when K
    already is ng * g."""
    k = t.shape[-1]
    if k == ng * g:
        return t
    pad = ng * g - k
    fill = t[..., -1:].expand(*t.shape[:-1], pad) if value is None else t.new_full((*t.shape[:-1], pad), value)
    return torch.cat([t, fill], dim=-1)


def scale_and_shift(q: torch.Tensor, s: torch.Tensor, m: torch.Tensor, g: int) -> torch.Tensor:
    """q * s + m with each group's parameters: q [R, K] float, s and m [R, G] -> [R, K] in q's dtype, the parameters
    broadcast over each group's k (no per-k copy of them; a partial last group is padded for the product and cut
    after it)."""
    r, k = q.shape
    ng = s.shape[-1]
    w = torch.addcmul(m[..., None], pad_to_groups(q, g, ng, value=0).view(r, ng, g), s[..., None]).view(r, ng * g)
    return w if ng * g == k else w[:, :k].contiguous()


def partial_group(k: int, group_size: int) -> str | None:
    """"K=... ends in a partial group of ... (group size ...)" where ``group_size`` (-1: per-channel) does not divide
    k, else None: what the paths that take whole groups only say before their reason."""
    if group_size == PER_CHANNEL or k % group_size == 0:
        return None
    return f"K={k} ends in a partial group of {k % group_size} (group size {group_size})"


def group_lengths(k: int, g: int, ng: int, device=None) -> torch.Tensor:
    """int64 [ng]: the number of k each group covers (g, except a partial last group's K - (ng - 1) g)."""
    lengths = torch.full((ng,), g, dtype=torch.int64, device=device)
    lengths[-1] = k - (ng - 1) * g
    return lengths


def _check_weight(weight: torch.Tensor) -> None:
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 2:
        raise ValueError(
            f"weight must be 2-D [N, K] (nn.Linear orientation), got shape {tuple(weight.shape)}"
        )
    if not weight.is_floating_point():
        raise TypeError(f"weight must be a floating-point tensor, got dtype {weight.dtype}")
    if weight.device.type == "meta":
        raise ValueError("weight is on the meta device (a shape without values): it cannot be quantized")
    finite = torch.isfinite(weight)
    if not bool(finite.all()):
        n, k = (int(i) for i in (~finite).nonzero()[0])
        raise ValueError(
            f"weight has a non-finite value ({float(weight[n, k])}) at [{n}, {k}]: "
            "NaN/Inf cannot be block-quantized"
        )


def _round_to(x: torch.Tensor, dtype: torch.dtype, direction: str) -> torch.Tensor:
    """Cast float64 x to dtype, rounding towards +inf ("up") or -inf ("down")."""
    y = x.to(dtype)
    yd = y.double()
    if direction == "up":
        bad = yd < x
        y = torch.where(bad, torch.nextafter(y, torch.full_like(y, float("inf"))), y)
    else:
        bad = yd > x
        y = torch.where(bad, torch.nextafter(y, torch.full_like(y, float("-inf"))), y)
    if not bool(torch.isfinite(y).all()):
        raise ValueError(
            f"a block scale or offset does not fit in {dtype}: weights too large for this scale dtype"
        )
    return y


def quantize_weight(weight: torch.Tensor, config: QuantConfig | None = None, **kwargs) -> QuantizedWeight:
    """Quantize a float weight [N, K] in blocks along K.

    weight: float16/bfloat16/float32/float64 [N, K], any device, finite. Not modified.
    config: a QuantConfig, or its fields as keyword arguments (bits=4, group_size=128, mode="sym", ...).
    Returns a QuantizedWeight on weight's device in the plain layout.
    """
    if config is None:
        config = QuantConfig(**kwargs)
    elif kwargs:
        config = replace(config, **kwargs)
    _check_weight(weight)
    n, k = weight.shape
    g, ng = config.groups(k)
    w = pad_to_groups(weight.detach().double(), g, ng).reshape(n, ng, g)
    qmax = config.qmax
    zeros = offsets = None
    if config.mode == "sym":
        qpos = config.sym_bias - 1  # 7 or 127: largest positive code after removing the bias
        s = _round_to(w.abs().amax(-1) / qpos, config.scale_dtype, "up")
        sd = s.double()
        inv = torch.where(sd > 0, 1.0 / sd, torch.zeros_like(sd))
        q = torch.round(w * inv[..., None]) + config.sym_bias
    elif config.mode == "zero_point":
        lo = w.amin(-1).clamp(max=0.0)
        hi = w.amax(-1).clamp(min=0.0)
        s = _round_to((hi - lo) / qmax, config.scale_dtype, "up")
        sd = s.double()
        inv = torch.where(sd > 0, 1.0 / sd, torch.zeros_like(sd))
        z = torch.round(-lo * inv).clamp(0, qmax)
        zeros = z.to(torch.uint8)
        q = torch.round(w * inv[..., None]) + z[..., None]
    else:  # offset
        m = _round_to(w.amin(-1), config.scale_dtype, "down")
        md = m.double()
        s = _round_to((w.amax(-1) - md) / qmax, config.scale_dtype, "up")
        sd = s.double()
        inv = torch.where(sd > 0, 1.0 / sd, torch.zeros_like(sd))
        q = torch.round((w - md[..., None]) * inv[..., None])
        offsets = m
    q = q.clamp(0, qmax).to(torch.uint8).reshape(n, ng * g)[:, :k]
    return QuantizedWeight(
        qweight=pack_codes(q, config.bits),
        scales=s.contiguous(),
        zeros=zeros,
        offsets=offsets,
        config=config,
        shape=(n, k),
    )


def dequantize_weight(qw: QuantizedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Float weight [N, K] of the given dtype, computed exactly in float64 then cast."""
    s, m = qw.group_params_float64()
    return scale_and_shift(qw.codes().double(), s, m, qw.group_size).to(dtype)


def from_codes(
    codes: torch.Tensor,
    scales: torch.Tensor,
    config: QuantConfig,
    zeros: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
) -> QuantizedWeight:
    """Build a QuantizedWeight from unpacked codes uint8 [N, K] and group parameters, validating them."""
    if codes.dim() != 2:
        raise ValueError(f"codes must be 2-D [N, K], got shape {tuple(codes.shape)}")
    n, k = codes.shape
    _, ng = config.groups(k)
    if tuple(scales.shape) != (n, ng):
        raise ValueError(f"scales must have shape {(n, ng)}, got {tuple(scales.shape)}")
    if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
        raise TypeError(f"codes must be an integer tensor, got dtype {codes.dtype}")
    if codes.numel() and (int(codes.max()) > config.qmax or int(codes.min()) < 0):
        raise ValueError(f"codes exceed the {config.bits}-bit range [0, {config.qmax}]")
    if config.mode == "zero_point" and (zeros is None or tuple(zeros.shape) != (n, ng)):
        raise ValueError(f"mode 'zero_point' needs zeros of shape {(n, ng)}")
    zeros_bad = config.mode == "zero_point" and zeros.numel() and (
        int(zeros.min()) < 0 or int(zeros.max()) > config.qmax)
    if zeros_bad:
        raise ValueError(f"zeros exceed the {config.bits}-bit code range [0, {config.qmax}]")
    if config.mode == "offset" and (offsets is None or tuple(offsets.shape) != (n, ng)):
        raise ValueError(f"mode 'offset' needs offsets of shape {(n, ng)}")
    return QuantizedWeight(
        qweight=pack_codes(codes.to(torch.uint8), config.bits),
        scales=scales.to(config.scale_dtype).contiguous(),
        zeros=None if config.mode != "zero_point" else zeros.to(torch.uint8).contiguous(),
        offsets=None if config.mode != "offset" else offsets.to(config.scale_dtype).contiguous(),
        config=config,
        shape=(n, k),
    )
