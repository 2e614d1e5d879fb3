"""Weight-only tensor-core GEMM for small M (gemm_mma.cu, compiled by NVRTC), M ~ 17..128.

``gemm_mma(x2d, qw, bias, lo, hi)`` computes ``clamp(x2d @ dequant(qw).T + bias, lo, hi)``:

* x2d: float16 / bfloat16 [M, K] on a CUDA device, any M >= 1 (tuned for 17..128; M above the block's
  M tile of 128 runs as several M tiles), any strides (a zero-padded aligned copy is made when rows are
  not 16-byte aligned, not unit-stride, or K is not a multiple of the layout's k-tile -- only possible
  for per-channel weights).
* qw: QuantizedWeight [N, K] on the same device, int4 or int8, any group size (32, 64, 128, 256,
  per-channel), any mode (sym / zero_point / offset), any scale dtype (fp16 / bf16 / fp32). Its
  ``gemv_mma_v1`` layout (mixgemm.formats.layouts, shared with the tensor-core GEMV) is built on first
  use and cached on the weight.
* bias: None or float16 / bfloat16 / float32 [N]. lo, hi: output clamp (floats, may be +-inf).
* Returns [M, N] in x2d.dtype. Launched on torch.cuda.current_stream(); no host synchronization. With
  split-K a fp32 workspace comes from the caching allocator and a per-device ticket buffer (allocated on
  the first split-K call, reset by the kernel itself) is reused, so the op is CUDA-graph capturable once
  the kernel for its shape class has been compiled and the ticket buffer exists (any first call).

Status (measured on an H200, benchmarks/gemm_mma_notes.md): correct on every format, but 0.4x-1.1x of fp16
cuBLAS on the protocol's LLM shapes -- not yet worth dispatching to (only 8192x28672-class layers at M <= 32
break even).
"""

from __future__ import annotations

import ctypes
import math

import torch

from mixgemm.formats.layouts import GemvMmaLayout, build_gemv_mma_v1
from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.cuda import nvrtc

SOURCE = "gemm_mma.cu"
KERNEL = "mixgemm_gemm_mma"
LAYOUT = "gemv_mma_v1"

_ACT = {torch.float16: 0, torch.bfloat16: 1}
_SCL = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
_MODE = {"sym": 0, "zero_point": 1, "offset": 2}
_BIAS = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3}

# GM_PRE (gemm_mma.cu): per-thread cp.async offsets computed once instead of per stage (the main loop's
# SASS drops from 892 to 661 instructions at W7/R2/MB8, 618 -> 324 at W8/R1/MB4). Address-identical to the
# generic loops (emulated in tests/test_gemm_mma.py) but NOT yet run on a GPU when this was written: off by
# default until scripts/bench_gemm_mma.py --pre and the GPU tests (which run both) have been run.
DEFAULT_PRE = 0

# Tuning hook for scripts/bench_gemm_mma.py only: a dict of config keys forced on every call when set.
CFG_OVERRIDE: dict | None = None

# Measured best configs (scripts/bench_gemm_mma.py --sweep, NVIDIA H200, W4 g128 zero_point / W8
# per-channel, fp16 activations; benchmarks/gemm_mma_notes.md), keyed (bits, MB, N, K). Other shapes use
# the rule in choose_config. (The W8 SK = 8 entries ran with ST = 2: three such stages do not fit.)
TUNED_SMS = 132  # the table applies to GPUs of this SM count (H100 / H200 SXM) when its smem fits
TUNED: dict = {
    (4, 4, 28672, 8192): {"W": 8, "R": 1, "S": 1, "ST": 4},             # M <= 32: 114.4 us
    (4, 8, 28672, 8192): {"W": 7, "R": 2, "S": 1, "ST": 3},             # M <= 64: 153.3 us
    (4, 4, 14336, 4096): {"W": 8, "R": 1, "S": 2, "ST": 4},             # 39.6 us
    (4, 8, 14336, 4096): {"W": 7, "R": 1, "S": 1, "ST": 4},             # 53.7 us
    (8, 4, 28672, 8192): {"W": 8, "R": 2, "S": 1, "SK": 8, "ST": 2},    # 123.0 us
    (8, 8, 28672, 8192): {"W": 8, "R": 2, "S": 1, "SK": 8, "ST": 2},    # 157.5 us
    (8, 4, 14336, 4096): {"W": 7, "R": 1, "S": 1, "ST": 4},             # 45.9 us
    (8, 8, 14336, 4096): {"W": 7, "R": 1, "S": 1, "ST": 4},             # 57.9 us
}

# opt-in dynamic shared memory per block by compute capability (1 KiB left for the kernel's static
# shared memory); the device's own value wins when torch reports it
SMEM_LIMIT = {8: 162 * 1024, 9: 226 * 1024}


def smem_limit_of(props) -> int:
    optin = getattr(props, "shared_memory_per_block_optin", 0)
    if optin:
        return int(optin) - 1024
    if props.major == 8 and props.minor != 0:
        return 99 * 1024 - 1024  # sm_86 / sm_89
    return SMEM_LIMIT.get(props.major, 226 * 1024 if props.major > 9 else 47 * 1024)


def gemm_mma_supported(m: int, x_dtype: torch.dtype, qw: QuantizedWeight) -> bool:
    """True when this kernel handles the problem: M >= 1, fp16 / bf16 activations, int4 / int8 weights."""
    return m >= 1 and x_dtype in _ACT and qw.bits in (4, 8)


def m_block(m: int) -> int:
    """n8 blocks of the compiled M tile serving m rows: 2 (M <= 16), 4 (<= 32), 8 (<= 64), else 16."""
    for mb in (2, 4, 8):
        if m <= 8 * mb:
            return mb
    return 16


def k_tile(bits: int) -> int:
    return 64 if bits == 4 else 32


def smem_bytes(bits: int, cfg: dict) -> int:
    """Dynamic shared memory of one block (mirrors the constants of gemm_mma.cu)."""
    kt = k_tile(bits)
    mt, tr, sk = 8 * cfg["MB"], cfg["W"] * cfg["R"], cfg["SK"]
    xraw = sk * kt * 2
    xtgt = 16 if bits == 4 else 64
    xrow = xraw + ((xtgt - xraw % 128) + 128) % 128
    stage = tr * sk * 512 + mt * xrow
    red = mt * (16 * tr + 4) * 4
    return max(cfg["ST"] * stage, red)


def _cost_ns(mb: int, tr: int, kt: int, splits: int, blocks: int, num_sms: int, bits: int, bps: int) -> float:
    """Rough time model of one launch: waves x (per-block work + fixed cost), bps blocks sharing an SM.
    Per 16-row tile and k-tile an SM needs max(tensor cores ~4.3 ns per n8 block, HBM 512 B at ~32 B/ns,
    L2 -> SM traffic (512 B of weights + this tile's share of the block's activation chunk) at ~50 B/ns);
    fixed ~1.5 us per block (pipeline fill, epilogue); split-K costs ~1 us per n8 block of the M tile
    (measured on H200: S = 2 was 5% faster at MB = 4 on 4096x14336 but 27% slower at MB = 8)."""
    kps = -(-kt // splits)
    waves = -(-blocks // (num_sms * bps))
    xb = 8 * mb * k_tile(bits) * 2 / tr
    per = tr * kps * max(4.3 * mb, 16.0, (512.0 + xb) / 50.0) * bps
    return waves * (per + 1500.0 + (1000.0 * mb if splits > 1 else 0.0))


def _tuned(bits, mb, n, k, num_sms, sk, smem_limit):
    """The measured table's config for this case, when it applies (same SM count, shared memory fits)."""
    t = TUNED.get((bits, mb, n, k))
    if t is None or num_sms != TUNED_SMS:
        return None
    cfg = {"MB": mb, "SK": sk, **t}
    return cfg if smem_bytes(bits, cfg) <= smem_limit else None


def choose_config(m: int, n: int, k: int, num_sms: int, bits: int = 4, smem_limit: int = 226 * 1024) -> dict:
    """Deterministic tile choice from (M, N, K, SMs): measured table first, else the cost model.

    MB n8 activation blocks per M tile; W warps x R 16-row tiles per block (R * MB <= 16: the fp32
    accumulators stay in registers); SK k-tiles per pipeline stage (128 k); ST ring stages; S split-K
    factor (grid.z)."""
    mb = m_block(m)
    kt = -(-k // k_tile(bits))
    sk = 2 if bits == 4 else 4
    if CFG_OVERRIDE is not None:
        cfg = {"MB": mb, "W": 8, "R": 2 if mb <= 8 else 1, "SK": sk, "ST": 4, "S": 1, **CFG_OVERRIDE}
    elif _tuned(bits, mb, n, k, num_sms, sk, smem_limit) is not None:
        cfg = _tuned(bits, mb, n, k, num_sms, sk, smem_limit)
    else:
        nt = -(-n // 16)
        mtiles = -(-m // (8 * mb))
        best = None
        for r in (1, 2, 4):
            if r * mb > 16:
                continue
            for w in (4, 5, 6, 7, 8):
                tr = w * r
                c0 = {"MB": mb, "W": w, "R": r, "SK": sk, "ST": 4}
                sm = smem_bytes(bits, c0)
                while c0["ST"] > 2 and sm > smem_limit:
                    c0["ST"] -= 1
                    sm = smem_bytes(bits, c0)
                if sm > smem_limit:
                    continue
                # resident blocks per SM: ~256 registers per thread budgeted, 228 KiB shared memory
                bps = max(1, min(8 // w, (228 * 1024) // (sm + 1024)))
                rblocks = -(-nt // tr)
                for s in range(1, 17):
                    if s > 1 and -(-kt // s) < 4 * sk:  # keep >= 4 stages per split
                        break
                    c = _cost_ns(mb, tr, kt, s, rblocks * mtiles * s, num_sms, bits, bps)
                    key = (c, s, -tr, -w)
                    if best is None or key < best[0]:
                        best = (key, {"W": w, "R": r, "S": s})
        cfg = {"MB": mb, "SK": sk, "ST": 4, **best[1]}
    cfg.setdefault("ST", 4)
    cfg.setdefault("SK", sk)
    cfg.setdefault("S", 1)
    while cfg["ST"] > 2 and smem_bytes(bits, cfg) > smem_limit:
        cfg["ST"] -= 1
    return cfg


def defines_for(bits: int, act: int, scl: int, mode: int, cfg: dict) -> dict:
    """NVRTC -D macros of one gemm_mma.cu instantiation (the split factor S is a launch parameter)."""
    return {"GM_BITS": bits, "GM_ACT": act, "GM_SCL": scl, "GM_MODE": mode, "GM_MB": cfg["MB"],
            "GM_W": cfg["W"], "GM_R": cfg["R"], "GM_SK": cfg["SK"], "GM_ST": cfg["ST"],
            "GM_MINB": cfg.get("MINB", 1), "GM_PRE": cfg.get("PRE", DEFAULT_PRE)}


# -- launch helpers (own copies: gemv.py's private helpers change independently) ------------------------

_smem_set: dict = {}


def _allow_smem(fn, nbytes: int) -> None:
    """Raise fn's dynamic shared memory limit to nbytes (needed above the default 48 KiB)."""
    if nbytes <= 48 * 1024 or _smem_set.get(id(fn), 0) >= nbytes:
        return
    from cuda.bindings import driver

    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    err, = driver.cuFuncSetAttribute(fn, attr, nbytes)
    if int(err) != 0:
        raise RuntimeError(f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes}) failed: {err!r}")
    _smem_set[id(fn)] = nbytes  # fn objects live for the process in nvrtc's module cache


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


def _common_args(lay, xk, y, bias, lo, hi, n) -> list:
    """Leading kernel parameters: weight, params, x, x row stride (16-byte units), y, y row stride, bias,
    bias dtype code, clamp lo / hi, N."""
    return [
        ctypes.c_void_p(lay.weight.data_ptr()),
        ctypes.c_void_p(lay.params.data_ptr()),
        ctypes.c_void_p(xk.data_ptr()),
        ctypes.c_int(xk.stride(0) * xk.element_size() // 16),
        ctypes.c_void_p(y.data_ptr()),
        ctypes.c_int(y.stride(0)),
        ctypes.c_void_p(0 if bias is None else bias.data_ptr()),
        ctypes.c_int(0 if bias is None else _BIAS[bias.dtype]),
        ctypes.c_float(lo if math.isfinite(lo) else -math.inf),
        ctypes.c_float(hi if math.isfinite(hi) else math.inf),
        ctypes.c_int(n),
    ]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


_tickets: dict = {}


def _ticket_buffer(device: torch.device, count: int) -> torch.Tensor:
    """Per-device int32 zeros, >= count entries; the kernel leaves every entry it uses at 0 again."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    buf = _tickets.get(idx)
    if buf is None or buf.numel() < count:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "gemm_mma: split-K ticket buffer must grow during CUDA-graph capture; "
                "run the same shape once before capturing")
        buf = torch.zeros(max(count, 1 << 16), dtype=torch.int32, device=torch.device("cuda", idx))
        _tickets[idx] = buf
    return buf


@torch.compiler.disable
def gemm_mma(x2d: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None, lo: float, hi: float) -> torch.Tensor:
    """clamp(x2d @ dequant(qw).T + bias, lo, hi) -> [M, N] in x2d.dtype (see the module docstring)."""
    if not x2d.is_cuda:
        raise ValueError(f"gemm_mma needs CUDA tensors, x is on {x2d.device}")
    if x2d.dim() != 2:
        raise ValueError(f"gemm_mma takes x as 2-D [M, K], got shape {tuple(x2d.shape)}")
    m, k = x2d.shape
    n = qw.out_features
    if k != qw.in_features:
        raise ValueError(f"shape mismatch: x has K={k}, weight expects K={qw.in_features}")
    if x2d.dtype not in _ACT:
        raise TypeError(f"gemm_mma: activation dtype {x2d.dtype} not supported (float16, bfloat16)")
    if qw.bits not in (4, 8):
        raise ValueError(f"gemm_mma: {qw.bits}-bit weights not supported (4, 8)")
    if qw.device != x2d.device:
        raise ValueError(f"device mismatch: x on {x2d.device}, weight on {qw.device}")
    y = torch.empty(m, n, dtype=x2d.dtype, device=x2d.device)
    if m == 0 or n == 0:
        return y
    if bias is not None:
        if bias.dtype not in _BIAS:
            raise TypeError(f"bias dtype {bias.dtype} not supported (float16, bfloat16, float32)")
        if bias.shape != (n,):
            raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
        if bias.device != x2d.device:
            raise ValueError(f"device mismatch: x on {x2d.device}, bias on {bias.device}")
        bias = bias.contiguous()
    dev = x2d.device
    props = torch.cuda.get_device_properties(dev)
    lay: GemvMmaLayout = qw.layout(LAYOUT, build_gemv_mma_v1)
    xk = _prepare_x(x2d, lay)
    limit = smem_limit_of(props)
    cfg = choose_config(m, n, k, props.multi_processor_count, qw.bits, limit)
    defs = defines_for(qw.bits, _ACT[x2d.dtype], _SCL[qw.scales.dtype], _MODE[qw.mode], cfg)
    fn = nvrtc.get_function(SOURCE, KERNEL, defs, dev)
    smem = smem_bytes(qw.bits, cfg)
    _allow_smem(fn, smem)
    mt, tr = 8 * cfg["MB"], cfg["W"] * cfg["R"]
    kt = lay.k_tiles
    nt = -(-n // 16)
    mtiles, rblocks = -(-m // mt), -(-nt // tr)
    # k-tiles per split: a multiple of the stage (SK); the grid only counts non-empty splits
    kps = _cdiv(_cdiv(kt, cfg["S"]), cfg["SK"]) * cfg["SK"]
    splits = -(-kt // kps)
    if splits > 1:
        ws = torch.empty(splits * mtiles * rblocks * mt * 16 * tr, dtype=torch.float32, device=dev)
        tickets = _ticket_buffer(dev, mtiles * rblocks)
        ws_ptr, tk_ptr = ws.data_ptr(), tickets.data_ptr()
    else:
        ws_ptr = tk_ptr = 0
    args = _common_args(lay, xk, y, bias, lo, hi, n) + [
        ctypes.c_int(kt),
        ctypes.c_int(lay.num_groups),
        ctypes.c_int(lay.gk),
        ctypes.c_int(m),
        ctypes.c_int(kps),
        ctypes.c_void_p(ws_ptr),
        ctypes.c_void_p(tk_ptr),
    ]
    if mtiles > 65535 or rblocks > 65535:
        raise ValueError(f"gemm_mma: M={m} / N={n} exceed the grid limits of this kernel")
    with torch.cuda.device(dev):
        nvrtc.launch(fn, (mtiles, rblocks, splits), (32 * cfg["W"], 1, 1), args,
                     torch.cuda.current_stream(dev).cuda_stream, smem)
    return y


__all__ = ["gemm_mma", "gemm_mma_supported", "choose_config", "defines_for", "m_block", "smem_bytes"]
