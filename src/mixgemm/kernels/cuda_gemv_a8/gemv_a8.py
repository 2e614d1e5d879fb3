"""Fused activation-quantized GEMV (W4A8 / W8A8) for decode, M = 1..16: CUDA kernel gemv_a8.cu via NVRTC.

``gemv_a8(x2d, qw, act_mode, bias, lo, hi, out_dtype)`` = clamp(Qa(x2d) @ W.T + bias, lo, hi) in ONE launch:
every block quantizes the activations it needs (per token, per weight group, exactly
mixgemm.formats.activation.quantize_activation) into shared memory, then streams the weights
(layout a8gemv_v2, mixgemm.kernels.cuda_gemv_a8.layout: per channel the weight's own codes buffer) with int32 dp4a
products per unit folded into fp32.

* x2d: float16 / bfloat16 / float32 [M, K] CUDA, 1 <= M <= 16 (a 16-byte-aligned copy is made when its rows
  are not unit-stride / 16-byte aligned).
* qw: QuantizedWeight [N, K] on the same device, 4 or 8 bits, any mode, group 32..256 or per-channel.
* act_mode: "sym" | "asym" | "sym_full" (mixgemm.formats.activation; "sym_full" compiles the kernel with A8_SF).
  per_token: one activation scale per token over the whole row (act_block "token")
  instead of one per token and weight group (same thing for per-channel weights).
* bias: None or fp16 / bf16 / fp32 [N]. lo, hi: output clamp.
* out_dtype: float16 / bfloat16 / float32. ``out``: optional preallocated [M, N] output.
Returns [M, N]. Launched on torch.cuda.current_stream(); no host synchronization and no allocation other
than the output, so it is CUDA-graph capturable after the first call (compilation).
"""

from __future__ import annotations

import ctypes
import math

import torch

from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.act_quant_rows import mode_defines
from mixgemm.kernels.cuda.launch import new_rows, pdl_on
from mixgemm.kernels.cuda_gemv_a8.gemv_a8_config import GemvA8Config
from mixgemm.kernels.cuda_gemv_a8.layout import LAYOUT_NAME, A8GemvLayout, get_a8gemv_layout
from mixgemm.tuning.buckets import ShapeBucket, SourcedConfig
from mixgemm.tuning.gemv_m1 import a8_m1_entry

SOURCE = "cuda_gemv_a8/gemv_a8.cu"
KERNEL = "mixgemm_gemv_a8"
MAX_M = 16  # what the kernel handles
# Programmatic dependent launch on sm_90+ (as the W4A16 GEMV, kernels/cuda/gemv.py; off under
# kernel_options(pdl=False)): the kernel loads its first weights before griddepcontrol.wait, so it is not used for the
# first launch after the weight's layout was built (the build kernels write those weights).
WARPS = 8
_XT = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
_OUT = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
_BIAS = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3}
ROWS_PER_WARP = {1: 4, 2: 4, 4: 2, 8: 2, 16: 1}  # R per M bucket (registers: M * R * 3 accumulators)
def m_bucket(m: int) -> int:
    return 1 << (m - 1).bit_length()


def smem_bytes(lay: A8GemvLayout, mb: int) -> int:
    """Dynamic shared memory of one block: codes M x Kp bytes + per (token, group) scale, offset and sum +
    per (token, weight chunk) sum (layout identical to gemv_a8.cu)."""
    nc = lay.kp // (32 if lay.bits == 4 else 16)
    return mb * lay.kp + 4 * mb * (3 * lay.gp + nc)


def _smem_limit(dev) -> int:
    props = torch.cuda.get_device_properties(dev)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or 99 * 1024)


def choose_config(mb: int, n: int, steps: int, num_sms: int, bits: int = 4, k: int = 0) -> dict:
    """R rows per warp (by M bucket), KS warps along K per block (split K inside the block while the row
    tiles alone give fewer than ~32 warps per SM: decode shapes with small N), NW warps per block, PF
    register double buffering (0 / 1)."""
    hit = a8_m1_entry(bits, k, n) if mb == 1 and k > 0 else None
    if hit is not None:  # the measured tile of the layer's bucket (mixgemm.tuning.gemv_m1.A8_M1)
        tuned = hit.value
        return SourcedConfig(dict(tuned, RG=tuned["NW"] // tuned["KS"]),
                             f"gemv_a8 M = 1 W{bits}, {hit.where(ShapeBucket.of(k, n))}")
    r = ROWS_PER_WARP[mb]
    ks = 1
    while ks < WARPS and -(-n // r) * ks < num_sms * 32 and steps >= 2 * ks:
        ks *= 2
    return {"R": r, "KS": ks, "RG": WARPS // ks, "NW": WARPS, "PF": 0}


def complete_config(cfg: dict) -> dict:
    """A given tile config (R and KS; NW warps per block, default 8; PF, default 0; OP, default 1; GRID: None =
    persistent -- min(tiles, resident blocks x SMs), balanced --, "tiles" = one block per tile, or an int factor of
    SMs) with RG = NW / KS filled in."""
    GemvA8Config.from_dict(cfg)  # (a ValueError naming a key the kernel does not have)
    nw = cfg.get("NW", WARPS)
    return {**cfg, "NW": nw, "RG": cfg.get("RG", nw // cfg["KS"]), "PF": cfg.get("PF", 0), "OP": cfg.get("OP", 1)}


def config_for(lay: A8GemvLayout, m: int, n: int, k: int, num_sms: int) -> dict:
    """choose_config for this layout and M (the dispatcher hands the result to gemv_a8)."""
    ch = 32 if lay.bits == 4 else 16
    return choose_config(m_bucket(m), n, lay.kp // (32 * lay.u * ch), num_sms, lay.bits, k)


OPC_MAX = 8  # one-pass prologue: at most 8 x 16 bytes of x per thread held in registers (32 registers)


def one_pass_chunks(lay: A8GemvLayout, xt: int, threads: int, row_wide: bool) -> int:
    """A8_OPC of the one-pass row prologue for this layout (row_chunks with its K and padded K)."""
    return row_chunks(lay.k, lay.kp, xt, threads, row_wide)


def row_chunks(k: int, kp: int, xt: int, threads: int, row_wide: bool) -> int:
    """A8_OPC of the one-pass row prologue (a8_prologue.cuh; activation blocks = whole rows: per-channel weights or
    per-token activations): 8-k chunks of x per thread held in registers between the range and the quantization, so x
    is read once instead of twice; 0 (two passes) when K % 8 != 0 or the row (padded to kp) does not fit in OPC_MAX x
    16 bytes."""
    if not row_wide or k % 8:
        return 0
    opc = -(-(kp // 8) // threads)
    return opc if opc * (2 if xt == 2 else 1) <= OPC_MAX else 0


def defines_for(lay: A8GemvLayout, xt: int, mb: int, cfg: dict, per_token: bool = False,
                act_mode: str = "sym") -> dict:
    """NVRTC -D macros of one gemv_a8.cu instantiation: the layout's and the problem's, and the config's own
    (cfg: choose_config's dict, read as a GemvA8Config; "OP" 0 turns the one-pass prologue off)."""
    threads = 32 * cfg["RG"] * cfg["KS"]
    opc = one_pass_chunks(lay, xt, threads, per_token or lay.per_channel) if cfg.get("OP", 1) else 0
    return {"A8_BITS": lay.bits, "A8_XT": xt, "A8_M": mb, "A8_G": 0 if lay.per_channel else lay.group_size,
            "A8_U": lay.u, **GemvA8Config.from_dict(cfg).defines(), "A8_AT": int(per_token and not lay.per_channel),
            "A8_OPC": opc, **mode_defines(act_mode)}


def persistent_grid(ntiles: int, fn, threads: int, smem: int, num_sms: int, mode: str | int | None = None) -> int:
    """Persistent grid (mode None): each block quantizes x once, then loops over row tiles; the grid is the resident
    capacity, shrunk so every block gets the same number of tiles (no half-empty last round). "tiles": one block per
    tile; an int: that many blocks per SM."""
    if mode == "tiles":
        return ntiles
    cap = (int(mode) if isinstance(mode, int) else nvrtc.resident_blocks(fn, threads, smem)) * num_sms
    per = -(-ntiles // max(1, cap))
    return max(1, -(-ntiles // per))


def _prepare_x(x2d: torch.Tensor) -> torch.Tensor:
    es = x2d.element_size()
    if x2d.stride(1) == 1 and (x2d.stride(0) * es) % 16 == 0 and x2d.data_ptr() % 16 == 0:
        return x2d
    k = x2d.shape[1]
    kp = -(-k // 8) * 8
    xp = torch.zeros(x2d.shape[0], kp, dtype=x2d.dtype, device=x2d.device)
    xp[:, :k] = x2d
    return xp


@torch.compiler.disable
def gemv_a8(x2d: torch.Tensor, qw: QuantizedWeight, act_mode: str, bias: torch.Tensor | None, lo: float,
            hi: float, out_dtype: torch.dtype, out: torch.Tensor | None = None,
            per_token: bool = False, config: dict | None = None) -> torch.Tensor:
    """clamp(Qa(x2d) @ W.T + bias, lo, hi) -> [M, N] out_dtype (see the module docstring). config: the tile config
    (complete_config's keys; default: config_for)."""
    if not x2d.is_cuda or x2d.dim() != 2:
        raise ValueError("gemv_a8 needs a 2-D CUDA x [M, K]")
    m, k = x2d.shape
    n = qw.out_features
    if k != qw.in_features:
        raise ValueError(f"shape mismatch: x has K={k}, weight expects K={qw.in_features}")
    if x2d.dtype not in _XT:
        raise TypeError(f"gemv_a8: activation dtype {x2d.dtype} not supported (float16, bfloat16, float32)")
    if out_dtype not in _OUT:
        raise TypeError(f"gemv_a8: out_dtype {out_dtype} not supported")
    if not 1 <= m <= MAX_M:
        raise ValueError(f"gemv_a8 handles 1 <= M <= {MAX_M}, got M={m}")
    mode_defines(act_mode)  # (a ValueError naming a bad one)
    if qw.device != x2d.device:
        raise ValueError(f"device mismatch: x on {x2d.device}, weight on {qw.device}")
    if out is None:
        out = torch.empty(m, n, dtype=out_dtype, device=x2d.device)
    if n == 0:
        return out
    if bias is not None:
        if bias.dtype not in _BIAS:
            raise TypeError(f"bias dtype {bias.dtype} not supported (float16, bfloat16, float32)")
        bias = bias.contiguous()
    return prepare_gemv_a8(qw, m, x2d.dtype, x2d.device, act_mode, out_dtype, per_token, config)(x2d, bias, lo, hi,
                                                                                                   out)


def prepare_gemv_a8(qw: QuantizedWeight, m: int, x_dtype: torch.dtype, dev: torch.device, act_mode: str,
                    out_dtype: torch.dtype, per_token: bool, config: dict | None) -> GemvA8Launch:
    """The fused GEMV's launch for M rows of x_dtype, built once (layout, compiled kernel, grid, parameters); call it
    with x2d, bias, lo, hi (and optionally out)."""
    n, k = qw.out_features, qw.in_features
    fresh = not qw.has_layout(LAYOUT_NAME)  # its build kernels write the weights read before pdl_wait: no PDL
    lay = get_a8gemv_layout(qw)
    mb = m_bucket(m)
    smem = smem_bytes(lay, mb)
    if smem + 4096 > _smem_limit(dev):
        raise ValueError(f"gemv_a8: M={m}, K={k} needs {smem} bytes of shared memory (use the Triton path)")
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    cfg = complete_config(config) if config is not None else config_for(lay, m, n, k, num_sms)
    fn = nvrtc.get_function(SOURCE, KERNEL, defines_for(lay, _XT[x_dtype], mb, cfg, per_token, act_mode), dev)
    nvrtc.allow_dynamic_smem(fn, smem)
    threads = 32 * cfg["RG"] * cfg["KS"]
    ntiles = -(-n // (cfg["RG"] * cfg["R"]))
    grid = persistent_grid(ntiles, fn, threads, smem, num_sms, cfg.get("GRID"))
    args = [
        ctypes.c_void_p(lay.weight.data_ptr()),
        ctypes.c_void_p(lay.sdot.data_ptr()),
        ctypes.c_void_p(0 if lay.moff is None else lay.moff.data_ptr()),
        ctypes.c_void_p(lay.cterm.data_ptr()),
        *GemvA8Launch.call_args(_OUT[out_dtype]),
        ctypes.c_int(n),
        ctypes.c_int(k),
        ctypes.c_int(lay.kp),
        ctypes.c_int(lay.gp),
        ctypes.c_int(1 if act_mode == "asym" else 0),
        ctypes.c_int(m),
        ctypes.c_int(lay.kw),
    ]
    pdl = pdl_on(dev)
    launch = nvrtc.prepare_launch(fn, dev, (grid, 1, 1), (threads, 1, 1), args, smem, pdl=pdl,
                                  first_without_pdl=fresh)
    return GemvA8Launch(launch, lay, m, n, out_dtype, dev)


class GemvA8Launch:
    """The fused GEMV's launch prepared for one weight, M and dtypes (a call plan's launch); it holds the layout, so
    the weight pointers in its parameters stay valid as long as it lives."""

    __slots__ = ("launch", "layout", "m", "n", "out_dtype", "device", "x_at", "_vals", "_lock")
    # x may be a contiguous [..., K] of any rank (its M rows K apart); y then gets x's leading shape
    takes_rows = True

    def __init__(self, launch, layout, m: int, n: int, out_dtype: torch.dtype, device: torch.device, x_at: int = 4):
        """x_at: the index of the kernel's x pointer, followed by x's row stride, y, y's row stride, the output kind
        and the bias / clamp arguments (gemv_a8.cu: 4; gemv_a8_wg.cu: 2)."""
        self.launch, self.layout, self.m, self.n, self.out_dtype, self.device = launch, layout, m, n, out_dtype, device
        self.x_at = x_at
        self._vals, self._lock = launch.params.values, launch.params.lock

    @staticmethod
    def call_args(out_kind: int) -> list:
        """The kernel parameters from x_at on, as __call__ writes them per call: x, x's row stride, y, y's row stride,
        the output kind code (fixed) and the bias / clamp arguments."""
        return [ctypes.c_void_p(0), ctypes.c_int(0), ctypes.c_void_p(0), ctypes.c_int(0), ctypes.c_int(out_kind),
                *nvrtc.bias_clamp_args(None, -math.inf, math.inf)]

    def __call__(self, x2d: torch.Tensor, bias: torch.Tensor | None, lo: float, hi: float,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        es = x2d.element_size()
        # the row stride: a contiguous [..., K]'s rows are K apart (its size-1 dims may carry any stride)
        ld = x2d.stride(0) if x2d.dim() == 2 else x2d.shape[-1]
        if x2d.stride(-1) == 1 and (ld * es) % 16 == 0 and x2d.data_ptr() % 16 == 0:
            xk = x2d
        else:
            xk = _prepare_x(x2d.reshape(-1, x2d.shape[-1]))
            ld = xk.stride(0)
        if out is None:  # positional sizes: torch.empty parses them faster than a tuple
            out = (new_rows(self.m, self.n, self.out_dtype, self.device) if x2d.dim() == 2
                   else torch.empty(*x2d.shape[:-1], self.n, dtype=self.out_dtype, device=self.device))
        v, i = self._vals, self.x_at
        with self._lock:  # (launch.Params: written and launched by one thread at a time)
            v[i].value = xk.data_ptr()
            v[i + 1].value = ld
            v[i + 2].value = out.data_ptr()
            v[i + 3].value = out.stride(0) if out.dim() == 2 else self.n
            nvrtc.set_bias_clamp(v, i + 5, bias, lo, hi)
            self.launch()
        return out
