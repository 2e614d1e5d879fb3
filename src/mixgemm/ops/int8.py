"""Activation-quantized matmuls on the int8 tensor cores (public API).

* :func:`matmul_a8` -- y = act(x @ W.T + bias) with x quantized on the fly per token and per weight group
  (int8, "sym" = q8_1 or "asym" = seed 000's QuantA; or with ``act_block="token"`` one scale per token over the
  whole row), W a QuantizedWeight (4 or 8 bits, any mode, group
  32..256 or per-channel). Two launches: the fused activation quantizer, then the integer GEMM (int32 per
  K-block folded into fp32 with sA*sB and the offset terms inside the K loop). On CUDA, small M takes the
  fused CUDA GEMV (mixgemm.kernels.cuda.gemv_a8: ONE launch, the activation quantization in its prologue,
  dp4a products) when it supports the case (A8_GEMV below), else the Triton kernel with 16-row tiles.
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
from mixgemm.formats.activation import QuantizedActivation, act_block_size, check_act, quantize_activation
from mixgemm.formats.weight import PER_CHANNEL, QuantizedWeight
from mixgemm.reference import int8_static as _sref
from mixgemm.reference.block_gemm import block_int_gemm

OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Small M (<= gemv_a8.MAX_M_DISPATCH) on CUDA: the fused CUDA GEMV (activation quantization + dp4a GEMV in
# one launch) when True.
# (scripts/bench_gemv_a8.py switches it off to time the Triton path side by side.)
A8_GEMV = True


def _per_group(q: torch.Tensor, sa: torch.Tensor, oa: torch.Tensor, sums: torch.Tensor, act_mode: str, group: int):
    """Per-token activation parameters ([M, 1]) described per weight group ([M, G]) for the Triton kernel, which
    takes them per group (QuantizedActivation.regroup: one extra pass over the codes for the sums; the CUDA kernels
    take per-token scales directly)."""
    r = QuantizedActivation(q, sa, oa, sums, q.shape[1], act_mode).regroup(group)
    return r.scales, r.offsets, r.sums


def _a8_gemv_ok(x2: torch.Tensor, qweight: QuantizedWeight, act_mode: str, config: dict | None) -> bool:
    """True when the fused CUDA GEMV takes this call (small M: gemv_a8.MAX_M_DISPATCH; CUDA; no explicit
    Triton config)."""
    if not A8_GEMV or config is not None or not x2.is_cuda:
        return False
    from mixgemm.kernels.cuda import gemv_a8

    return gemv_a8.supported(x2.shape[0], x2, qweight, act_mode)


# M from which sym x sym calls with a ``wgmma_a8_v1`` weight (sym int4 / int8 with group 128 / 256, per-channel)
# take the CUDA int8 wgmma GEMM (mixgemm.kernels.cuda.gemm_wgmma_a8) instead of the Triton kernel; None: never.
WGMMA_A8_MIN_M: int | None = 128
# int8 per-channel weights go back to the Triton kernel from this M: its persistent TMA kernel measured 820 / 6465 us
# against the CUDA kernel's 893 / 7271 us at M = 2048 / 16384 on 8192x28672 (a tie on 28672x8192), while below it the
# CUDA kernel wins: 81 vs 160 us at M = 128, a tie at 512 (H200, results/gemm_wgmma_a8_cross_s9_h200.json).
# Except where its BM 256 / MC 2 tiles apply (gemm_wgmma_a8.w8_wide_region: K >= 8192, M >= 2048), where the CUDA
# kernel measured faster: session 28 (H100, activation quantization included) 28672x8192 M = 2048 / 4096 / 16384
# 833 / 1683 / 6580 -> 800 / 1591 / 6061 us (100 ms windows), M = 2048 sustained 852 -> 804 us
# (benchmarks/results/int8_accept_w8_*_h100_s28.log, power_probe_*_w8ab_h100_s28.log); session 29 (H100, GEMM only,
# same-run medians of 3) 8192x28672 M = 2048 / 4096 Triton 786 / 1587 us, CUDA BM 256 MC 2 735 / 1501 us
# (benchmarks/results/int8_w8_wide_mc_h100_s29.log).
WGMMA_A8_W8_PER_CHANNEL_MAX_M: int | None = 1024  # None: the CUDA kernel at every M


def _wgmma_a8_ok(x2: torch.Tensor, qweight: QuantizedWeight, act_mode: str, config: dict | None) -> bool:
    """True when the CUDA int8 wgmma GEMM takes this call (sm_90, sym x sym, large M, no explicit Triton config)."""
    if WGMMA_A8_MIN_M is None or config is not None or not x2.is_cuda or x2.shape[0] < WGMMA_A8_MIN_M:
        return False
    from mixgemm.kernels.cuda.gemm_wgmma_a8 import w8_wide_region, wgmma_a8_supported

    if (qweight.bits == 8 and qweight.config.group_size == PER_CHANNEL and WGMMA_A8_W8_PER_CHANNEL_MAX_M is not None
            and x2.shape[0] >= WGMMA_A8_W8_PER_CHANNEL_MAX_M
            and not w8_wide_region(x2.shape[0], qweight.out_features, qweight.in_features)):
        return False

    return wgmma_a8_supported(x2, qweight, act_mode)


# Per-channel (long-block) activation quantization on CUDA: the one-pass CUDA row kernel
# (mixgemm.kernels.cuda.gemv_a8.act_quant_rows, x read once) instead of the two-pass Triton row kernel.
ACTQ_ROWS_CUDA = True


def _act_quant(x2: torch.Tensor, block: int, act_mode: str, out=None):
    """(q, scales, offsets, sums) of x2 [M, K] per token and per block (bit-identical either way)."""
    if ACTQ_ROWS_CUDA and x2.is_cuda and block == x2.shape[1]:
        from mixgemm.kernels.cuda import gemv_a8

        if gemv_a8.act_quant_rows_supported(x2, block):
            return gemv_a8.act_quant_rows(x2, act_mode, out=out)
    from mixgemm.kernels.triton.act_quant import act_quant

    return act_quant(x2, block, act_mode, out=out)


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
    8 bits, mode sym / zero_point / offset, group 32..256 or per-channel. act_mode: "sym" | "asym".
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
    if _a8_gemv_ok(x2, qweight, act_mode, config):
        from mixgemm.kernels.cuda.gemv_a8 import gemv_a8

        y = gemv_a8(x2, qweight, act_mode, bias, lo, hi, out_dtype, per_token=blk == k)
        return y.reshape(*lead, qweight.out_features)
    if _wgmma_a8_ok(x2, qweight, act_mode, config):
        from mixgemm.kernels.cuda.gemm_wgmma_a8 import gemm_wgmma_a8

        aq, sa, _, _ = _act_quant(x2, blk, "sym")
        y = gemm_wgmma_a8(aq, sa, qweight, bias, lo, hi, out_dtype)
        return y.reshape(*lead, qweight.out_features)
    from mixgemm.kernels.triton.int8_gemm import a8_gemm
    from mixgemm.kernels.triton.int8_layout import get_int8_layout

    lay = get_int8_layout(qweight)
    aq, sa, oa, suma = _act_quant(x2, blk, act_mode)
    if blk != lay.group_size:
        sa, oa, suma = _per_group(aq, sa, oa, suma, act_mode, lay.group_size)
    y = a8_gemm(aq, sa, oa, suma, lay, act_mode == "asym", bias, lo, hi, out_dtype, config=config)
    return y.reshape(*lead, qweight.out_features)


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
    from mixgemm.kernels.triton.int8_gemm import a8_gemm
    from mixgemm.kernels.triton.int8_layout import get_int8_layout

    check_matmul_inputs(x, qweight, bias)
    check_act(act_mode, act_block)
    lo, hi = clamp_bounds(activation)
    x2 = x.reshape(-1, x.shape[-1])
    m, k = x2.shape
    blk = act_block_size(k, qweight.group_size, act_block)
    if m == 0:  # empty batch: nothing to launch
        empty = torch.empty((0, qweight.out_features), dtype=out_dtype or x.dtype, device=x.device)
        return lambda: empty
    if _a8_gemv_ok(x2, qweight, act_mode, config):
        from mixgemm.kernels.cuda.gemv_a8 import gemv_a8

        out1 = torch.empty((x2.shape[0], qweight.out_features), dtype=out_dtype or x.dtype, device=x.device)
        return lambda: gemv_a8(x2, qweight, act_mode, bias, lo, hi, out1.dtype, out=out1, per_token=blk == k)
    dev = x.device
    if _wgmma_a8_ok(x2, qweight, act_mode, config):
        from mixgemm.formats.layouts_wgmma_a8 import build_wgmma_a8_v1
        from mixgemm.kernels.cuda.gemm_wgmma_a8 import LAYOUT, gemm_wgmma_a8

        qweight.layout(LAYOUT, build_wgmma_a8_v1)
        g = k // blk
        qbufs = _act_bufs(m, k, g, dev)
        out2 = torch.empty((m, qweight.out_features), dtype=out_dtype or x.dtype, device=dev)

        def run_wgmma():
            aq, sa, _, _ = _act_quant(x2, blk, "sym", out=qbufs)
            return gemm_wgmma_a8(aq, sa, qweight, bias, lo, hi, out2.dtype, out=out2)

        return run_wgmma
    lay = get_int8_layout(qweight)
    bufs = _act_bufs(m, k, k // blk, dev)
    out = torch.empty((m, lay.n), dtype=out_dtype or x.dtype, device=dev)
    asym = act_mode == "asym"

    def run():
        aq, sa, oa, suma = _act_quant(x2, blk, act_mode, out=bufs)
        if blk != lay.group_size:
            sa, oa, suma = _per_group(aq, sa, oa, suma, act_mode, lay.group_size)
        return a8_gemm(aq, sa, oa, suma, lay, asym, bias, lo, hi, out.dtype, config=config, out=out)

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
            from mixgemm.kernels.triton.int8_layout import Int8Layout

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
        from mixgemm.kernels.triton.int8_gemm import static_int8_gemm

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
