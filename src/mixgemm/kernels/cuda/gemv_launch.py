"""What the host code of the weight-only GEMVs (mixgemm.kernels.cuda_gemv: the CUDA-core gemv.cu;
mixgemm.kernels.cuda_gemv_mma: the tensor-core gemv_mma.cu; mixgemm.kernels.cuda_gemv_wg_simt: the CUDA-core
gemv_wg_simt.cu on wgmma_v1) shares: the launch object, the leading kernel parameters, the input checks and the dtype /
mode codes.

Each GEMV (``gemv_simt`` / ``gemv_mma`` / ``gemv_wg_simt``) computes ``clamp(x2d @ dequant(qw).T + bias, lo, hi)``:

* x2d: float16 / bfloat16 / float32 [M, K] on a CUDA device, 1 <= M <= 16 (gemv_wg_simt: M = 1), any strides (a
  zero-padded aligned copy is made when rows are not 16-byte aligned, not unit-stride, or K is not a multiple of
  the kernel's chunk -- only possible for per-channel weights).
* qw: QuantizedWeight [N, K] on the same device, int4 or int8, any group size, any mode, any scale dtype.
  Each kernel reads its own layout of it (built on first use, cached).
* bias: None or float16 / bfloat16 / float32 [N]. lo, hi: output clamp (floats, may be +-inf).
* perm (``gemv_simt`` / ``gemv_mma``): None, or an act-order layer's input permutation as int32 [>= Kp] padded
  with the identity (mixgemm.ops.dispatch.kernel_perm): the kernel then multiplies x2d[:, perm[k]] where it reads
  x2d[:, k] (GEMV_PERM / MMA_PERM), with no separate gather.
* Returns [M, N] in x2d.dtype. Launched on torch.cuda.current_stream(); no host synchronization and
  no allocation other than the output (and the padded copy above), so it is CUDA-graph capturable
  once the kernel for a shape class has been compiled (first call).
"""
from __future__ import annotations

import ctypes
import math

import torch

from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.launch import new_rows, new_rows_like

GEMV_MAX_M = 16
WARPS = 8

_ACT = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
_SCL = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
_MODE = {"sym": 0, "zero_point": 1, "offset": 2}
_BIAS = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3}


def m_bucket(m: int) -> int:
    """The compiled M (1, 2, 4, 8 or 16) that serves m rows: fewer kernel variants to compile; rows
    past m are computed on clamped inputs and never stored."""
    return 1 << (m - 1).bit_length()


def param_pair_packs(mode: int, scl: int) -> bool:
    """Whether a GEMV config's PACK applies (gemv_wg_simt.cu SIMT_PACK, gemv_mma.cu MMA_PACK): a second 16-bit
    parameter per group (zero point or offset beside an fp16 / bf16 scale)."""
    return mode != _MODE["sym"] and scl != _SCL[torch.float32]


def weight_pair_packs(mode: str, scale_dtype: torch.dtype) -> bool:
    """param_pair_packs for a weight's mode name and scale dtype (mma_config's ``pair_packs``)."""
    return param_pair_packs(_MODE[mode], _SCL[scale_dtype])


def _prepare_x(x2d: torch.Tensor, lay) -> torch.Tensor:
    """x2d itself when the kernel can read it (unit stride along K, 16-byte aligned rows, K == Kp),
    else a zero-padded aligned copy [M, Kp] (the caller's tensor is never modified)."""
    es = x2d.element_size()
    ok = (x2d.stride(1) == 1 and lay.k_padded == lay.k and (x2d.stride(0) * es) % 16 == 0
          and x2d.data_ptr() % 16 == 0)
    if ok:
        return x2d
    xp = torch.zeros(x2d.shape[0], lay.k_padded, dtype=x2d.dtype, device=x2d.device)
    xp[:, : lay.k] = x2d
    return xp


def chunks_per_row(bits: int, k: int) -> int:
    """16-byte chunks per row of the gemv_v2 layout (K padded to a whole chunk: 32 k at 4 bits, 16 at 8)."""
    chunk = 32 if bits == 4 else 16
    return -(-k // chunk)


def wave_efficiency(blocks: int, per_wave: int) -> float:
    """The share of the block slots a grid fills over the waves it takes: waves over whole waves (1.0 = full waves)."""
    waves = blocks / per_wave
    return waves / math.ceil(waves)


def _check_perm(perm: torch.Tensor | None, x2d: torch.Tensor, lay) -> None:
    """An act-order call's kernel permutation: int32 on x's device, contiguous, covering the layout's padded K."""
    if perm is None:
        return
    if perm.dtype != torch.int32 or perm.device != x2d.device or not perm.is_contiguous() or perm.dim() != 1:
        raise ValueError(f"gemv: perm must be a contiguous int32 [Kp] tensor on {x2d.device} (see "
                         f"ops.dispatch.kernel_perm), got {perm.dtype} {tuple(perm.shape)} on {perm.device}")
    if perm.numel() < lay.k_padded or perm.data_ptr() % 16:
        raise ValueError(f"gemv: perm must hold >= {lay.k_padded} entries (K padded to the layout) and be 16-byte "
                         f"aligned, got {perm.numel()}")


def _check_gemv(x2d: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None):
    if not x2d.is_cuda:
        raise ValueError(f"gemv needs CUDA tensors, x is on {x2d.device}")
    if x2d.dim() != 2:
        raise ValueError(f"gemv takes x as 2-D [M, K], got shape {tuple(x2d.shape)}")
    m, k = x2d.shape
    if k != qw.in_features:
        raise ValueError(f"shape mismatch: x has K={k}, weight expects K={qw.in_features}")
    if x2d.dtype not in _ACT:
        raise TypeError(f"gemv: activation dtype {x2d.dtype} not supported (float16, bfloat16, float32)")
    if m > GEMV_MAX_M:
        raise ValueError(f"gemv handles M <= {GEMV_MAX_M}, got M={m}")
    if qw.device != x2d.device:
        raise ValueError(f"device mismatch: x on {x2d.device}, weight on {qw.device}")
    if bias is not None:
        if bias.dtype not in _BIAS:
            raise TypeError(f"bias dtype {bias.dtype} not supported (float16, bfloat16, float32)")
        bias = bias.contiguous()
    return bias


def _prepare_and_run(prepare, x2d, qw, bias, lo, hi, cfg, perm):
    """One unplanned GEMV call: the inputs checked, the launch prepared (prepare_simt / prepare_mma), then run."""
    bias = _check_gemv(x2d, qw, bias)
    m = x2d.shape[0]
    if m == 0 or qw.out_features == 0:
        return torch.empty(m, qw.out_features, dtype=x2d.dtype, device=x2d.device)
    launch = prepare(qw, m, x2d.dtype, x2d.device, cfg, perm is not None)
    _check_perm(perm, x2d, launch.layout)
    return launch(x2d, bias, lo, hi, perm)


# the per-call parameters of both GEMV kernels: their positions in _common_args, and the permutation (last)
_X, _XSTRIDE, _Y, _YSTRIDE, _EPILOGUE, _PERM = 2, 3, 4, 5, 6, -1


def _common_args(lay, n: int) -> list:
    """The leading kernel parameters both GEMV kernels share, in their order: weight, params, then x, x row stride
    (16-byte units), y, y row stride, bias, bias dtype code, clamp lo / hi (written per call by GemvLaunch), N."""
    return [
        ctypes.c_void_p(lay.weight.data_ptr()),
        ctypes.c_void_p(lay.params.data_ptr()),
        ctypes.c_void_p(0), ctypes.c_int(0), ctypes.c_void_p(0), ctypes.c_int(0),
        *nvrtc.bias_clamp_args(None, -math.inf, math.inf),
        ctypes.c_int(n),
    ]


def k_tile_args(lay, n: int, m: int) -> list:
    """The whole parameter list of the GEMVs on k-tiled layouts (gemv_mma.cu, gemv_wg_simt.cu): _common_args, then
    k-tiles, groups, log2 group, M and the kernel permutation (none when prepared; an act-order call writes it)."""
    return _common_args(lay, n) + [ctypes.c_int(lay.k_tiles), ctypes.c_int(lay.num_groups), ctypes.c_int(lay.gk),
                                   ctypes.c_int(m), ctypes.c_void_p(0)]


class GemvLaunch:
    """A GEMV launch prepared for one weight, M and activation dtype (a call plan's launch): a call makes the output,
    writes the x / y / bias / clamp parameters and launches on the current stream. It holds the layout, so the
    weight pointers in its parameters stay valid as long as it lives."""

    __slots__ = ("launch", "layout", "m", "n", "dtype", "device", "_vals", "_lock", "_kp", "_es", "_epilogue")

    # x may come zero-padded to at least the layout's padded K (mixgemm.kernels.cuda.gather_x writes it so)
    reads_padded_x = True
    # x may be a contiguous [..., K] of any rank (its M rows K apart); y then gets x's leading shape
    takes_rows = True

    def __init__(self, launch, layout, m: int, n: int, dtype: torch.dtype, device: torch.device):
        self.launch, self.layout, self.m, self.n, self.dtype, self.device = launch, layout, m, n, dtype, device
        self._vals, self._lock = launch.params.values, launch.params.lock
        self._kp = layout.k_padded
        self._es = dtype.itemsize
        # the (lo, hi) the parameters hold for a call without bias, or None after a call with one: a repeated call
        # writes no epilogue (prepare wrote none: no bias, no clamp)
        self._epilogue = (-math.inf, math.inf)

    def __call__(self, x2d: torch.Tensor, bias: torch.Tensor | None, lo: float, hi: float,
                 perm: torch.Tensor | None = None) -> torch.Tensor:
        """clamp(x2d @ dequant(W).T + bias, lo, hi) for x2d [M, K] (unit stride along K) of the prepared M and
        dtype, or x2d [M, >= Kp] zero-padded past K (read as it is), or a contiguous [..., K] of M rows (y [..., N]);
        perm: the kernel permutation of a launch prepared for an act-order layer (None otherwise)."""
        es = self._es
        # the row stride: a contiguous [..., K]'s rows are K apart (its size-1 dims may carry any stride)
        two_d = x2d.dim() == 2
        ld = x2d.stride(0) if two_d else x2d.shape[-1]
        xp = x2d.data_ptr()
        if x2d.shape[-1] < self._kp or xp % 16 or (ld * es) % 16:
            xk = _prepare_x(x2d.reshape(-1, x2d.shape[-1]), self.layout)
            ld, xp = xk.stride(0), xk.data_ptr()
        y = new_rows(self.m, self.n, self.dtype, self.device) if two_d else \
            new_rows_like(x2d.shape[:-1], self.n, self.dtype, self.device)
        v = self._vals
        with self._lock:  # (launch.Params: written and launched by one thread at a time)
            v[_X].value = xp
            v[_XSTRIDE].value = ld * es // 16
            v[_Y].value = y.data_ptr()
            v[_YSTRIDE].value = self.n
            if bias is not None or self._epilogue != (lo, hi):
                nvrtc.set_bias_clamp(v, _EPILOGUE, bias, lo, hi)
                self._epilogue = None if bias is not None else (lo, hi)
            v[_PERM].value = 0 if perm is None else perm.data_ptr()
            self.launch()
        return y
