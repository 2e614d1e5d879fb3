"""mixgemm's ops registered with torch.library, so that torch.compile(fullgraph=True), CUDA graphs and
torch.export see them as single opaque nodes.

Ops (all take plain tensors; a weight is its plain interchange tensors, see mixgemm.formats.weight):

* ``torch.ops.mixgemm.linear_wxa16(x, qweight, scales, zeros, offsets, bias, bits, group_size, mode, N, K,
  lo, hi, input_perm=None)`` -> ``clamp(x @ dequant(W).T + bias, lo, hi)``, [..., N] in x.dtype. Weight-only
  quantization: CUDA kernels through mixgemm.ops.dispatch.cuda_matmul, the CPU fallback of
  mixgemm.matmul on the CPU. ``input_perm`` (int64 [K], act-order layers): x[..., input_perm] is multiplied
  instead of x; the GEMVs gather it while reading x (no separate kernel, mixgemm.ops.dispatch.run_linear).
* ``torch.ops.mixgemm.linear_wxa8(x, qweight, scales, zeros, offsets, bias, bits, group_size, mode, N, K,
  act_mode, lo, hi)``: the same with the activations quantized to int8 per token and per block (block =
  the weight's group size; ``act_mode`` one of formats.activation.ACT_MODES), i.e. W8A8 / W4A8, through
  mixgemm.ops.int8.matmul_a8: the int8 tensor-core Triton kernels on CUDA, the float64 reference
  (quantize_activation + block_int_gemm) on the CPU. Layers the kernel cannot take (4-bit with K not a
  multiple of 64 / 128) run the reference on CUDA too, with a warning.
* ``torch.ops.mixgemm.conv2d_wxa16(x, qweight, scales, zeros, offsets, bias, bits, group_size, mode,
  weight_shape, stride, padding, dilation, groups, lo, hi)``: conv2d with a QuantizedConvWeight's matrix
  (reference path, any device).
* ``torch.ops.mixgemm.dequantize(qweight, scales, zeros, offsets, bits, group_size, mode, N, K)``: the float32 weight
  [N, K] (the linear ops' backward; reads a compacted layer's resident layout).
* ``torch.ops.mixgemm.experts(hidden_states, top_k_index, top_k_weights, key)``: a quantized MoE experts module's
  forward as one node (defined in mixgemm.nn.experts, which says why it takes a key).
* ``torch.ops.mixgemm.gather_columns(x, perm)``: ``x[..., perm]`` (the PDL gather kernel at decode sizes), and
  ``torch.ops.mixgemm.rms_norm(x, weight, eps, perm=None)`` / ``add_rms_norm(a, b, weight, eps, perm=None)``:
  transformers' RMSNorm (of a + b, returned too), gathered through ``perm`` when given, in one kernel on CUDA. The
  norms feeding mixgemm layers run them under torch.compile (mixgemm.nn.norms).

Argument conventions: qweight uint8 [N, ceil(K * bits / 8)]; scales [N, G] (its dtype is the scale dtype);
zeros uint8 [N, G] for mode "zero_point", otherwise None (an empty tensor is accepted and ignored); offsets [N, G] for
mode "offset", otherwise None (or empty); bias [N] or None. Why None: under torch.compile every tensor a module
hands an op is guarded on each call (about a microsecond per tensor in the TorchDynamo cache lookup, ~900 layers in
an 8B model), so a layer passes only the tensors its mode reads; group_size -1 for per-channel; lo / hi the output clamp
(mixgemm.epilogue.clamp_bounds; +-inf for none).

Kernel layouts. The kernels repack the plain weight once into their own layouts, cached on a
QuantizedWeight (``QuantizedWeight.layout``). Inside an op we only get raw tensors, so the op rebuilds a
QuantizedWeight around them (a cheap dataclass, no copy) and must find the cached layouts again. Choice:
the QuantizedWeight is cached as an attribute *on the qweight tensor object itself*, together with a
signature (data pointers, in-place version counters, shapes, dtypes, format). Why not a global dict
keyed by (data_ptr, device), as first planned: a global dict either keeps every weight alive forever
(dropped models never free their memory) or, with weak entries, can hand a new tensor that reuses a
freed address the old weight's layout. On the tensor, the cache lives exactly as long as the weight;
the version counters catch in-place updates (load_state_dict copies into the buffers in place), and
a different tensor object (after .to(), or a compiler passing a fresh alias) just rebuilds. QuantLinear
passes its buffers, which are the same objects in eager mode, in torch.compile'd graphs and in CUDA-graph
replays (where the Python side does not run at all). Passing the layout tensors themselves through the
op was rejected: each kernel owns its layout (and the dispatcher picks the kernel), so the module would
have to know every kernel's layout.

CUDA graphs: none of these ops synchronizes with the host; the linear op allocates only its output
(plus what the kernel documents). The layouts are built on the first (eager / warm-up) call, before
any capture.
"""

import functools
import math
import warnings
import weakref
from dataclasses import replace
from typing import Optional

import torch
from torch import Tensor

from mixgemm.epilogue import ACTIVATIONS, clamp_bounds
from mixgemm.formats.conv import QuantizedConvWeight
from mixgemm.formats.packing import packed_width
from mixgemm.formats.weight import PER_CHANNEL, QuantConfig, QuantizedWeight, is_compact_placeholder
from mixgemm.ops.direct_codegen import install_if_inductor
from mixgemm.ops.kept_launches import forget, keep, kept, run_kept, version_of, weight_token

_CACHE_ATTR = "_mixgemm_qw"
_ACT_BY_BOUNDS = {v: k for k, v in ACTIVATIONS.items() if k != "none"}  # (lo, hi) -> activation name


def mode_params(mode: str, zeros: Tensor | None, offsets: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """(zeros, offsets) with the one the mode does not read (both, for "sym") as None."""
    return (zeros if mode == "zero_point" else None), (offsets if mode == "offset" else None)


def _sig(t: Tensor | None) -> tuple:
    if t is None:
        return ()
    return (t.data_ptr(), version_of(t), tuple(t.shape), t.dtype) if t.numel() else (0, 0, tuple(t.shape), t.dtype)


def weight_from_tensors(qweight: Tensor, scales: Tensor, zeros: Tensor | None, offsets: Tensor | None, bits: int,
                        group_size: int, mode: str, n: int, k: int) -> QuantizedWeight:
    """The QuantizedWeight [N, K] made of these plain tensors (zeros / offsets: None or empty when the mode has
    none; ignored then), cached on ``qweight`` so that its kernel layouts are built once (see the module
    docstring)."""
    # the tensors a mode does not read are dropped, so that callers passing None or an empty placeholder (the eager
    # path passes the module's buffers, the compiled one None) meet the same cache entry
    zeros, offsets = mode_params(mode, zeros, offsets)
    hit = getattr(qweight, _CACHE_ATTR, None)
    fmt = (bits, group_size, mode, n, k)
    # fast path (every eager call): the same tensor objects, unchanged in place -- identity and version counters
    if hit is not None and hit[2] is scales and hit[3] is zeros and hit[4] is offsets and hit[5] == _fast_key(
            qweight, scales, zeros, offsets, fmt):
        return hit[1]
    sig = (qweight.device, _sig(qweight), _sig(scales), _sig(zeros), _sig(offsets), *fmt)
    if hit is not None and hit[0] == sig:  # equal tensors through other objects (aliases): keep the layouts
        setattr(qweight, _CACHE_ATTR, (sig, hit[1], scales, zeros, offsets, _fast_key(qweight, scales, zeros,
                                                                                      offsets, fmt)))
        return hit[1]
    if is_compact_placeholder(qweight):
        return _resident_weight(qweight, hit, scales, zeros, offsets, fmt)
    config = QuantConfig(bits=bits, group_size=group_size, mode=mode, scale_dtype=scales.dtype)
    _, ng = config.groups(k)
    width = packed_width(k, bits)
    if qweight.dtype != torch.uint8 or tuple(qweight.shape) != (n, width):
        raise ValueError(f"qweight must be uint8 [{n}, {width}] (ceil(K * bits / 8)), got {qweight.dtype} "
                         f"{tuple(qweight.shape)}")
    if tuple(scales.shape) != (n, ng):
        raise ValueError(f"scales must be [{n}, {ng}], got {tuple(scales.shape)}")
    need_z, need_m = mode == "zero_point", mode == "offset"
    if need_z and (zeros is None or zeros.dtype != torch.uint8 or tuple(zeros.shape) != (n, ng)):
        raise ValueError(f"mode 'zero_point' needs zeros uint8 [{n}, {ng}], got {_describe(zeros)}")
    if need_m and (offsets is None or offsets.dtype != scales.dtype or tuple(offsets.shape) != (n, ng)):
        raise ValueError(f"mode 'offset' needs offsets {scales.dtype} [{n}, {ng}], got {_describe(offsets)}")
    for t, name in ((scales, "scales"), (zeros, "zeros"), (offsets, "offsets")):
        if t is not None and t.numel() and t.device != qweight.device:
            raise ValueError(f"device mismatch: {name} on {t.device}, qweight on {qweight.device}")
    qw = QuantizedWeight(
        qweight=qweight,
        scales=scales,
        zeros=zeros,
        offsets=offsets,
        config=config,
        shape=(n, k),
    )
    return cache_weight(qweight, qw)


def cache_weight(qweight: Tensor, qw: QuantizedWeight) -> QuantizedWeight:
    """Cache ``qw`` (the weight over these tensors, with its layouts) on the qweight tensor, where weight_from_tensors
    finds it; returns qw."""
    zeros, offsets = mode_params(qw.mode, qw.zeros, qw.offsets)
    fmt = (qw.bits, qw.config.group_size, qw.mode, *qw.shape)
    sig = (qweight.device, _sig(qweight), _sig(qw.scales), _sig(zeros), _sig(offsets), *fmt)
    setattr(qweight, _CACHE_ATTR, (sig, qw, qw.scales, zeros, offsets, _fast_key(qweight, qw.scales, zeros, offsets,
                                                                                 fmt)))
    if qw.resident is not None and qw.qweight is qweight:
        key = _storage_key(qweight)
        _RESIDENT_BY_STORAGE[key] = weakref.ref(qw, functools.partial(_drop_resident, key))
    return qw


# Resident-only weights by their placeholder's storage, for aliases of the placeholder that do not carry the cache
# attribute (torch.compile's backward hands the op such an alias). Sound without the lifetime issue of a global cache
# (module docstring): an entry holds the weight weakly, the weight holds its placeholder, so while an entry is live
# its storage cannot be freed and the address not reused; a dropped weight removes its entry.
_RESIDENT_BY_STORAGE: dict = {}


def _drop_resident(key: tuple, ref: weakref.ref) -> None:
    if _RESIDENT_BY_STORAGE.get(key) is ref:  # (a later weight over the same placeholder replaced it: keep that one)
        del _RESIDENT_BY_STORAGE[key]


def _storage_key(t: Tensor) -> tuple:
    return (t.device, t.untyped_storage().data_ptr())


def _resident_weight(qweight: Tensor, hit, scales: Tensor, zeros: Tensor | None, offsets: Tensor | None,
                     fmt: tuple) -> QuantizedWeight:
    """The resident-only weight of a compacted layer's placeholder qweight (mixgemm.formats.weight
    compact_placeholder): the one cached on it, for this format. Where the parameter tensors are others or changed
    in place (a deep copy, an in-place update), the layout is rebuilt from its own codes and the given parameters.
    A placeholder without one has no codes to read: a clear error."""
    qw = None if hit is None else hit[1]
    alias = qw is None or qw.resident is None
    if alias:  # an alias of a placeholder (the same storage) without the attribute
        ref = _RESIDENT_BY_STORAGE.get(_storage_key(qweight))
        qw = None if ref is None else ref()
    if qw is None or qw.resident is None or (qw.bits, qw.config.group_size, qw.mode, *qw.shape) != fmt:
        raise ValueError("qweight is the placeholder of a compacted layer (QuantLinear.compact_): it holds no codes, "
                         "and no resident layout of this format is cached on it; use the layer itself, or "
                         "uncompact_() it first")
    now = (_sig(scales), _sig(zeros), _sig(offsets))
    cached = getattr(qw.qweight, _CACHE_ATTR, None)
    if cached is not None and cached[1] is qw:
        # against the parameters' signatures from when the layout was cached: the layout holds its own copy of them,
        # so an in-place update of the layer's (the same tensor objects, a newer version) must rebuild it too
        same = cached[0][2:5] == now
    else:
        mine = mode_params(qw.mode, qw.zeros, qw.offsets)
        same = now == (_sig(qw.scales), _sig(mine[0]), _sig(mine[1]))
    if not same:
        plain = replace(qw, qweight=qw.packed(), scales=scales, zeros=zeros, offsets=offsets, resident=None,
                        _layouts={})
        qw = compact_weight(plain, qweight, qw.resident)
    elif alias:
        return qw  # (cached on the placeholder it was made for)
    elif qw.qweight is not qweight:  # (a deep copy's cached weight holds a copy of the placeholder)
        qw = replace(qw, qweight=qweight)
    return cache_weight(qweight, qw)


def compact_weight(qw: QuantizedWeight, placeholder: Tensor, name: str = "wgmma_v1") -> QuantizedWeight:
    """A weight over qw's parameters that keeps only its ``name`` layout (built from qw, or qw's cached one) with
    ``placeholder`` (compact_placeholder) as its qweight. qw is not modified."""
    from mixgemm.formats.weight import RESIDENT_LAYOUTS

    if name not in RESIDENT_LAYOUTS:
        raise ValueError(f"a weight can keep one of {sorted(RESIDENT_LAYOUTS)} as its resident layout, got {name!r}")
    lay = qw.layout(name, RESIDENT_LAYOUTS[name].build)
    return replace(qw, qweight=placeholder, _layouts={name: lay}, resident=name)


def _describe(t: Tensor | None) -> str:
    return "None" if t is None else f"{t.dtype} {tuple(t.shape)}"


def _fast_key(qweight: Tensor, scales: Tensor, zeros: Tensor | None, offsets: Tensor | None, fmt: tuple) -> tuple:
    # (.data reassignment swaps the storage without a version bump: the data pointers catch it)
    return (version_of(qweight), version_of(scales), version_of(zeros), version_of(offsets), qweight.data_ptr(),
            scales.data_ptr(), fmt)


def drop_cached(qweight: Tensor) -> None:
    """Drop the weight (with its layouts and plans) and the launches the ops cached on this qweight tensor. They hold
    the tensor in a reference cycle (the weight refers to it), which only the garbage collector would free: a layer
    that stops using a tensor (compact_) calls this so that its memory goes at once."""
    qweight.__dict__.pop(_CACHE_ATTR, None)
    forget(qweight.__dict__)


def cached_weight(qweight: Tensor) -> QuantizedWeight | None:
    """The QuantizedWeight the ops cached on this qweight tensor (with its kernel layouts), or None."""
    hit = getattr(qweight, _CACHE_ATTR, None)
    return None if hit is None else hit[1]


def _activation_for(lo: float, hi: float) -> tuple[str | None, bool]:
    """(activation name the matmul epilogue fuses, whether an extra clamp is still needed)."""
    name = _ACT_BY_BOUNDS.get((float(lo), float(hi)))
    return (name, False) if (name is not None or (lo, hi) == (-math.inf, math.inf)) else (None, True)


_warned: set = set()

# The ops are defined through a torch.library.Library with one Python kernel for every device
# (CompositeExplicitAutograd), their fake (meta) functions and backward registered with torch.library.register_fake /
# register_autograd. Why not @torch.library.custom_op: its per-call wrappers (an output-aliasing check, a boxed
# redispatch below autograd) made a call of linear_wxa16's signature cost 27 us of dispatch against 18 here (2-core
# CPU, tools/profile/op_dispatch.py), paid per layer and token under torch.compile without CUDA graphs. What
# custom_op checked at every call -- the output is a new tensor, never an input or a view of one -- each kernel here
# guarantees (every path allocates its output).
_LIB = torch.library.Library("mixgemm", "FRAGMENT")


def define_op(schema: str, no_grad: bool = False):
    """Define torch.ops.mixgemm.<name> with ``schema`` ("name(args) -> Tensor") and the decorated function as its
    kernel on every device; the function is returned unchanged. ``no_grad``: also define the overload
    ``<name>.no_grad``, the same kernel with no autograd kernel (see NO_GRAD)."""
    name, args = schema.split("(", 1)

    def register(fn):
        for overload in (name, f"{name}.{NO_GRAD}") if no_grad else (name,):
            _LIB.define(f"{overload}({args}")
            _LIB.impl(overload, fn, "CompositeExplicitAutograd")
        return fn

    return register


# The linear ops' overload for calls that record no gradient (QuantLinear under torch.compile when neither x nor the
# bias needs one): the same kernel, without the Python autograd kernel that register_autograd puts in front of every
# call of the default overload, also under no_grad (4.0 against 8.5 us a call on the 2-core CPU,
# tools/profile/op_dispatch.py), paid per layer under torch.compile without CUDA graphs.
NO_GRAD = "no_grad"


def register_fake_ops(*names: str):
    """torch.library.register_fake for these ops ("name" or "name.overload"). The fake function runs while a compiler
    traces the op; it also installs the direct calls of inductor's generated code (mixgemm.ops.compiled_calls) when
    inductor is the compiler."""

    def register(fn):
        @functools.wraps(fn)
        def fake(*args, **kwargs):
            install_if_inductor()
            return fn(*args, **kwargs)

        for name in names:
            torch.library.register_fake(f"mixgemm::{name}", fake)
        return fn

    return register


def register_fake_all(name: str):
    """register_fake_ops for the op ``name`` and its no_grad overload."""
    return register_fake_ops(name, f"{name}.{NO_GRAD}")


def _cuda_linear(x: Tensor, qw: QuantizedWeight, bias: Tensor | None, activation: str | None,
                 input_perm: Tensor | None = None) -> Tensor:
    from mixgemm.kernels.registry import NoKernel
    from mixgemm.ops.dispatch import cuda_matmul

    try:
        return cuda_matmul(x, qw, bias, activation, input_perm)
    except (ImportError, NoKernel) as e:
        # No kernel of this build takes the layer (e.g. no Triton for the prefill GEMM): run the dequantized fp GEMM
        # instead, loudly, rather than failing a whole model.
        key = str(e)
        if key not in _warned:
            _warned.add(key)
            warnings.warn(f"mixgemm: kernel unavailable ({e}); falling back to a dequantized F.linear", stacklevel=2)
        from mixgemm.formats.weight import dequantize_weight

        lo, hi = ACTIVATIONS[activation]
        if input_perm is not None:
            x = x[..., input_perm]
        y = torch.nn.functional.linear(x, dequantize_weight(qw, x.dtype), None if bias is None else bias.to(x.dtype))
        return y.clamp(lo, hi) if activation is not None else y


@define_op("linear_wxa16(Tensor x, Tensor qweight, Tensor scales, Tensor? zeros, Tensor? offsets, Tensor? bias, "
           "SymInt bits, SymInt group_size, str mode, SymInt N, SymInt K, float lo, float hi, "
           "Tensor? input_perm=None) -> Tensor", no_grad=True)
def linear_wxa16(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Optional[Tensor], offsets: Optional[Tensor],  # noqa: UP045
                 bias: Optional[Tensor],  # noqa: UP045  (the form torch.library's schema inference lists)
                 bits: int, group_size: int, mode: str, N: int, K: int, lo: float, hi: float,
                 input_perm: Optional[Tensor] = None) -> Tensor:  # noqa: UP045
    """clamp(x[..., input_perm] @ dequant(W).T + bias, lo, hi): x float16/bfloat16/float32 [..., K] -> [..., N] in
    x.dtype (input_perm None: x itself)."""
    zeros, offsets = mode_params(mode, zeros, offsets)
    # a repeated call (each layer's, every step, under torch.compile without CUDA graphs): the launch kept on qweight
    key = (x.shape, x.dtype, x.get_device(), bits, group_size, mode, N, K, lo, hi)
    hit = kept(qweight.__dict__, key) if input_perm is None else None
    if hit is not None and hit.token == weight_token(qweight, scales, zeros, offsets):
        y = run_kept(hit, x, bias)
        if y is not None:
            return y
    qw = weight_from_tensors(qweight, scales, zeros, offsets, bits, group_size, mode, N, K)
    activation, extra_clamp = _activation_for(lo, hi)
    _check_input_perm(input_perm, x, K)
    if x.device.type == "cpu":
        from mixgemm.ops.matmul import matmul

        return _clamped(matmul(x if input_perm is None else x[..., input_perm], qw, bias, activation), lo, hi,
                        extra_clamp)
    # checks the inputs (in full when it makes the weight's plan)
    y = _cuda_linear(x, qw, bias, activation, input_perm)
    if input_perm is None and not extra_clamp:
        from mixgemm.ops.dispatch import plan_launch

        a, b = clamp_bounds(activation)
        keep(qweight.__dict__, key, weight_token(qweight, scales, zeros, offsets), plan_launch(qw, x), N, a, b, x)
    return _clamped(y, lo, hi, extra_clamp)


def _clamped(y: Tensor, lo: float, hi: float, extra_clamp: bool) -> Tensor:
    return y.clamp(lo, hi) if extra_clamp else y


def _check_input_perm(perm: Optional[Tensor], x: Tensor, k: int) -> None:  # noqa: UP045
    """An act-order input permutation argument: int64 [K] on x's device (its values are checked where the module
    gets it: QuantLinear)."""
    if perm is None:
        return
    if perm.dtype != torch.int64 or tuple(perm.shape) != (k,) or perm.device != x.device:
        raise ValueError(f"input_perm must be int64 [{k}] on {x.device}, got {perm.dtype} {tuple(perm.shape)} on "
                         f"{perm.device}")


@register_fake_all("linear_wxa16")
def _(x, qweight, scales, zeros, offsets, bias, bits, group_size, mode, N, K, lo, hi, input_perm=None):
    torch._check(x.shape[-1] == K, lambda: f"x has {x.shape[-1]} features, the weight expects K={K}")
    return x.new_empty((*x.shape[:-1], N))


@define_op("gather_columns(Tensor x, Tensor perm) -> Tensor")
def gather_columns(x: Tensor, perm: Tensor) -> Tensor:
    """x[..., perm] as a new contiguous tensor (perm: int64 [K], a permutation of x's last dimension): the shared
    act-order gather (mixgemm.nn.norms). Decode-sized inputs on CUDA take mixgemm's PDL gather kernel
    (the GEMVs after it start their weight loads meanwhile); an op of its own, so torch.compile does not fuse the
    gather into the norm before it (whose fused kernel reloaded its inputs at the gathered positions)."""
    k = x.shape[-1]
    _check_input_perm(perm, x, k)
    if x.is_cuda and k:
        from mixgemm.ops.dispatch import flat_rows, gather_decode_rows

        xg = gather_decode_rows(flat_rows(x, k)[1], perm)
        if xg is not None:
            return (xg if xg.shape[1] == k else xg[:, :k].contiguous()).view(x.shape)
    return x.index_select(-1, perm)


@register_fake_ops("gather_columns")
def _(x, perm):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _gather_backward(ctx, grad):
    return torch.zeros_like(grad).index_copy_(-1, ctx.perm, grad), None


def _gather_setup_context(ctx, inputs, output):
    ctx.perm = inputs[1]


torch.library.register_autograd("mixgemm::gather_columns", _gather_backward, setup_context=_gather_setup_context)


@define_op("rms_norm(Tensor x, Tensor weight, float eps, Tensor? perm=None) -> Tensor")
def rms_norm(x: Tensor, weight: Tensor, eps: float, perm: Optional[Tensor] = None) -> Tensor:  # noqa: UP045
    """mixgemm.reference.rms_norm(x, weight, eps), gathered as [..., perm] when perm (int64 [K]) is given: a norm that
    feeds mixgemm layers, computed by mixgemm's norm kernel on CUDA (kernels/cuda/rms_norm.cu; the torch composite
    where that kernel cannot run). What the norm's hook calls under torch.compile (mixgemm.nn.norms);
    the inductor pass mixgemm.ops.fuse_norm_add turns it and the residual add before it into add_rms_norm."""
    return _norm(x, None, weight, eps, perm)[1]


@define_op("add_rms_norm(Tensor a, Tensor b, Tensor weight, float eps, Tensor? perm=None) -> (Tensor, Tensor)")
def add_rms_norm(a: Tensor, b: Tensor, weight: Tensor, eps: float,
                 perm: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:  # noqa: UP045
    """(h, rms_norm(h, weight, eps, perm)) with h = a + b, in one kernel on CUDA: the residual add and the norm after
    it, as torch.compile fuses them for a norm of its own."""
    h, y = _norm(a, b, weight, eps, perm)
    return h, y


def _norm(a: Tensor, b: Optional[Tensor], weight: Tensor, eps: float,  # noqa: UP045
          perm: Optional[Tensor]) -> tuple[Optional[Tensor], Tensor]:  # noqa: UP045
    k = a.shape[-1]
    _check_input_perm(perm, a, k)
    if b is not None and (b.shape != a.shape or b.dtype != a.dtype or b.device != a.device):
        raise ValueError(f"add_rms_norm: a and b must have one shape, dtype and device; got a {tuple(a.shape)} "
                         f"{a.dtype} on {a.device}, b {tuple(b.shape)} {b.dtype} on {b.device}")
    if tuple(weight.shape) != (k,) or weight.device != a.device:
        raise ValueError(f"rms_norm: the weight must be [{k}] on {a.device}, got {tuple(weight.shape)} on "
                         f"{weight.device}")
    if a.is_cuda and a.numel():
        from mixgemm.kernels.cuda.rms_norm import rms_norm_rows, unsupported_reason
        from mixgemm.ops.dispatch import flat_rows, kernel_perm

        a2 = flat_rows(a, k)[1]
        b2 = None if b is None else flat_rows(b, k)[1]
        kp = None if perm is None else kernel_perm(perm)
        if all(unsupported_reason(t, weight, kp) is None for t in (a2, b2) if t is not None):
            h, y = rms_norm_rows(a2, b2, weight, eps, kp)
            return (None if h is None else h.view(a.shape)), y.view(a.shape)
    from mixgemm.reference.norm import rms_norm as reference

    h = a if b is None else a + b
    y = reference(h, weight, eps)
    return (None if b is None else h), (y if perm is None else y.index_select(-1, perm))


def _norm_out(x: Tensor, weight: Tensor) -> Tensor:
    return torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)


@register_fake_ops("rms_norm")
def _(x, weight, eps, perm=None):
    return _norm_out(x, weight)


@register_fake_ops("add_rms_norm")
def _(a, b, weight, eps, perm=None):
    return torch.empty(a.shape, dtype=a.dtype, device=a.device), _norm_out(a, weight)


@define_op("dequantize(Tensor qweight, Tensor scales, Tensor? zeros, Tensor? offsets, SymInt bits, SymInt group_size, "
           "str mode, SymInt n, SymInt k) -> Tensor")
def dequantize(qweight: Tensor, scales: Tensor, zeros: Optional[Tensor], offsets: Optional[Tensor], bits: int,  # noqa: UP045
               group_size: int, mode: str, n: int, k: int) -> Tensor:
    """The float32 weight [N, K] of these tensors (the linear ops' backward). An op of its own, so that a compiled
    backward reads the weight cached on qweight at run time: a compacted layer's qweight is a placeholder whose codes
    live only in its resident layout (weight_from_tensors finds it), which traced tensor code would read as zeros."""
    from mixgemm.formats.weight import dequantize_weight

    return dequantize_weight(weight_from_tensors(qweight, scales, zeros, offsets, bits, group_size, mode, n, k),
                             torch.float32)


@torch.library.register_fake("mixgemm::dequantize")
def _(qweight, scales, zeros, offsets, bits, group_size, mode, n, k):
    return scales.new_empty((n, k), dtype=torch.float32)


def _linear_setup_context(ctx, inputs, output):
    x, qweight, scales, zeros, offsets, bias, bits, group_size, mode, n, k = inputs[:11]
    # linear_wxa16: (..., lo, hi[, input_perm]); linear_wxa8: (..., act_mode, lo, hi[, act_block])
    a8 = isinstance(inputs[11], str)
    lo, hi = inputs[12:14] if a8 else inputs[11:13]
    perm = None if a8 or len(inputs) < 14 else inputs[13]
    ctx.fmt = (bits, group_size, mode, n, k)
    ctx.bounds = (lo, hi)
    ctx.x_dtype = x.dtype
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.save_for_backward(qweight, scales, zeros, offsets, output if (lo, hi) != (-math.inf, math.inf) else None,
                          perm)


def _linear_backward(ctx, grad):
    """Gradients for x and bias (the quantized weight is frozen: no gradient). dL/dx = g @ dequant(W), with g
    masked where the output clamp was active; computed in float32 (the straight-through reading of
    activation quantization for linear_wxa8)."""
    qweight, scales, zeros, offsets, out, perm = ctx.saved_tensors
    bits, group_size, mode, n, k = ctx.fmt
    g = grad
    if out is not None:
        lo, hi = ctx.bounds
        g = g * ((out > lo) & (out < hi)).to(g.dtype)
    gx = gb = None
    if ctx.needs_input_grad[0]:
        w = torch.ops.mixgemm.dequantize(qweight, scales, zeros, offsets, bits, group_size, mode, n, k)
        gx = (g.float() @ w).to(ctx.x_dtype)
        if perm is not None:  # the product read x[..., perm]: input feature perm[j] gets stored column j's gradient
            gx = torch.empty_like(gx).index_copy_(-1, perm, gx)
    if ctx.needs_input_grad[5]:
        gb = g.float().reshape(-1, n).sum(0).to(ctx.bias_dtype)
    return (gx, None, None, None, None, gb) + (None,) * (len(ctx.needs_input_grad) - 6)


torch.library.register_autograd("mixgemm::linear_wxa16", _linear_backward, setup_context=_linear_setup_context)


def _a8_kernel_fits(x: Tensor, qw: QuantizedWeight, act_mode: str, act_block: str) -> str | None:
    """None when an int8 kernel of the registry (mixgemm.kernels.a8) takes this call, else why not."""
    from mixgemm.formats.activation import act_block_size
    from mixgemm.kernels.registry import NoKernel
    from mixgemm.ops.int8 import a8_choice

    k = qw.in_features
    per_token = act_block_size(k, qw.group_size, act_block) == k
    try:
        a8_choice(x.shape[:-1].numel(), qw, x.dtype, x.device, act_mode, per_token)
    except NoKernel as e:
        return str(e)
    return None


def _linear_wxa8_reference(x: Tensor, qw: QuantizedWeight, bias: Optional[Tensor], act_mode: str,  # noqa: UP045
                           lo: float, hi: float, act_block: str = "group") -> Tensor:
    """quantize_activation + the block integer GEMM, in float64 (the float64 product of the dequantized
    operands off the CPU: the same number, and CUDA has no int64 bmm)."""
    from mixgemm.formats.activation import act_block_size, quantize_activation
    from mixgemm.formats.weight import dequantize_weight
    from mixgemm.reference.block_gemm import block_int_gemm

    k = qw.in_features
    a = quantize_activation(x.reshape(-1, k), act_block_size(k, qw.group_size, act_block), act_mode)
    y = block_int_gemm(a, qw) if x.device.type == "cpu" else a.dequantize() @ dequantize_weight(qw, torch.float64).T
    if bias is not None:
        y = y + bias.double()
    return y.clamp(lo, hi).to(x.dtype).reshape(*x.shape[:-1], qw.out_features)


@define_op("linear_wxa8(Tensor x, Tensor qweight, Tensor scales, Tensor? zeros, Tensor? offsets, Tensor? bias, "
           "SymInt bits, SymInt group_size, str mode, SymInt N, SymInt K, str act_mode, float lo, float hi, "
           "str act_block=\"group\") -> Tensor", no_grad=True)
def linear_wxa8(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Optional[Tensor], offsets: Optional[Tensor],  # noqa: UP045
                bias: Optional[Tensor],  # noqa: UP045  (the form torch.library's schema inference lists)
                bits: int, group_size: int, mode: str, N: int, K: int, act_mode: str, lo: float,
                hi: float, act_block: str = "group") -> Tensor:
    """clamp(quant8(x) @ dequant(W).T + bias, lo, hi) -> [..., N] in x.dtype: mixgemm.ops.int8.matmul_a8 (int8
    tensor-core kernels on CUDA, the float64 reference on the CPU); act_block "group" | "token" (see matmul_a8)."""
    zeros, offsets = mode_params(mode, zeros, offsets)
    # a repeated call: the launch kept on qweight (as linear_wxa16)
    key = (x.shape, x.dtype, x.get_device(), bits, group_size, mode, N, K, act_mode, lo, hi, act_block)
    hit = kept(qweight.__dict__, key)
    if hit is not None and hit.token == weight_token(qweight, scales, zeros, offsets):
        y = run_kept(hit, x, bias)
        if y is not None:
            return y
    from mixgemm._checks import check_matmul_inputs
    from mixgemm.formats.activation import act_block_size, check_act

    qw = weight_from_tensors(qweight, scales, zeros, offsets, bits, group_size, mode, N, K)
    check_matmul_inputs(x, qw, bias)
    check_act(act_mode, act_block)
    m = x.shape[:-1].numel()
    if m == 0:  # empty batch: [..., 0, N] on every path
        return x.new_empty((*x.shape[:-1], N))
    if x.device.type == "cuda":
        why = _a8_kernel_fits(x, qw, act_mode, act_block)
        if why is not None:
            if why not in _warned:
                _warned.add(why)
                warnings.warn(f"mixgemm: int8 kernel cannot run this layer ({why}); using the reference", stacklevel=2)
            return _linear_wxa8_reference(x, qw, bias, act_mode, lo, hi, act_block)
    from mixgemm.ops.int8 import a8_choice, matmul_a8

    activation, extra_clamp = _activation_for(lo, hi)
    y = matmul_a8(x, qw, act_mode, bias, activation, act_block=act_block)
    if extra_clamp:
        return y.clamp(lo, hi)
    if x.device.type == "cuda":  # the launch this call's plan holds (matmul_a8 ran through it)
        per_token = act_block_size(K, qw.group_size, act_block) == K
        launch = a8_choice(m, qw, x.dtype, x.device, act_mode, per_token).launch
        a, b = clamp_bounds(activation)
        keep(qweight.__dict__, key, weight_token(qweight, scales, zeros, offsets), launch, N, a, b, x)
    return y


@register_fake_all("linear_wxa8")
def _(x, qweight, scales, zeros, offsets, bias, bits, group_size, mode, N, K, act_mode, lo, hi, act_block="group"):
    torch._check(x.shape[-1] == K, lambda: f"x has {x.shape[-1]} features, the weight expects K={K}")
    return x.new_empty((*x.shape[:-1], N))


torch.library.register_autograd("mixgemm::linear_wxa8", _linear_backward, setup_context=_linear_setup_context)


def _conv_out(size: int, k: int, s: int, p: int, d: int):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


@define_op("conv2d_wxa16(Tensor x, Tensor qweight, Tensor scales, Tensor? zeros, Tensor? offsets, Tensor? bias, "
           "SymInt bits, SymInt group_size, str mode, SymInt[] weight_shape, SymInt[] stride, SymInt[] padding, "
           "SymInt[] dilation, SymInt groups, float lo, float hi) -> Tensor")
def conv2d_wxa16(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Optional[Tensor], offsets: Optional[Tensor],  # noqa: UP045
                 bias: Optional[Tensor],  # noqa: UP045  (the form torch.library's schema inference lists)
                 bits: int, group_size: int, mode: str, weight_shape: list[int], stride: list[int],
                 padding: list[int], dilation: list[int], groups: int, lo: float, hi: float) -> Tensor:
    """conv2d of x [B, Ci, H, W] with the quantized kernel [Co, Ci_g, Kh, Kw] whose matrix is
    [Co, Kh * Kw * Ci_g] (mixgemm.formats.conv) -> [B, Co, Ho, Wo] in x's dtype and memory format."""
    from mixgemm.ops.conv import conv2d

    co, ci_g, kh, kw = weight_shape
    qw = weight_from_tensors(qweight, scales, zeros, offsets, bits, group_size, mode, co, kh * kw * ci_g)
    qcw = QuantizedConvWeight(qw, (kh, kw), ci_g)
    activation, extra_clamp = _activation_for(lo, hi)
    y = conv2d(x, qcw, bias, tuple(stride), tuple(padding), tuple(dilation), groups, activation)
    return y.clamp(lo, hi) if extra_clamp else y


@torch.library.register_fake("mixgemm::conv2d_wxa16")
def _(x, qweight, scales, zeros, offsets, bias, bits, group_size, mode, weight_shape, stride, padding, dilation,
      groups, lo, hi):
    co, _, kh, kw = weight_shape
    ho = _conv_out(x.shape[2], kh, stride[0], padding[0], dilation[0])
    wo = _conv_out(x.shape[3], kw, stride[1], padding[1], dilation[1])
    fmt = torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) and x.shape[1] > 1 \
        else torch.contiguous_format
    return torch.empty((x.shape[0], co, ho, wo), dtype=x.dtype, device=x.device, memory_format=fmt)


def weight_args(qw: QuantizedWeight) -> tuple:
    """The plain-tensor arguments (qweight, scales, zeros, offsets, bits, group_size, mode, N, K) of a
    QuantizedWeight, for calling the ops directly (zeros / offsets None where the mode has none)."""
    zeros, offsets = qw.zeros, qw.offsets
    gs = PER_CHANNEL if qw.config.group_size == PER_CHANNEL else qw.config.group_size
    n, k = qw.shape
    return qw.qweight, qw.scales, zeros, offsets, qw.bits, gs, qw.mode, n, k


__all__ = ["conv2d_wxa16", "linear_wxa8", "linear_wxa16", "weight_args", "weight_from_tensors"]
