"""The eager fast path of QuantLinear.forward: the weight's cached call plan, without the torch.library dispatch.

A call looks the QuantizedWeight up on its qweight buffer (identity and version counters: mixgemm.ops.custom_ops.
weight_from_tensors), the plan up on the weight (mixgemm.ops.dispatch: a dict keyed by M, dtype, device and the
activation format), checks the inputs in full only when it makes a plan, and launches. It applies outside
torch.compile (whose graphs keep the custom ops) and when no gradient to x is needed (the ops carry the backward);
QuantLinear falls back to the ops when eager_forward returns None (no kernel of this build takes the layer: the ops
then run their fallbacks, with their warnings). On the CPU a weight-only layer calls mixgemm.matmul directly: the
op's own CPU computation, without torch.library's dispatch wrapper, whose first call imports torch._dynamo and
through it triton (seconds, for nothing on the CPU).

Once a call has run through a prepared launch, the module keeps it by input shape, dtype and device
(mixgemm.ops.kept_launches): ``fast_call`` runs the next call of that shape with no weight or plan lookup, after the
checks that can change between calls.
"""

from __future__ import annotations

import torch
from torch._C import _len_torch_dispatch_stack as _dispatch_modes
from torch.utils._python_dispatch import _get_current_dispatch_mode

from mixgemm._checks import check_matmul_inputs
from mixgemm.formats.activation import act_block_size, check_act
from mixgemm.kernels.options import default_options_active
from mixgemm.kernels.registry import NoKernel
from mixgemm.ops.custom_ops import mode_params, weight_from_tensors
from mixgemm.ops.dispatch import cached_choice, cuda_matmul, flat_rows, plan_launch
from mixgemm.ops.kept_launches import KEPT_ATTR, holds_weight, keep, run_kept, weight_token
from mixgemm.ops.matmul import matmul

_INF = float("inf")


def _token(mod) -> tuple:
    b = mod._buffers
    return weight_token(b["qweight"], b["scales"], *mode_params(mod.config.mode, b["zeros"], b["offsets"]))


def fast_call(mod, x: torch.Tensor) -> torch.Tensor | None:
    """QuantLinear ``mod``'s output for x through the launch it kept for x's shape, dtype and device, or None when
    there is none or it does not apply now (a dispatch mode, autograd to record, other kernel options, a changed
    weight, a strided x, a bias that is not an [N] vector on x's device: the full path then checks and names the
    problem). The caller checked that no compiler is tracing (under torch.compile nothing here is traced: the kept
    launches and the kernel options' context variable are eager-only state).

    Every eager decode step makes a few hundred of these calls and is bound by their host time, so the lookups are
    written out here and the weight is compared in place (kept_launches.holds_weight), not through a built token (each
    Python frame is a fraction of a microsecond, and a slow host multiplies it)."""
    if type(x) is not torch.Tensor:
        return None
    launches = mod.__dict__.get(KEPT_ATTR)
    if not launches:
        return None
    hit = launches.get((x.shape, x.dtype, x.get_device()))
    if hit is None or _dispatch_modes() or not default_options_active():
        return None
    bias = mod._parameters["bias"]
    if torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad)):
        return None
    b = mod._buffers
    if not holds_weight(hit.token, b["qweight"], b["scales"], *mode_params(mod.config.mode, b["zeros"], b["offsets"])):
        return None
    return run_kept(hit, x, bias)


def _keep(mod, x: torch.Tensor, launch, n: int) -> None:
    """Keep a call's prepared launch for the next call of x's shape (fast_call); not for act-order layers, whose x
    is gathered before the launch."""
    if mod._buffers.get("input_perm") is None:
        keep(mod.__dict__, (x.shape, x.dtype, x.get_device()), _token(mod), launch, n, -_INF, _INF, x)


def eager_applies(mod, x: torch.Tensor) -> bool:
    """True when QuantLinear ``mod`` may take the fast path for x: a plain tensor in eager mode with no gradient to
    record (no compiler, tracer, tensor subclass such as fake / functional tensors, or dispatch mode that needs the
    op as one node; no autograd through x or the bias), on CUDA, or on the CPU for a weight-only layer (the
    activation-quantized CPU reference lives in the op)."""
    if type(x) is not torch.Tensor or torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return False
    if not (x.is_cuda or (x.device.type == "cpu" and mod.act_mode is None)):
        return False
    bias = mod._parameters.get("bias")
    return not (torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad)))


def eager_forward(mod, x: torch.Tensor) -> torch.Tensor | None:
    """QuantLinear ``mod``'s output for x through the cached plan, or None to take the ops.

    Runs on every eager call of every quantized layer, so it reads the module's buffers from its dicts (nn.Module's
    attribute fallback costs a microsecond or two per name) and checks the inputs in full only when it makes a plan."""
    b = mod._buffers
    bias = mod._parameters.get("bias")
    c = mod.config
    n, k = mod.out_features, mod.in_features
    qw = weight_from_tensors(b["qweight"], b["scales"], b["zeros"], b["offsets"], c.bits, c.group_size, c.mode, n, k)
    act_mode = mod.act_mode
    # act-order (weight-only): x[..., perm] @ W.T (eager: a feeding norm's gather runs only under torch.compile)
    perm = b.get("input_perm") if act_mode is None and mod.gathers_input() else None
    if act_mode is None:
        if x.device.type == "cpu":
            return matmul(x if perm is None else x[..., perm], qw, bias)
        try:
            y = cuda_matmul(x, qw, bias, None, perm)  # the same plans as the op's
        except NoKernel:
            return None
        if perm is None:
            _keep(mod, x, plan_launch(qw, x), n)
        return y
    shape = x.shape
    if len(shape) < 1 or shape[-1] != k:
        check_matmul_inputs(x, qw, bias)  # raises, naming the shapes
    m, x2d = flat_rows(x, k)
    if m == 0:
        return x.new_empty((*shape[:-1], n))

    def make_problem():
        check_matmul_inputs(x, qw, bias)
        check_act(act_mode, mod.act_block)
        from mixgemm.kernels.int8_activations import a8_problem

        return a8_problem(m, qw, x.dtype, x.device, act_mode, per_token)

    per_token = act_block_size(k, qw.group_size, mod.act_block) == k
    try:
        choice = cached_choice(qw, ("linear_a8", m, x.dtype, x.get_device(), act_mode, per_token), make_problem)
        launch = choice.launch
        y = (launch(x2d, bias, -_INF, _INF) if launch is not None
             else choice.entry.run(x2d, qw, bias, -_INF, _INF, choice.config, choice.problem, x.dtype))
    except NoKernel:
        return None
    _keep(mod, x, launch, n)
    return y if len(shape) == 2 else y.view(*shape[:-1], n)
