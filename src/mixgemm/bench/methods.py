"""The methods on the scoreboard: mixgemm's paths and the peers, behind one small interface.

A :class:`Method` is found by name in :data:`REGISTRY`. ``method.unavailable()`` says why it cannot run here
(an import that fails, no GPU...) or None; ``method.applies(m, k, n)`` says why a case does not apply (e.g.
``torch._int_mm`` needs M > 16) or None. ``method.prepare(w, ctx)`` quantizes/packs the float weight
``w`` [N, K] (float32, std ~0.02, on ctx.device) once and returns a :class:`Prepared`:

* ``layer(x)``: the call that is timed; ``new_copy()`` returns another independent layer (its own copy of
  every weight tensor) for the protocol's C rotating copies.
* ``x_map(x)``: the method's input made from the benchmark's float32 activation (dtype cast, int8 codes...),
  done outside the timed region.
* ``reference(x_in)``: the exact float64 result for the weights this method stores (from the quantized
  values, so a wrong kernel cannot hide behind quantization error); ``tol``: the allowed relative error.
* ``weight_bytes()``: bytes of the weight tensors the last call read (mixgemm: its kernel layout).

Adding a method: write a ``prepare`` and append a Method to REGISTRY (or call :func:`register`).
Optional mixgemm paths are discovered by import: when their module is missing the method is listed as
unavailable with the import error as the note, never a crash.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from mixgemm.bench.method_types import (  # noqa: F401  (re-exported: the methods' interface)
    Context,
    Method,
    Prepared,
    Refused,
    mixgemm_weight_only_name,
)

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 2e-3}
ACT_QUANT_TOL = 3e-2  # per-token int8 activations: ~0.9% rms error on Gaussian rows, 3x margin
# gemlite's split-K GEMV kernels (M <= 4) add partial sums with fp16 atomics into the fp16 output, an extra
# rounding per split: measured 2.4e-3 on the H200 at M = 1 (K = 4096, 8192). This tolerance is for that peer
# only (mixgemm's methods keep 2e-3); a broken kernel is off by O(1), so the check still catches one.
GEMLITE_FP16_TOL = 5e-3


def tensor_bytes(obj) -> int:
    """Bytes of every tensor reachable in obj (tensor, dataclass, list/tuple/dict, or object attributes)."""
    seen: set[int] = set()

    def walk(o) -> int:
        if isinstance(o, torch.Tensor):
            key = o.data_ptr()
            if key in seen:
                return 0
            seen.add(key)
            return o.numel() * o.element_size()
        if isinstance(o, dict):
            return sum(walk(v) for v in o.values())
        if isinstance(o, (list, tuple)):
            return sum(walk(v) for v in o)
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return sum(walk(getattr(o, f.name)) for f in dataclasses.fields(o))
        if hasattr(o, "__dict__") and not isinstance(o, type):
            return sum(walk(v) for v in vars(o).values() if isinstance(v, (torch.Tensor, list, tuple, dict)))
        return 0

    return walk(obj)


def _ref_from_weight(w64: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: x.double() @ w64.T


def _mm_unavailable(ctx: Context) -> str | None:
    return None if ctx.device.type == "cuda" else "needs a CUDA GPU"


# ---------------------------------------------------------------------------------------------- peers
def _prep_linear(dtype: torch.dtype):
    def prepare(w: torch.Tensor, ctx: Context) -> Prepared:
        wd = w.to(dtype).contiguous()
        w64 = wd.double()

        def make(t):
            return lambda x: F.linear(x, t)

        es = wd.element_size()
        return Prepared(
            layer=make(wd), new_copy=lambda: make(wd.clone()), x_map=lambda x: x.to(dtype),
            reference=_ref_from_weight(w64), tol=TOL[dtype], weight_bytes=lambda: wd.numel() * es,
            act_bytes=es, out_bytes=es, compute="fp32" if dtype == torch.float32 else "fp16",
        )

    return prepare


def _tinygemm_inner_k_tiles(k: int) -> int | None:
    for t in (8, 4, 2):  # the largest tile count tinygemm accepts that divides K / 16
        if k % (t * 16) == 0:
            return t
    return None


def _tinygemm_unavailable(ctx: Context) -> str | None:
    if ctx.device.type != "cuda":
        return "needs a CUDA GPU"
    if not (hasattr(torch, "_convert_weight_to_int4pack") and hasattr(torch, "_weight_int4pack_mm")):
        return f"torch {torch.__version__} has no _convert_weight_to_int4pack/_weight_int4pack_mm"
    return None


def _tinygemm_applies(m, k, n, ctx) -> str | None:
    if k % 128 or n % 8 or _tinygemm_inner_k_tiles(k) is None:
        return "tinygemm needs K % 128 == 0 and N % 8 == 0"
    return None


def _prep_tinygemm(w: torch.Tensor, ctx: Context, inner: int | None = None) -> Prepared:
    """PyTorch tinygemm W4, bf16, group 128 (torch._convert_weight_to_int4pack + torch._weight_int4pack_mm).

    torch >= 2.5: the packer takes uint8 [N, K/2] with the even k in the HIGH nibble; the kernel computes
    w = (q - 8) * scale + zero from qScaleAndZeros bf16 [K/128, N, 2]. mixgemm's "sym" int4 stores q with the
    +8 bias, so zero = 0 and the bf16 scales are the ones the reference uses (exact comparison).
    """
    from mixgemm.formats import dequantize_weight, quantize_weight

    n, k = w.shape
    qw = quantize_weight(w, bits=4, group_size=128, mode="sym", scale_dtype=torch.bfloat16)
    codes = qw.codes().to(torch.int32)
    packed_u8 = ((codes[:, ::2] << 4) | codes[:, 1::2]).to(torch.uint8).contiguous()
    del codes
    inner = inner or _tinygemm_inner_k_tiles(k)
    wp = torch._convert_weight_to_int4pack(packed_u8, inner)
    s = qw.scales.t().contiguous()
    sz = torch.stack([s, torch.zeros_like(s)], dim=-1).contiguous()  # [K/128, N, 2] bf16
    w64 = dequantize_weight(qw, torch.float64)

    def make(wp_, sz_):
        return lambda x: torch._weight_int4pack_mm(x, wp_, 128, sz_)

    return Prepared(
        layer=make(wp, sz), new_copy=lambda: make(wp.clone(), sz.clone()),
        x_map=lambda x: x.to(torch.bfloat16),
        reference=_ref_from_weight(w64), tol=TOL[torch.bfloat16], weight_bytes=lambda: tensor_bytes((wp, sz)),
        act_bytes=2, out_bytes=2, note=f"inner_k_tiles={inner}",
    )


def _int_mm_applies(m, k, n, ctx) -> str | None:
    if m <= 16:
        return "torch._int_mm needs M > 16"
    if k % 8 or n % 8:
        return "torch._int_mm needs K and N multiples of 8"
    return None


def _int8_codes_per_channel(w: torch.Tensor):
    """Symmetric per-channel int8 of w via mixgemm: (codes - 128 as int8 [N, K], fp16 scales [N, 1],
    float64 dequantized weight)."""
    from mixgemm.formats import dequantize_weight, quantize_weight

    qw = quantize_weight(w, bits=8, group_size=-1, mode="sym", scale_dtype=torch.float16)
    wq = (qw.codes().to(torch.int16) - 128).to(torch.int8).contiguous()
    return wq, qw.scales.contiguous(), dequantize_weight(qw, torch.float64)


def _prep_int_mm(w: torch.Tensor, ctx: Context) -> Prepared:
    """torch._int_mm: the int8 tensor-core core alone (int8 x int8 -> int32), activations pre-quantized."""
    wq, _, _ = _int8_codes_per_channel(w)
    w64 = wq.double()

    def quant_x(x):
        s = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127
        return (x / s).round().clamp(-127, 127).to(torch.int8)

    def make(t):
        tt = t.t()  # column-major B: the layout cuBLASLt's int8 path wants
        return lambda x: torch._int_mm(x, tt)

    return Prepared(
        layer=make(wq), new_copy=lambda: make(wq.clone()), x_map=quant_x, reference=_ref_from_weight(w64),
        tol=1e-12, weight_bytes=lambda: wq.numel(), act_bytes=1, out_bytes=4, compute="int8",
        note="int8 core only: activations quantized outside the timed call, int32 out",
    )


# --------------------------------------------------------------------------------------------- gemlite
_GEMLITE_NOTE: dict = {}


def _gemlite_unavailable(ctx: Context) -> str | None:
    if ctx.device.type != "cuda":
        return "needs a CUDA GPU"
    if "error" in _GEMLITE_NOTE:
        return _GEMLITE_NOTE["error"]
    if "module" in _GEMLITE_NOTE:
        return None
    try:
        gemlite = importlib.import_module("gemlite")
        importlib.import_module("gemlite.helper")
    except Exception as e:  # any failure of an optional peer is a note, not a crash
        _GEMLITE_NOTE["error"] = f"gemlite not importable ({type(e).__name__}: {e})"
        return _GEMLITE_NOTE["error"]
    # The protocol: on GPUs gemlite has no config file for, load its configs/h100.json (tuned Triton configs)
    core = importlib.import_module("gemlite.core")
    try:
        own = core.get_default_cache_config()
    except Exception:
        own = None
    if own:
        note = f"gemlite {gemlite.__version__}, own config {os.path.basename(own)}"
    else:
        path = os.path.join(os.path.dirname(gemlite.__file__), "configs", "h100.json")
        ok = gemlite.GemLiteLinear.load_config(path)
        loaded = "loaded configs/h100.json" if ok else "no config (autotunes)"
        note = f"gemlite {gemlite.__version__}, {loaded}"
    _GEMLITE_NOTE["module"] = gemlite
    _GEMLITE_NOTE["note"] = note
    return None


def _gemlite_applies(m, k, n, ctx) -> str | None:
    return "gemlite needs K % 128 == 0" if k % 128 else None


def _gemlite_bytes(lin) -> int:
    return tensor_bytes([getattr(lin, a, None) for a in ("W_q", "scales", "zeros")])


def _prep_gemlite_w4(w: torch.Tensor, ctx: Context) -> Prepared:
    from gemlite.helper import A16W4_HQQ_INT

    from mixgemm.formats import dequantize_weight, quantize_weight

    qw = quantize_weight(w, bits=4, group_size=128, mode="sym", scale_dtype=torch.float16)
    codes = qw.codes()
    zeros = qw.zero_points().to(torch.float16)  # HQQ convention: w = (q - z) * s; sym int4 has z = 8
    dev = str(w.device)

    def build():
        proc = A16W4_HQQ_INT(device=dev, dtype=torch.float16)
        return proc.from_weights(W_q=codes, scales=qw.scales, zeros=zeros)

    lin = build()
    return Prepared(
        layer=lin, new_copy=build, x_map=lambda x: x.to(torch.float16),
        reference=_ref_from_weight(dequantize_weight(qw, torch.float64)), tol=GEMLITE_FP16_TOL,
        weight_bytes=lambda: _gemlite_bytes(lin), act_bytes=2, out_bytes=2,
        note=_GEMLITE_NOTE.get("note", ""),
    )


def _prep_gemlite_w8(act_quant: bool):
    def prepare(w: torch.Tensor, ctx: Context) -> Prepared:
        from gemlite.helper import A16W8_INT8, A8W8_INT8_dynamic

        wq, scales, w64 = _int8_codes_per_channel(w)
        dev = str(w.device)
        cls = A8W8_INT8_dynamic if act_quant else A16W8_INT8

        def build():
            return cls(device=dev, dtype=torch.float16).from_weights(weight=wq.clone(), scales=scales.clone())

        lin = build()
        return Prepared(
            layer=lin, new_copy=build, x_map=lambda x: x.to(torch.float16), reference=_ref_from_weight(w64),
            tol=ACT_QUANT_TOL if act_quant else GEMLITE_FP16_TOL, weight_bytes=lambda: _gemlite_bytes(lin),
            act_bytes=2, out_bytes=2, compute="int8" if act_quant else "fp16",
            note=_GEMLITE_NOTE.get("note", "") + (", per-token int8 x made in the call" if act_quant else ""),
        )

    return prepare


# --------------------------------------------------------------------------------------------- mixgemm
class _TrackedLayouts(dict):
    """QuantizedWeight's layout cache that records which kernel layouts a call read."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.read: set = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def _resident(qw, layout: str | None):
    """qw as the benchmark calls it: with its layout cache tracked, and for ``layout`` (compact) holding only that
    layout over a placeholder of its codes, as a compacted QuantLinear does (QuantLinear.compact_)."""
    if layout is None:
        return dataclasses.replace(qw, _layouts=_TrackedLayouts())
    from mixgemm.formats.weight import compact_placeholder
    from mixgemm.ops.custom_ops import compact_weight

    one = compact_weight(qw, compact_placeholder(qw.qweight), layout)
    return dataclasses.replace(one, _layouts=_TrackedLayouts(one._layouts))


def _prep_mixgemm_weight_only(bits: int, group_size: int | None, mode: str = "sym", resident: str | None = None):
    """mixgemm.matmul(x, qw): W{bits}A16 in weight mode ``mode`` ("sym" or "zero_point"); group_size None = the
    context's (W4) group size; resident: the one layout the weight keeps (compacted), None for every layout."""

    def prepare(w: torch.Tensor, ctx: Context) -> Prepared:
        import mixgemm
        from mixgemm.formats import dequantize_weight, quantize_weight

        g = ctx.group_size if group_size is None else group_size
        qw0 = quantize_weight(w, bits=bits, group_size=g, mode=mode, scale_dtype=torch.float16)
        first = _resident(qw0, resident)
        w64 = dequantize_weight(qw0, torch.float64)

        def clone():
            c = lambda t: None if t is None else t.clone()
            return _resident(dataclasses.replace(qw0, qweight=c(qw0.qweight), scales=c(qw0.scales),
                                                 zeros=c(qw0.zeros), offsets=c(qw0.offsets), _layouts={}), resident)

        def make(qw):
            return lambda x: mixgemm.matmul(x, qw)

        def weight_bytes() -> int:
            read = first._layouts.read
            if not read:  # the call read the plain layout (CPU fallback)
                return qw0.nbytes()
            return sum(tensor_bytes(first._layouts[name]) for name in sorted(read))

        def before_call():
            first._layouts.read.clear()

        dtype = ctx.dtype
        return Prepared(
            layer=make(first), new_copy=lambda: make(clone()), x_map=lambda x: x.to(dtype),
            reference=_ref_from_weight(w64), tol=TOL[dtype], weight_bytes=weight_bytes,
            act_bytes=torch.finfo(dtype).bits // 8, out_bytes=torch.finfo(dtype).bits // 8,
            compute="fp32" if dtype == torch.float32 else "fp16", before_call=before_call,
            chosen=lambda x: mixgemm.explain(x, first).kernel,
        )

    # (the layout a compacted weight keeps, and this method's prepare for such a weight: _compact_methods)
    prepare.resident_variant = ("wgmma_v1", lambda layout: _prep_mixgemm_weight_only(bits, group_size, mode, layout))
    return prepare


def _prep_mixgemm_a8(bits: int, group_size: int | None, act_block: str = "group", int_scales: bool = False,
                     resident: str | None = None):
    """mixgemm.ops.int8.matmul_a8(x, qw, "sym"): activations quantized per token and per weight group (act_block
    "token": per token) to int8 inside the call (fused quantizer + int8 tensor-core GEMM), W{bits} symmetric;
    int_scales: int4 weights with integer group scales (formats/int_scales.py); resident: as for the weight-only
    methods."""

    def prepare(w: torch.Tensor, ctx: Context) -> Prepared:
        import mixgemm
        from mixgemm.formats import dequantize_weight, quantize_activation, quantize_weight
        from mixgemm.formats.int_scales import quantize_weight_int_scales
        from mixgemm.ops.int8 import matmul_a8

        g = ctx.group_size if group_size is None else group_size
        if int_scales:
            qw0 = quantize_weight_int_scales(w, group_size=g, scale_dtype=torch.float16)
        else:
            qw0 = quantize_weight(w, bits=bits, group_size=g, mode="sym", scale_dtype=torch.float16)
        first = _resident(qw0, resident)
        w64 = dequantize_weight(qw0, torch.float64)

        def reference(x):
            # The exact result of the int8 scheme: x quantized like the kernel does (float32 math, per token and
            # per weight group), then the float64 product; equal to mixgemm.reference.block_int_gemm without its
            # [G, M, N] int64 intermediate (too large for 8192 x 28672).
            blk = -1 if act_block == "token" else qw0.group_size
            return quantize_activation(x, blk, "sym").dequantize() @ w64.T

        def clone():
            c = lambda t: None if t is None else t.clone()
            return _resident(dataclasses.replace(qw0, qweight=c(qw0.qweight), scales=c(qw0.scales),
                                                 zeros=c(qw0.zeros), offsets=c(qw0.offsets), _layouts={}), resident)

        def make(qw):
            return lambda x: matmul_a8(x, qw, "sym", act_block=act_block)

        def weight_bytes() -> int:
            read = first._layouts.read
            return sum(tensor_bytes(first._layouts[n]) for n in sorted(read)) if read else qw0.nbytes()

        dtype = ctx.dtype
        es = torch.finfo(dtype).bits // 8
        return Prepared(
            layer=make(first), new_copy=lambda: make(clone()), x_map=lambda x: x.to(dtype), reference=reference,
            tol=TOL[dtype], weight_bytes=weight_bytes, act_bytes=es, out_bytes=es, compute="int8",
            before_call=first._layouts.read.clear,
            note=f"int8 activations per token{' and group' if act_block == 'group' else ''}, made in the call",
            chosen=lambda x: mixgemm.explain(x, first, act_mode="sym", act_block=act_block).kernel,
        )

    prepare.resident_variant = ("wgmma_a8_v1",
                                lambda layout: _prep_mixgemm_a8(bits, group_size, act_block, int_scales, layout))
    return prepare


def _module_unavailable(*modules: str):
    """unavailable() for a method that needs importable modules (optional mixgemm paths)."""

    def check(ctx: Context) -> str | None:
        for mod in modules:
            try:
                importlib.import_module(mod)
            except Exception as e:
                return f"{mod} not importable ({type(e).__name__}: {e})"
        return None

    return check


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]


BASELINE_GPU = "fp16 cuBLAS"
BASELINE_CPU = "fp32 torch"
# a CPU run's baseline: torch.nn.functional.linear in the activation dtype of mixgemm's methods (like with like)
CPU_BASELINES = {torch.float32: BASELINE_CPU, torch.bfloat16: "bf16 torch", torch.float16: "fp16 torch"}

REGISTRY: list[Method] = [
    Method(BASELINE_GPU, "peer", _prep_linear(torch.float16), _mm_unavailable,
           description="F.linear, fp16 weights and activations"),
    Method("bf16 cuBLAS", "peer", _prep_linear(torch.bfloat16), _mm_unavailable,
           description="F.linear, bf16 weights and activations"),
    Method(BASELINE_CPU, "peer", _prep_linear(torch.float32), cpu=True, default=False,
           description="F.linear in float32 (the CPU baseline at --dtype fp32; on a GPU with --dtype fp32)"),
    Method(CPU_BASELINES[torch.bfloat16], "peer", _prep_linear(torch.bfloat16), cpu=True, default=False,
           description="F.linear in bfloat16 (the CPU baseline at --dtype bf16)"),
    Method(CPU_BASELINES[torch.float16], "peer", _prep_linear(torch.float16), cpu=True, default=False,
           description="F.linear in float16 (the CPU baseline at --dtype fp16)"),
    Method("tinygemm W4 g128", "peer", _prep_tinygemm, _tinygemm_unavailable, _tinygemm_applies,
           description="torch._weight_int4pack_mm, bf16 activations, group 128, inner_k_tiles 8"),
    Method("tinygemm W4 g128 ikt4", "peer", lambda w, ctx: _prep_tinygemm(w, ctx, 4), _tinygemm_unavailable,
           _tinygemm_applies, default=False, description="tinygemm with inner_k_tiles 4 (diagnostic)"),
    Method("tinygemm W4 g128 ikt2", "peer", lambda w, ctx: _prep_tinygemm(w, ctx, 2), _tinygemm_unavailable,
           _tinygemm_applies, default=False, description="tinygemm with inner_k_tiles 2 (diagnostic)"),
    Method("torch._int_mm", "peer", _prep_int_mm, _mm_unavailable, _int_mm_applies,
           description="int8 x int8 -> int32 tensor-core core (M > 16), activations pre-quantized"),
    Method("gemlite W4 g128", "peer", _prep_gemlite_w4, _gemlite_unavailable, _gemlite_applies,
           description="gemlite A16W4 (HQQ int), fp16, group 128"),
    Method("gemlite W8", "peer", _prep_gemlite_w8(False), _gemlite_unavailable, _gemlite_applies, quick=False,
           description="gemlite A16W8 int8 per-channel (no tuned config in h100.json: autotunes, ~50 s)"),
    Method("gemlite A8W8", "peer", _prep_gemlite_w8(True), _gemlite_unavailable, _gemlite_applies,
           description="gemlite A8W8 int8 dynamic (per-token activations, per-channel weights)"),
]


def register(method: Method) -> None:
    """Add (or replace, by name) a method in the registry."""
    for i, m in enumerate(REGISTRY):
        if m.name == method.name:
            REGISTRY[i] = method
            return
    REGISTRY.append(method)


def mixgemm_methods(bits_list: list[int], group_size: int) -> list[Method]:
    """mixgemm's methods for the requested bit widths: W4 at ``group_size``, W8 per-channel; weight-only
    (mixgemm.matmul) and, when mixgemm.ops.int8 is importable, activation-quantized (matmul_a8)."""
    out = []
    for bits in bits_list:
        g = group_size if bits == 4 else -1
        out.append(Method(mixgemm_weight_only_name(bits, g), "mixgemm", _prep_mixgemm_weight_only(bits, g),
                          _module_unavailable("mixgemm.ops.matmul"), cpu=True,
                          description=f"mixgemm.matmul, W{bits} sym, GEMV (M <= 16) / GEMM dispatch"))
        if bits == 4 and g != -1:  # the asymmetric format (GPTQ/AWQ-style zero points): an acceptance target too
            out.append(Method(mixgemm_weight_only_name(bits, g, "zero_point"), "mixgemm",
                              _prep_mixgemm_weight_only(bits, g, "zero_point"),
                              _module_unavailable("mixgemm.ops.matmul"), cpu=True, default=False,
                              description=f"mixgemm.matmul, W{bits} with uint8 zero points per group"))
    for bits in bits_list:
        g = group_size if bits == 4 else -1
        gname = "per-channel" if g == -1 else f"g{g}"
        out.append(Method(f"mixgemm W{bits}A8 {gname}", "mixgemm", _prep_mixgemm_a8(bits, g),
                          _module_unavailable("mixgemm.ops.int8", "mixgemm.kernels.triton_a8.int8_gemm",
                                              "mixgemm.kernels.triton.act_quant"),
                          applies=_a8_applies(bits, g),
                          description=f"mixgemm.ops.int8.matmul_a8, W{bits} sym, int8 activations (sym) per token"))
        if g != -1:  # one activation scale per token over the grouped weight (torchao's 8da4w); same thing per-channel
            out.append(Method(f"mixgemm W{bits}A8 {gname} act per-token", "mixgemm", _prep_mixgemm_a8(bits, g, "token"),
                              _module_unavailable("mixgemm.ops.int8", "mixgemm.kernels.triton_a8.int8_gemm",
                                                  "mixgemm.kernels.triton.act_quant"),
                              applies=_a8_applies(bits, g), default=False,
                              description=f"mixgemm.ops.int8.matmul_a8(act_block='token'), W{bits} sym {gname}, "
                                          "int8 activations (sym) with one scale per token"))
        if g != -1 and bits == 4:  # the same with integer group scales: the int8 GEMM runs without the per-group fold
            out.append(Method(f"mixgemm W4A8 {gname} int-scales act per-token", "mixgemm",
                              _prep_mixgemm_a8(4, g, "token", int_scales=True),
                              _module_unavailable("mixgemm.ops.int8", "mixgemm.kernels.triton_a8.int8_gemm",
                                                  "mixgemm.kernels.triton.act_quant"),
                              applies=_a8_applies(4, g), default=False,
                              description=f"mixgemm.ops.int8.matmul_a8(act_block='token'), W4 sym {gname} with "
                                          "integer group scales (formats/int_scales.py), int8 activations per token"))
    return out + _compact_methods(out)


def _compact_methods(methods: list[Method]) -> list[Method]:
    """"<method> compact" for each mixgemm method: the same weight holding only the layout its Hopper kernels read
    (QuantLinear.compact_), so one run times the plain and the compacted weight side by side."""
    out = []
    for m in methods:
        variant = getattr(m.prepare, "resident_variant", None)
        if variant is None:
            continue
        layout, prepare_for = variant
        out.append(dataclasses.replace(
            m, name=f"{m.name} compact", prepare=prepare_for(layout), cpu=False, default=False,
            unavailable=_compact_unavailable(m.unavailable),
            description=f"{m.description}; the weight keeps only {layout} (QuantLinear.compact_)"))
    return out


def _compact_unavailable(inner):
    def check(ctx: Context) -> str | None:
        why = inner(ctx)
        if why is None and (ctx.device.type != "cuda" or torch.cuda.get_device_capability(ctx.device) < (9, 0)):
            return "a compacted weight's layouts are read by the sm_90 kernels"
        return why

    return check


def _a8_applies(bits: int, g: int):
    def applies(m, k, n, ctx) -> str | None:
        if ctx.device.type != "cuda":
            return "GPU only"
        if bits == 4 and k % 64:
            return "4-bit weights need K % 64 == 0"
        return None

    return applies


def all_methods(bits_list: list[int], group_size: int) -> list[Method]:
    from mixgemm.bench import read_ceiling

    return mixgemm_methods(bits_list, group_size) + list(REGISTRY) + read_ceiling.methods()


def select(methods: list[Method], spec: str | None, device: str, quick: bool = False,
           dtype: torch.dtype = torch.float32) -> list[Method]:
    """Methods named by spec (comma list; each item an exact name or a case-insensitive substring;
    'all' for every method; None for the defaults, less the slow ones with quick). On the CPU only CPU
    methods run, and the defaults add the CPU baseline of ``dtype`` (the activation dtype)."""
    if spec in (None, "", "default"):
        chosen = [m for m in methods
                  if (m.default and (m.quick or not quick)) or (device == "cpu" and m.name == CPU_BASELINES[dtype])]
    elif spec == "all":
        chosen = list(methods)
    else:
        chosen = []
        for item in (s.strip() for s in spec.split(",")):
            if not item:
                continue
            exact = [m for m in methods if m.name == item]
            hits = exact or [m for m in methods if item.lower() in m.name.lower()]
            if not hits:
                raise ValueError(f"no method matches {item!r}; known: {', '.join(m.name for m in methods)}")
            chosen += [m for m in hits if m not in chosen]
    if device == "cpu":
        chosen = [m for m in chosen if m.cpu]
    return chosen
