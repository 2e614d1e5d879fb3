"""The per-token activation quantizer for long rows (act_quant_rows.cu), shared by the int8-activation entries.

One CUDA block per row keeps the row in registers, so x is read once (the Triton tile kernel,
mixgemm.kernels.triton.act_quant, reads it twice). Its codes, scales, offsets and sums equal
mixgemm.formats.activation.quantize_activation(x, -1, mode) bit for bit. ``mode_defines`` is the one place an activation
mode becomes -D macros, for every kernel that quantizes x itself (act_quant.cuh).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from mixgemm import tuning
from mixgemm.formats.activation import ACT_MODES
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.launch import pdl_on

SOURCE = "act_quant_rows.cu"
XT = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}  # A8_XT: the activation dtype


@functools.cache
def _nvrtc_ok() -> bool:
    return nvrtc.nvrtc_available()


def mode_defines(act_mode: str) -> dict:
    """The -D macros an activation mode adds (act_quant.cuh): A8_SF 1 for "sym_full", none for "sym" / "asym" (a
    runtime argument picks between those two)."""
    if act_mode not in ACT_MODES:
        raise ValueError(f"act_mode must be one of {ACT_MODES}, got {act_mode!r}")
    return {"A8_SF": 1} if act_mode == "sym_full" else {}


ACTQ_NT = 512  # threads per row block (at most: shorter rows take fewer, actq_threads)
ACTQ_MAX_CPT = 16  # 16-byte units per thread held in registers (K <= 8 * 512 * 16 = 65536)
ACTQ_MIN_K = 4096  # shorter blocks: the Triton tile kernel already reads x once (act_quant_rows_supported)


def actq_threads(k: int) -> int:
    """Threads per row for K: tuning.A8_ACTQ_UNITS 8-element units each up to ACTQ_NT threads (a power of two >= 32),
    then more per thread."""
    return min(ACTQ_NT, max(32, 1 << (-(-k // (8 * tuning.A8_ACTQ_UNITS)) - 1).bit_length()))


def act_quant_rows_supported(x: torch.Tensor, block_size: int, min_k: int = ACTQ_MIN_K) -> bool:
    """True when :func:`act_quant_rows` handles x [M, K] with one block per row (block_size -1 or K). min_k: below it
    the Triton tile kernel is as fast (a call plan, whose launch is prepared, takes the row kernel from any K)."""
    if not (x.is_cuda and x.dim() == 2 and x.dtype in XT and _nvrtc_ok()):
        return False
    m, k = x.shape
    es = x.element_size()
    return (block_size in (-1, k) and min_k < k <= 8 * ACTQ_NT * ACTQ_MAX_CPT and k % 8 == 0 and m >= 1
            and x.stride(1) == 1 and (x.stride(0) * es) % 16 == 0 and x.data_ptr() % 16 == 0)


@torch.compiler.disable
def act_quant_rows(x: torch.Tensor, mode: str = "sym", out=None):
    """Per-token quantization of x [M, K] (fp16 / bf16 / fp32 CUDA, one block = the whole row) in one pass:
    one CUDA block per row keeps the row in registers (x read once). Equal, bit for bit, to
    mixgemm.formats.activation.quantize_activation(x, -1, mode) and to the Triton act_quant.
    Returns (q int8 [M, K], scales f32 [M, 1], offsets f32 [M, 1], sums int32 [M, 1]); ``out``: optional
    preallocated 4-tuple. Needs act_quant_rows_supported(x, -1)."""
    mode_defines(mode)  # (a ValueError naming a bad one)
    if not act_quant_rows_supported(x, -1, 0):
        raise ValueError("act_quant_rows: needs a CUDA fp16/bf16/fp32 x [M, K], K % 8 == 0, "
                         f"K <= {8 * ACTQ_NT * ACTQ_MAX_CPT}, 16-byte aligned unit-stride rows")
    return prepare_act_quant_rows(x.shape[0], x.shape[1], x.dtype, x.device, mode)(x, out)


def prepare_act_quant_rows(m: int, k: int, x_dtype: torch.dtype, dev: torch.device, mode: str,
                           pdl: bool | None = None) -> ActQuantRowsLaunch:
    """act_quant_rows' launch for M rows of K, built once (a call plan's first step). pdl: launched with programmatic
    dependent launch (its blocks queued during the previous kernel; the kernel waits before touching memory);
    default: kernel_options' pdl on sm_90."""
    nt = actq_threads(k)
    cpt = -(-(k // 8) // nt)
    fn = nvrtc.get_function(SOURCE, "mixgemm_act_quant_rows",
                            {"A8_ACTQ": cpt, "A8_XT": XT[x_dtype], "AQ_NT": nt, **mode_defines(mode)}, dev)
    args = [ctypes.c_void_p(0), ctypes.c_int(0), ctypes.c_void_p(0), ctypes.c_int(k), ctypes.c_void_p(0),
            ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_int(k), ctypes.c_int(1 if mode == "asym" else 0)]
    if pdl is None:
        pdl = pdl_on(dev)
    return ActQuantRowsLaunch(nvrtc.prepare_launch(fn, dev, (m, 1, 1), (nt, 1, 1), args, pdl=pdl), m, k, dev)


class ActQuantRowsLaunch:
    """The per-token quantizer prepared for M rows of K: a call makes (or takes) the four outputs, writes the
    pointers, launches on the current stream."""

    __slots__ = ("launch", "m", "k", "device", "_vals", "_lock")

    def __init__(self, launch, m: int, k: int, device: torch.device):
        self.launch, self.m, self.k, self.device = launch, m, k, device
        self._vals, self._lock = launch.params.values, launch.params.lock

    def __call__(self, x: torch.Tensor, out=None):
        m, k, dev = self.m, self.k, self.device
        if out is None:
            f32 = torch.float32
            out = (torch.empty((m, k), dtype=torch.int8, device=dev), torch.empty((m, 1), dtype=f32, device=dev),
                   torch.empty((m, 1), dtype=f32, device=dev), torch.empty((m, 1), dtype=torch.int32, device=dev))
        q, s, o, sm = out
        self.launch_into(x, q.data_ptr(), q.stride(0), s.data_ptr(), o.data_ptr(), sm.data_ptr())
        return out

    def launch_into(self, x: torch.Tensor, q_ptr: int, ldq: int, s_ptr: int, o_ptr: int, sums_ptr: int,
                    stream: int | None = None) -> None:
        """Quantize x into the given device addresses (codes [M, ldq] int8, scales / offsets float32 [M], sums int32
        [M]) on ``stream`` (default: the current one): a caller that consumes them at once keeps them in one
        allocation of its own."""
        v = self._vals
        with self._lock:  # (launch.Params: written and launched by one thread at a time)
            v[0].value, v[1].value = x.data_ptr(), x.stride(0)
            v[2].value, v[3].value = q_ptr, ldq
            v[4].value, v[5].value, v[6].value = s_ptr, o_ptr, sums_ptr
            self.launch(stream)
