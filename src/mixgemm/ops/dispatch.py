"""The CUDA side of mixgemm.matmul: the registry's choice for the problem, cached per weight as a call plan.

Which kernel runs is the registry's business (mixgemm.kernels.registry, the entry lists in mixgemm.kernels.linear
and .a8); here a call looks its plan up on the weight -- a dict keyed by (op, M, activation dtype, device, ...),
holding the chosen entry and its config -- and launches. Plans are made under the default kernel options only
(a ``mixgemm.kernel_options`` block chooses afresh on every call) and live as long as the weight object; a weight's
plan table holds at most MAX_PLANS entries (prefill lengths vary) and is emptied when full. Entries that can prepare
their launch (KernelEntry.prepare) keep it in the plan: a call then writes its pointers and launches.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from mixgemm._checks import check_matmul_inputs
from mixgemm.epilogue import clamp_bounds
from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.options import current_options
from mixgemm.kernels.registry import Choice, choose, device_info
from mixgemm.ops.kept_launches import PreparedTable

GEMV_MAX_M = 16  # the GEMVs' own limit (mixgemm.kernels.linear_common.GEMV_MAX_M)
MAX_PLANS = 256
_PLANS_ATTR = "_mixgemm_plans"
_OLD_NAMES = {"dequant_cublas": "cublas", "cuda_gemv": "gemv", "cuda_gemv_mma": "gemv", "cuda_gemv_wg_simt": "gemv",
              "cuda_wgmma": "wgmma", "triton_gemm": "gemm"}


def plans_of(qw: QuantizedWeight) -> dict:
    """The plan table of a weight (created on first use; a new weight object starts empty)."""
    plans = qw.__dict__.get(_PLANS_ATTR)
    if plans is None:
        plans = PreparedTable()  # (not deep-copied or pickled with the weight)
        qw.__dict__[_PLANS_ATTR] = plans
    return plans


def device_key(device: torch.device) -> int:
    """The plan key's device: the CUDA index, -1 off CUDA (what Tensor.get_device() returns, the eager path's key)."""
    return device.index if device.type == "cuda" and device.index is not None else -1


def linear_key(m: int, x_dtype: torch.dtype, device: torch.device, act_order: bool) -> tuple:
    """The plan key of a weight-only linear call of M rows."""
    return ("linear", m, x_dtype, device_key(device), act_order)


def plan_launch(qw: QuantizedWeight, x: torch.Tensor) -> object | None:
    """The prepared launch of the plan a weight-only call on x [..., K] without act-order has made on qw, or None
    (no plan: an empty x, a kernel_options block, a fallback; or an entry that prepares none)."""
    if not x.numel():
        return None
    plan = plans_of(qw).get(linear_key(x.numel() // qw.in_features, x.dtype, x.device, False))
    return None if plan is None else plan.launch


def kept_plan(qw: QuantizedWeight, key: tuple, make):
    """The plan under ``key`` on qw's plan table, made by make() on a miss and kept there -- except while a CUDA graph
    is being captured: a choice made then may be provisional (a raced entry cannot race during capture and declines
    until it has), so the next call outside the capture chooses again. The caller keeps no plan under non-default
    kernel options."""
    plans = plans_of(qw)
    hit = plans.get(key)
    if hit is None:
        hit = make()
        if not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
            if len(plans) >= MAX_PLANS:
                plans.clear()
            plans[key] = hit
    return hit


def cached_choice(qw: QuantizedWeight, key: tuple, make_problem) -> Choice:
    """The plan under ``key`` on qw, chosen by the registry for make_problem() on a miss (kept_plan); no caching
    under non-default kernel options."""
    opts = current_options()
    if not opts.is_default:
        return choose(make_problem(), opts)

    def make() -> Choice:
        hit = choose(make_problem(), opts)
        launch = None
        if hit.entry.prepare is not None and hit.problem.device.is_cuda:
            launch = hit.entry.prepare(hit.problem, qw, hit.config)
        # the plan must not hold the weight it is cached on (a reference cycle would keep freed models alive
        # until the next garbage collection); its launch holds only the layout tensors the kernel reads
        return replace(hit, problem=replace(hit.problem, qw=None), launch=launch)

    return kept_plan(qw, key, make)


def linear_choice(m: int, qw: QuantizedWeight, x_dtype: torch.dtype, device: torch.device,
                  act_order: bool = False) -> Choice:
    """The registry's choice (entry + config) for a weight-only linear of M rows, cached on qw (act-order layers
    share their weight object with plain views of it: act_order is part of the key)."""
    from mixgemm.kernels.linear_common import linear_problem

    return cached_choice(qw, linear_key(m, x_dtype, device, act_order),
                         lambda: linear_problem(m, qw, x_dtype, device_info(device), act_order))


PERM_PAD = 64  # the largest k-tile the GEMVs read (gemv_mma_v1 int4, wgmma_v1)
_PERM_ATTR = "_mixgemm_kernel_perm"


def kernel_perm(perm: torch.Tensor) -> torch.Tensor:
    """An act-order layer's input permutation (int64 [K]) as the GEMVs read it: int32, padded with the identity to a
    multiple of PERM_PAD (padded k then read the zero-padded x, like plain layers: no bounds checks in the kernel).
    Made once and cached on the perm tensor itself (checked against its data pointer and version counter, like
    mixgemm.ops.custom_ops.weight_from_tensors), so calls and CUDA-graph replays convert nothing."""
    sig = (perm.data_ptr(), perm._version if not perm.is_inference() else -1, perm.numel(), perm.device)
    hit = getattr(perm, _PERM_ATTR, None)
    if hit is not None and hit[0] == sig:
        return hit[1]
    k = perm.numel()
    kp = -(-k // PERM_PAD) * PERM_PAD
    out = torch.arange(kp, dtype=torch.int32, device=perm.device)
    out[:k] = perm
    if out.is_cuda and not torch.cuda.is_current_stream_capturing():
        # the GEMVs copy these indices before their PDL wait (constant data, like the weights): a PDL launch right
        # after the kernels above could read them half written, so they finish first (once per layer)
        torch.cuda.current_stream(out.device).synchronize()
    setattr(perm, _PERM_ATTR, (sig, out))
    return out


def gather_decode_rows(x2d: torch.Tensor, perm: torch.Tensor) -> torch.Tensor | None:
    """x2d[:, perm] written zero-padded to the kernel permutation's length by mixgemm's gather kernel
    (kernels/cuda/gather_x.cu: PDL, so the kernel after it starts its weight loads meanwhile), for decode-sized x2d
    (1..GEMV_MAX_M rows, unit stride along K) on CUDA where NVRTC is available; None elsewhere (the caller gathers
    with torch)."""
    if not (x2d.is_cuda and 0 < x2d.shape[0] <= GEMV_MAX_M):
        return None
    from mixgemm.kernels.cuda.nvrtc import nvrtc_available

    if not nvrtc_available():
        return None
    from mixgemm.kernels.cuda.gather_x import gather_x

    return gather_x(x2d, kernel_perm(perm))


def run_linear(choice: Choice, x2d: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None, lo: float,
               hi: float, perm: torch.Tensor | None = None) -> torch.Tensor:
    """The chosen entry's output for x2d [M, K] (an act-order layer's input permutation ``perm`` applied: by the
    kernel where the entry gathers x itself, else by one gather before it)."""
    launch = choice.launch
    if perm is None:
        return launch(x2d, bias, lo, hi) if launch is not None else choice.entry.run(x2d, qw, bias, lo, hi,
                                                                                       choice.config)
    if choice.perm_in_kernel:
        kp = kernel_perm(perm)
        return (launch(x2d, bias, lo, hi, kp) if launch is not None
                else choice.entry.run(x2d, qw, bias, lo, hi, choice.config, perm=kp))
    xg = gather_decode_rows(x2d, perm)
    if xg is not None:  # a prepared GEMV launch reads the padded copy as it is
        if getattr(launch, "reads_padded_x", False):
            return launch(xg, bias, lo, hi)
        x2d = xg[:, :x2d.shape[1]]
    else:
        # one torch gather kernel, no host sync (CUDA-graph safe); on an H100 at M = 1 advanced indexing took ~3.2 us,
        # index_select ~4.4 us, take_along_dim ~6.4 us
        x2d = x2d[:, perm]
    return launch(x2d, bias, lo, hi) if launch is not None else choice.entry.run(x2d, qw, bias, lo, hi, choice.config)


def pick_kernel(m: int, n: int, k: int, qw: QuantizedWeight, device: torch.device,
                x_dtype: torch.dtype = torch.float16) -> str:
    """The kernel family that runs an [M, K] x [N, K] problem with qw's weight format: "gemv", "wgmma", "gemm" (Triton)
    or "cublas" (dequantized + cuBLAS); mixgemm.explain gives the entry, its config and the reasons."""
    from mixgemm.kernels.linear_common import linear_problem
    from mixgemm.kernels.registry import NoKernel

    # n, k may describe another layer than qw's shape: qw gives the format (bits, group, mode)
    problem = replace(linear_problem(m, qw, x_dtype, device_info(device)), n=n, k=k)
    try:
        return _OLD_NAMES[choose(problem).kernel]
    except NoKernel:
        return "gemm"  # no GPU kernel here (CPU without the Triton interpreter): the Triton GEMM is the fallback


def flat_rows(x: torch.Tensor, k: int) -> tuple[int, torch.Tensor]:
    """(M, x as [M, K] with unit stride along K) for x [..., K]: a view where one exists, a copy only when the last
    dimension is strided (the caller's tensor is never touched)."""
    m = x.numel() // k if k else x.shape[:-1].numel()
    x2d = x.reshape(m, k)
    return m, (x2d if x2d.stride(-1) == 1 else x2d.contiguous())


def cuda_matmul(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None, activation: str | None,
                input_perm: torch.Tensor | None = None):
    """clamp(x[..., input_perm] @ dequant(qw).T + bias) on CUDA (input_perm None: x as is), through the weight's cached
    plan. The inputs are checked in full when a plan is made; a call on an existing plan checks only what the plan key
    does not fix (K, the bias' shape and device)."""
    lo, hi = clamp_bounds(activation)
    shape = x.shape
    n, k = qw.shape
    if len(shape) < 1 or shape[-1] != k or (bias is not None and (bias.shape != (n,) or bias.device != x.device)):
        check_matmul_inputs(x, qw, bias)  # raises, naming the problem
    m, x2d = flat_rows(x, k)
    if m == 0 or n == 0:  # empty batch: no kernel math (tile and split-K rules divide by M)
        return x.new_empty((*shape[:-1], n))

    def make_problem():
        from mixgemm.kernels.linear_common import linear_problem

        check_matmul_inputs(x, qw, bias)
        return linear_problem(m, qw, x.dtype, device_info(x.device), input_perm is not None)

    choice = cached_choice(qw, linear_key(m, x.dtype, x.device, input_perm is not None), make_problem)
    y = run_linear(choice, x2d, qw, bias, lo, hi, input_perm)
    return y if len(shape) == 2 else y.view(*shape[:-1], n)
