"""Activation-quantized matmuls on the int8 tensor cores (public API).

* :func:`matmul_a8` -- y = act(x @ W.T + bias) with x quantized on the fly per token and per weight group
  (int8, "sym" = q8_1, "sym_full" = compressed-tensors' or "asym" = min / max with an offset; or with
  ``act_block="token"`` one scale per token over the whole row), W a QuantizedWeight (4 or 8 bits, any mode, group
  32..256 or per-channel). Two launches: the fused activation quantizer, then the integer GEMM (int32 per
  K-block folded into fp32 with sA*sB and the offset terms inside the K loop). On CUDA, small M takes the
  fused CUDA GEMV (mixgemm.kernels.cuda_gemv_a8.gemv_a8: ONE launch, the activation quantization in its prologue,
  dp4a products) when it supports the case, large M the Hopper int8 wgmma GEMM, else the Triton kernel: the
  registry's entries, mixgemm.kernels.a8.
* :func:`int8_static_gemm` -- static per-tensor INT8 x INT8 -> INT8 (MNN ConvInt8 semantics),
  reference: mixgemm.reference.int8_static.
* :func:`make_a8_runner` / :func:`make_static_runner` -- zero-argument callables for the benchmark
  (layout built once, activation quantization included in every call).

CPU tensors run the float64 references (the CPU fallback); Triton kernels run on CUDA, or on CPU under
TRITON_INTERPRET=1 when ``force_kernel=True`` (tests).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from mixgemm._checks import check_matmul_inputs
from mixgemm.epilogue import clamp_bounds
from mixgemm.formats.activation import act_block_size, check_act, quantize_activation
from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.int8_activations import act_quant, per_group_params
from mixgemm.reference import int8_static as _sref
from mixgemm.reference.block_gemm import block_int_gemm

OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _use_kernel(x: torch.Tensor, force_kernel: bool) -> bool:
    if x.device.type == "cuda":
        return True
    return force_kernel and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def matmul_a8(
    x: torch.Tensor,
    qweight: QuantizedWeight,
    act_mode: str = "sym",
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    out_dtype: torch.dtype | None = None,
    config: dict | None = None,
    force_kernel: bool = False,
    act_block: str = "group",
) -> torch.Tensor:
    """y = act(Qa(x) @ W.T + bias), activations quantized to int8 per token and per block.

    x: float16 / bfloat16 / float32 [..., K] (on qweight's device). qweight: QuantizedWeight [N, K], 4 or
    8 bits, mode sym / zero_point / offset, group 32..256 or per-channel. act_mode: "sym" | "asym" | "sym_full"
    (formats.activation).
    act_block: "group" (one activation scale per token and weight group, the default) or "token" (one per token
    over the whole row; the int32 products are still folded per weight group). The same for per-channel weights.
    bias: float [N] or None. activation: None | "relu" | "relu6". out_dtype: default x.dtype.
    4-bit weights need K % 64 == 0 (K % 128 for per-channel or group >= 64 unless K % 64 only).
    Returns [..., N]. Inputs are never modified.
    """
    check_matmul_inputs(x, qweight, bias)
    check_act(act_mode, act_block)
    lo, hi = clamp_bounds(activation)
    out_dtype = out_dtype or x.dtype
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype}")
    lead = x.shape[:-1]
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    blk = act_block_size(k, qweight.group_size, act_block)
    if x2.shape[0] == 0 or qweight.out_features == 0:  # empty batch: no quantizer or kernel launch
        return x.new_empty((*lead, qweight.out_features), dtype=out_dtype)
    if not _use_kernel(x, force_kernel):
        a = quantize_activation(x2, blk, act_mode)
        y = block_int_gemm(a, qweight)
        if bias is not None:
            y = y + bias.double()[None, :]
        return y.clamp(lo, hi).to(out_dtype).reshape(*lead, qweight.out_features)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()  # a copy: the caller's tensor is never touched
    choice = a8_choice(x2.shape[0], qweight, x.dtype, x.device, act_mode, blk == k, config)
    if choice.launch is not None and out_dtype == x.dtype:  # a plan's launch writes x.dtype
        y = choice.launch(x2, bias, lo, hi)
    else:
        y = choice.entry.run(x2, qweight, bias, lo, hi, choice.config, choice.problem, out_dtype)
    return y.reshape(*lead, qweight.out_features)


def a8_choice(m: int, qw: QuantizedWeight, x_dtype: torch.dtype, device: torch.device, act_mode: str,
              per_token: bool, config: dict | None = None):
    """The registry's choice for an int8-activation linear (cached on qw); an explicit ``config`` is a Triton
    kernel config, so it forces that entry."""
    from mixgemm.kernels.int8_activations import a8_problem
    from mixgemm.kernels.registry import choose, device_info, kernel_options
    from mixgemm.ops.dispatch import cached_choice, device_key

    def problem():
        return a8_problem(m, qw, x_dtype, device_info(device), act_mode, per_token)

    if config is not None:
        with kernel_options(force="triton_a8", configs={"triton_a8": config}):
            return choose(problem())
    return cached_choice(qw, ("linear_a8", m, x_dtype, device_key(device), act_mode, per_token), problem)


def _act_bufs(m: int, k: int, g: int, dev) -> tuple[torch.Tensor, ...]:
    """Output buffers of the activation quantizer: codes int8 [M, K], scales / offsets float32 [M, G], sums int32."""
    return (torch.empty((m, k), dtype=torch.int8, device=dev), torch.empty((m, g), dtype=torch.float32, device=dev),
            torch.empty((m, g), dtype=torch.float32, device=dev), torch.empty((m, g), dtype=torch.int32, device=dev))


def make_a8_runner(x: torch.Tensor, qweight: QuantizedWeight, act_mode: str = "sym",
                   bias: torch.Tensor | None = None, activation: str | None = None,
                   out_dtype: torch.dtype | None = None, config: dict | None = None,
                   act_block: str = "group") -> Callable[[], torch.Tensor]:
    """For `mixgemm bench`: a zero-argument callable running activation quantization + GEMM on x [M, K]
    (CUDA), with the weight layout and the output / scratch buffers allocated once (CUDA-graph capturable).
    Returns the same tensor (overwritten) on every call."""
    from mixgemm.kernels.triton_a8.int8_gemm import a8_gemm
    from mixgemm.kernels.triton_a8.layout import get_int8_layout

    check_matmul_inputs(x, qweight, bias)
    check_act(act_mode, act_block)
    lo, hi = clamp_bounds(activation)
    x2 = x.reshape(-1, x.shape[-1])
    m, k = x2.shape
    blk = act_block_size(k, qweight.group_size, act_block)
    if m == 0:  # empty batch: nothing to launch
        empty = torch.empty((0, qweight.out_features), dtype=out_dtype or x.dtype, device=x.device)
        return lambda: empty
    choice = a8_choice(m, qweight, x.dtype, x.device, act_mode, blk == k, config)
    cfg, dev = choice.config, x.device
    out = torch.empty((m, qweight.out_features), dtype=out_dtype or x.dtype, device=dev)
    if choice.kernel == "cuda_gemv_a8":
        from mixgemm.kernels.cuda_gemv_a8.gemv_a8 import gemv_a8

        return lambda: gemv_a8(x2, qweight, act_mode, bias, lo, hi, out.dtype, out=out, per_token=blk == k,
                               config=cfg)
    if choice.kernel == "cuda_gemv_a8_wg":
        from mixgemm.kernels.cuda_gemv_a8_wg.gemv_a8_wg import prepare_gemv_a8_wg

        launch = prepare_gemv_a8_wg(qweight, m, x.dtype, dev, out.dtype, blk == k, cfg, act_mode)
        return lambda: launch(x2, bias, lo, hi, out)
    if choice.kernel == "cuda_wgmma_a8":
        from mixgemm.formats.layouts_wgmma_a8 import build_wgmma_a8_v1
        from mixgemm.kernels.cuda_wgmma_a8.gemm_wgmma_a8 import LAYOUT, gemm_wgmma_a8

        qweight.layout(LAYOUT, build_wgmma_a8_v1)
        qbufs = _act_bufs(m, k, k // blk, dev)

        def run_wgmma():
            aq, sa, _, _ = act_quant(x2, blk, act_mode, out=qbufs)
            return gemm_wgmma_a8(aq, sa, qweight, bias, lo, hi, out.dtype, config=cfg, out=out)

        return run_wgmma
    lay = get_int8_layout(qweight)
    bufs = _act_bufs(m, k, k // blk, dev)
    asym = act_mode == "asym"

    def run():
        aq, sa, oa, suma = act_quant(x2, blk, act_mode, out=bufs)
        if blk != lay.group_size:
            sa, oa, suma = per_group_params(aq, sa, oa, suma, act_mode, lay.group_size)
        return a8_gemm(aq, sa, oa, suma, lay, asym, bias, lo, hi, out.dtype, config=cfg, out=out)

    return run


class Int8Static:
    """Prepared static INT8 layer (the MNN ConvInt8 Resource): int8 weights [N, K] (signed, symmetric) with
    per-tensor or per-channel scale, input scale / zero point, output scale / zero point, float bias [N],
    activation (None | "relu" | "relu6") or explicit integer clamp. Precomputes mq and the fused bias."""

    def __init__(self, w_q: torch.Tensor, w_scale, x_scale: float, x_zero: int, out_scale: float,
                 out_zero: int, bias: torch.Tensor | None = None, activation: str | None = None,
                 clamp: tuple[int, int] | None = None):
        if not isinstance(w_q, torch.Tensor) or w_q.dtype != torch.int8 or w_q.dim() != 2:
            raise TypeError("w_q must be an int8 tensor [N, K] of signed symmetric codes")
        if not -128 <= int(out_zero) <= 127:
            raise ValueError(f"out_zero must be in [-128, 127], got {out_zero}")
        self.w_q = w_q
        self.args = (w_scale, x_scale, int(x_zero), out_scale, int(out_zero))
        self.bias = bias
        self.mq, self.fused_bias = _sref.static_params(w_q, w_scale, x_scale, x_zero, out_scale, bias)
        self.lo, self.hi = _sref.quant_clamp(out_scale, out_zero, activation, clamp)
        self.activation, self.clamp = activation, clamp
        self._lay = None

    def layout(self):
        if self._lay is None:
            from mixgemm.kernels.triton_a8.layout import Int8Layout

            n, k = self.w_q.shape
            f = torch.zeros((1, n), dtype=torch.float32, device=self.w_q.device)
            self._lay = Int8Layout(codes=self.w_q.contiguous(), scales=f, dot_scales=f, moff=f, cterm=f,
                                   csum=torch.zeros((n, 1), dtype=torch.int32, device=self.w_q.device),
                                   bits=8, group_size=k, num_groups=1, half=0, has_offset=False, n=n, k=k)
        return self._lay

    def __call__(self, x_q: torch.Tensor, force_kernel: bool = False, config=None, out=None) -> torch.Tensor:
        if not isinstance(x_q, torch.Tensor) or x_q.dtype != torch.int8 or x_q.dim() != 2:
            raise TypeError("x_q must be an int8 tensor [M, K]")
        if x_q.shape[1] != self.w_q.shape[1]:
            raise ValueError(f"shape mismatch: x_q K={x_q.shape[1]}, weight K={self.w_q.shape[1]}")
        if x_q.device != self.w_q.device:
            raise ValueError(f"device mismatch: x_q on {x_q.device}, weight on {self.w_q.device}")
        if not _use_kernel(x_q, force_kernel):
            w_scale, x_scale, x_zero, out_scale, out_zero = self.args
            return _sref.int8_static_gemm(x_q, self.w_q, w_scale, x_scale, x_zero, out_scale, out_zero,
                                          self.bias, self.activation, self.clamp)
        from mixgemm.kernels.triton_a8.int8_gemm import static_int8_gemm

        xq = x_q if x_q.stride(1) == 1 else x_q.contiguous()
        return static_int8_gemm(xq, self.layout(), self.fused_bias, self.mq, self.args[4], self.lo, self.hi,
                                config=config, out=out)


def int8_static_gemm(x_q: torch.Tensor, w_q: torch.Tensor, w_scale, x_scale: float, x_zero: int,
                     out_scale: float, out_zero: int, bias: torch.Tensor | None = None,
                     activation: str | None = None, clamp: tuple[int, int] | None = None,
                     force_kernel: bool = False) -> torch.Tensor:
    """int8 [M, N] = clamp(round((sI (x_q - zI)) @ (sW w_q).T + bias) / sO) + zO) with MNN's fused integer
    epilogue (see mixgemm.reference.int8_static for the exact float32 operations).
    x_q: int8 [M, K]; w_q: int8 [N, K] signed symmetric; w_scale: scalar or [N]; x_scale, out_scale > 0;
    x_zero, out_zero in [-128, 127]; bias float [N] or None. Prepare an :class:`Int8Static` once to reuse
    the fused bias across calls."""
    return Int8Static(w_q, w_scale, x_scale, x_zero, out_scale, out_zero, bias, activation, clamp)(
        x_q, force_kernel=force_kernel)


def make_static_runner(x_q: torch.Tensor, layer: Int8Static, config=None) -> Callable[[], torch.Tensor]:
    """For `mixgemm bench`: zero-argument callable of the static INT8 GEMM (output buffer allocated once)."""
    out = torch.empty((x_q.shape[0], layer.w_q.shape[0]), dtype=torch.int8, device=x_q.device)
    layer.layout()
    return lambda: layer(x_q, config=config, out=out)
