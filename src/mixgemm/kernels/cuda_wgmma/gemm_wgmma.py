"""Weight-only GEMM on Hopper wgmma (CUDA C++ / inline PTX, gemm_wgmma.cu, compiled by NVRTC for sm_90a).

``gemm_wgmma(x2d, qw, bias, lo, hi, config=None)`` computes ``clamp(x2d @ dequant(qw).T + bias, lo, hi)``:

* x2d: float16 / bfloat16 [M, K] on an sm_90 GPU, unit stride along K (a zero-padded aligned copy is made
  when rows are not 16-byte aligned or K % 8 != 0). Any M >= 1.
* qw: QuantizedWeight [N, K] on the same device: int4 / int8, group 32..256 or per-channel, any mode, any
  scale dtype. Its ``wgmma_v1`` layout (mixgemm.kernels.cuda_wgmma.layout) is built on first use and cached.
* bias: None or float16 / bfloat16 / float32 [N]. lo, hi: output clamp (may be +-inf).
* config: None (``default_config``) or a dict of short keys, each defined and documented in config.py
  (``WgmmaConfig``: BM, NWG, STAGES, INFLIGHT, KT, SPLIT, GROUP_M, TMA, SK, FOLD, MINB, TSTORE, CLUSTER, SERIAL,
  PDL, WS, TAIL, TAIL_WAIT, ROWS).
* Returns [M, N] in x2d.dtype; fp32 accumulation. Launched on the current stream; no host synchronization;
  allocations: the output, plus an fp32 [M, N] workspace when SPLIT > 1 without CLUSTER or SERIAL, with SERIAL an
  fp32 [tiles, SPLIT] partial-tile workspace (and a per-device, per-stream int32 counter per tile, allocated zeroed
  once and left zeroed by every launch), or with SK an fp32 partial-tile workspace (2 tiles per CTA) and an int32
  stage count per output tile.
"""

from __future__ import annotations

import ctypes
import math
import weakref
from dataclasses import astuple, dataclass

import torch

from mixgemm._checks import check_matmul_inputs
from mixgemm.formats.layouts import K_TILE
from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.cuda import launch as cuda_launch
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.rows_layout import ROWS_LAYOUT, RowsLayout, build_rows_v1
from mixgemm.kernels.cuda.stream_buffers import tile_counters
from mixgemm.kernels.cuda_wgmma.layout import WgmmaLayout, build_wgmma_v1

SOURCE = "cuda_wgmma/gemm_wgmma.cu"
KERNEL = "mixgemm_gemm_wgmma"
LAYOUT = "wgmma_v1"
SMEM_LIMIT = 227 * 1024  # opt-in shared memory per block on sm_90
CLUSTER_MAX = 8  # portable thread-block cluster size (CLUSTER: split-K slices per cluster)
# the k-slices a TAIL's partial wave may take (the weight-only split from wgmma_waves.tail_split, the int8 GEMM's from
# gemm_wgmma_a8.tail_split_rule): past 4, each further slice's reduction costs more than the steps it saves
TAIL_SPLITS = (2, 3, 4)

_ACT = {torch.float16: 0, torch.bfloat16: 1}
_SCL = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
_MODE = {"sym": 0, "zero_point": 1, "offset": 2}
_BIAS = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3}


def wgmma_supported(x_dtype: torch.dtype, qw: QuantizedWeight, device: torch.device) -> bool:
    """True when this kernel runs the problem: an sm_90 GPU, fp16 / bf16 activations, int4 / int8 weights."""
    if device.type != "cuda" or x_dtype not in _ACT or qw.bits not in (4, 8) or not nvrtc.nvrtc_available():
        return False
    return torch.cuda.get_device_capability(device) == (9, 0)


def stage_bytes(bm: int, nwg: int, bits: int, scl_bytes: int, mode: str, g2: bool, kt: int = 1, tma: int = 0) -> int:
    """Shared memory of one pipeline stage of kt 64-k tiles (must match gemm_wgmma.cu's STAGE)."""
    warps = 4 * nwg
    pb = scl_bytes * (1 if mode == "sym" else 2)
    pwarps = max(warps, 8) if tma else warps  # the TMA loader stages whole 8-tile blocks of parameters
    raw = kt * (bm * 128 + warps * (512 if bits == 4 else 1024) + pwarps * (2 if g2 else 1) * 16 * pb)
    return -(-raw // 1024) * 1024


def default_config(m: int, n: int, k: int, sms: int = 132) -> dict:
    """Tile choice from the problem size (deterministic, no autotuning); the shipped tables override it."""
    bm = 8
    while bm < min(m, 128):
        bm *= 2
    if m >= 2048:
        bm = 256
    # measured on H200 (docs/kernels/cuda_wgmma.md): TMA loader from M = 256 (BM 256), cp.async below
    cfg = {"BM": bm, "NWG": 2, "STAGES": 5 if bm == 256 else 4, "INFLIGHT": 2 if bm == 256 else 1,
           "TMA": int(bm == 256), "GROUP_M": 8}
    if bm == 256:
        cfg["TAIL"] = "auto"  # a partial last wave of at most half the SMs runs as split-K pairs (tail_rows)
    cfg["SPLIT"] = auto_split(m, n, k, cfg, sms)
    return cfg


def auto_split(m: int, n: int, k: int, cfg: dict, sms: int) -> int:
    """Split-K factor that brings the CTA count to about one wave (1 when the tiles already fill the GPU)."""
    tiles = output_tiles(m, n, cfg["BM"], cfg["NWG"])
    kt = math.ceil(k / K_TILE)
    if tiles >= sms or kt < 16:
        return 1
    return max(1, min(8, round(sms / tiles), kt // 8))


def output_tiles(m: int, n: int, bm: int, nwg: int) -> int:
    """Output tiles of a launch: 64 * NWG weight rows by BM rows of x each."""
    return math.ceil(n / (64 * nwg)) * math.ceil(m / bm)


def k_slices(kt: int, split: int, ktile: int) -> tuple[int, int]:
    """(split-K slices, 64-k tiles per slice) of kt 64-k tiles asked to split ``split`` ways: each slice takes whole
    stages of ``ktile`` tiles, so fewer slices than asked may result."""
    split = max(1, min(split, kt))
    per = -(-math.ceil(kt / split) // ktile) * ktile
    return math.ceil(kt / per), per


def staging_chunk(bm: int, nwg: int, ring_bytes: int) -> int:
    """8-row blocks per piece of SK 2's TMA-store staging (WG_TS_CHUNK): the whole tile (BM / 8) where its NWG x BM x
    128 bytes fit beside a ring of ``ring_bytes``, else the largest even divisor of BM / 8 whose piece fits (so the
    ring keeps its stages), else the whole tile (the ring is then cut to fit)."""
    room = SMEM_LIMIT - ring_bytes - 1024
    blocks = bm // 8
    for d in [blocks] + [d for d in range(blocks - 1, 1, -1) if d % 2 == 0 and blocks % d == 0]:
        if nwg * d * 8 * 128 <= room:
            return d
    return blocks


def fitted_stages(keys: TileKeys, sb: int, extra: int = 0) -> int:
    """STAGES lowered, not below the tile's minimum, until the ring of ``sb``-byte stages, ``extra`` bytes and the
    alignment slack fit in SMEM_LIMIT (the launch's ``fit``)."""
    stages = keys.stages
    while stages > keys.min_stages and stages * sb + extra + 1024 > SMEM_LIMIT:
        stages -= 1
    return stages


def _prepare_x(x2d: torch.Tensor) -> torch.Tensor:
    """x2d itself when the kernel can read it (16-byte aligned rows, K % 8 == 0), else a padded copy."""
    es = x2d.element_size()
    k = x2d.shape[1]
    if k % 8 == 0 and (x2d.stride(0) * es) % 16 == 0 and x2d.data_ptr() % 16 == 0:
        return x2d
    xp = torch.zeros(x2d.shape[0], -(-k // 8) * 8, dtype=x2d.dtype, device=x2d.device)
    xp[:, :k] = x2d
    return xp


# TSTORE default when the config does not say (benchmarks flip it for same-run A/B timings)
TSTORE = True

_TMAPS: dict = {}  # key -> CUtensorMap (kept alive here): 2-D swizzled maps and the conv's im2col maps
_TMAP_DTYPES = {torch.float16: "FLOAT16", torch.bfloat16: "BFLOAT16", torch.int8: "UINT8", torch.uint8: "UINT8"}


def swizzled_tensor_map(t: torch.Tensor, box_cols: int, box_rows: int):
    """TMA descriptor of a row-major 2-D tensor t (float16 / bfloat16 / int8) for boxes of box_cols x box_rows with
    the 128-byte swizzle (the layout the wgmma descriptor reads), zero fill past the edges. Encoded on the host once
    per (address, shape, stride, dtype, box); shared by the weight-only and the int8 wgmma GEMMs."""
    key = (t.data_ptr(), t.shape[0], t.shape[1], t.stride(0), t.dtype, box_cols, box_rows)
    return cached_tensor_map(key, lambda: encode_tensor_map(t.data_ptr(), t.shape[0], t.shape[1], t.stride(0), t.dtype,
                                                            box_cols, box_rows))


def encode_tensor_map(ptr: int, rows: int, cols: int, row_stride: int, dtype: torch.dtype, box_cols: int,
                      box_rows: int, swizzle: int = 128):
    """The swizzled_tensor_map of a [rows, cols] matrix at address ptr with row_stride elements per row (swizzle: 128
    or 64 bytes)."""
    drv = nvrtc._driver()
    dt = getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{_TMAP_DTYPES[dtype]}")
    es = torch.empty((), dtype=dtype).element_size()
    err, tm = drv.cuTensorMapEncodeTiled(
        dt, 2, ptr, [drv.cuuint64_t(cols), drv.cuuint64_t(rows)],
        [drv.cuuint64_t(row_stride * es)], [drv.cuuint32_t(box_cols), drv.cuuint32_t(box_rows)],
        [drv.cuuint32_t(1), drv.cuuint32_t(1)],
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(drv.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swizzle}B"),
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if int(err) != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed for {dtype} ({rows}, {cols}) (row stride {row_stride}): "
                           f"{err!r}")
    return tm


def cached_tensor_map(key: tuple, encode):
    """The tensor map for key, encoded by encode() on first use (host-side, once per address / shape / box); the
    cache holds the maps alive and is emptied when it reaches 1024 entries."""
    tm = _TMAPS.get(key)
    if tm is None:
        tm = encode()
        if len(_TMAPS) >= 1024:
            _TMAPS.clear()
        _TMAPS[key] = tm
    return tm


_warned: list = []


def _warn_no_tma(e: Exception) -> None:
    if not _warned:
        import warnings

        warnings.warn(f"mixgemm: TMA tensor map unavailable ({e}); the wgmma GEMM uses its cp.async loader",
                      RuntimeWarning, stacklevel=3)
        _warned.append(e)


def _check(x2d: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None):
    """The public ops' checks (shape, device, bias) plus what this kernel needs on top."""
    if x2d.dim() != 2:
        raise ValueError(f"x2d must be 2-D [M, K], got shape {tuple(x2d.shape)}")
    if x2d.dtype not in _ACT:
        raise TypeError(f"the wgmma GEMM takes float16 / bfloat16 activations, got {x2d.dtype}")
    check_matmul_inputs(x2d, qw, bias, tuple(_ACT))
    if x2d.stride(1) != 1:
        raise ValueError("x2d must have unit stride along K")
    if not x2d.is_cuda:
        raise ValueError(f"the wgmma GEMM needs CUDA tensors, x2d is on {x2d.device}")
    if qw.bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {qw.bits}")
    if bias is not None and bias.dtype not in _BIAS:
        raise ValueError(f"bias must be float16/bfloat16/float32, got {bias.dtype}")


@torch.compiler.disable
def gemm_wgmma(x2d: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None, lo: float, hi: float,
               config: dict | None = None, fit: bool = False) -> torch.Tensor:
    """clamp(x2d @ dequant(qw).T + bias, lo, hi) in x2d.dtype (see the module docstring).

    fit: lower STAGES until the stages fit in shared memory (the dispatcher's table configs are measured on int4
    fp16-scale weights, whose stages are the smallest); without it an oversized config raises."""
    _check(x2d, qw, bias)
    m, k = x2d.shape
    y = torch.empty(m, qw.out_features, dtype=x2d.dtype, device=x2d.device)
    if m == 0 or qw.out_features == 0:
        return y
    xk = _prepare_x(x2d)
    return run(qw, xk, None, y, bias, lo, hi, config, fit)


@dataclass(frozen=True)
class ConvGeometry:
    """WG_CONV: the implicit GEMM's view of a convolution (gemm_wgmma.cu's ConvGeo, in its field order).

    Output pixel m = (n * P + p) * Q + q; 64-k tile kk covers channels 64 * (kk % cpt) .. of filter tap kk // cpt =
    kh * Kw + kw, read at input pixel (q * sw - pw + kw * dw, p * sh - ph + kh * dh)."""

    cpt: int  # 64-channel k-tiles per tap (Ci / 64)
    kw: int  # filter width (taps per filter row)
    q: int  # output width Q
    pq: int  # output pixels per image P * Q
    sw: int
    sh: int
    pw: int
    ph: int
    dw: int
    dh: int

    def as_ctypes(self):
        return (ctypes.c_int * 10)(*astuple(self))


def run(qw: QuantizedWeight, xk: torch.Tensor, conv: tuple | None, y: torch.Tensor, bias, lo: float, hi: float,
        config: dict | None, fit: bool) -> torch.Tensor:
    """Launch the kernel into y [M, N] (row-major; y's rows need not be contiguous with each other).

    GEMM: xk is the [M, K] activation matrix (16-byte aligned rows, K % 8 == 0), conv None.
    Convolution (WG_CONV): xk is the channels_last input tensor, conv = (ConvGeometry, make_map) with make_map(bm)
    the im2col tensor map for boxes of 64 channels x bm pixels; M = y.shape[0] output pixels."""
    if bias is not None:
        bias = bias.contiguous()
    props = torch.cuda.get_device_properties(y.device)
    parts = _prepare_parts(qw, y.shape[0], y.shape[1], xk.dtype, xk.stride(0), xk.shape[1], conv,
                           OutputRows(y.dtype, y.stride(0), y.data_ptr() % 16 == 0, y.device), config, fit, props)
    for part in parts:
        part(xk, y, bias, lo, hi)
    return y


@dataclass(frozen=True)
class OutputRows:
    """What a launch's epilogue choice reads about the output: its dtype, row stride (elements), whether its base is
    16-byte aligned, and its device."""

    dtype: torch.dtype
    row_stride: int
    aligned: bool
    device: torch.device

    def tstore_fits(self, bm: int, nwg: int, ring_bytes: int | None = None) -> bool:
        """tstore_fits for an output with these rows."""
        return (self.dtype in (torch.float16, torch.bfloat16) and (self.row_stride * 2) % 16 == 0 and self.aligned
                and bm >= 16 and (ring_bytes is None or ring_bytes >= nwg * bm * 128))


def _prepare_parts(qw: QuantizedWeight, m: int, n: int, x_dtype: torch.dtype, x_row_stride: int, x_cols: int,
                   conv: tuple | None, out: OutputRows, config: dict | None, fit: bool, props) -> list:
    """The launches of one product into an [M, N] output: one, or two with TAIL (whole waves, then the tail rows)."""
    cfg = dict(config) if config is not None else default_config(m, n, qw.in_features, props.multi_processor_count)
    n0, tail_split = tail_rows(m, n, cfg, props.multi_processor_count) if conv is None else (0, 0)
    args = (qw, m, x_dtype, x_row_stride, x_cols, conv, out)
    if not n0:
        return [_prepare_launch(*args, n, cfg, fit, props, 0)]
    # TAIL: the whole waves of tiles over weight rows [0, n0), then the rows past n0 as a cluster split-K launch: the
    # last partial wave's tiles run as TAIL k-slices each, so that wave takes about 1 / TAIL of a tile's time
    # (WG_CHAIN: the tail's CTAs start as the first launch's free their SMs, unless TAIL_WAIT)
    cut = {**cfg, "TAIL": 0}
    tail = {**cut, "SPLIT": tail_split, "CLUSTER": 1, "SERIAL": 0}
    chain = (0, 0) if int(cfg.get("TAIL_WAIT", 0)) else (1, 2)
    return [_prepare_launch(*args, n0, cut, fit, props, 0, chain[0]),
            _prepare_launch(*args, n - n0, tail, fit, props, n0, chain[1])]


def prepare_wgmma(qw: QuantizedWeight, m: int, x_dtype: torch.dtype, dev: torch.device, config: dict | None,
                  fit: bool) -> WgmmaLaunch:
    """The GEMM's launches for M rows of x_dtype (a fresh contiguous output, x rows of the padded K), built once for a
    call plan; call the result with x2d, bias, lo, hi."""
    props = torch.cuda.get_device_properties(dev)
    k = qw.in_features
    kx = -(-k // 8) * 8  # _prepare_x's row length
    parts = _prepare_parts(qw, m, qw.out_features, x_dtype, kx, kx, None,
                           OutputRows(x_dtype, qw.out_features, True, dev), config, fit, props)
    return WgmmaLaunch(parts, m, qw.out_features, kx, x_dtype, dev, config, fit, qw)


class WgmmaLaunch:
    """The GEMM prepared for one weight, M and activation dtype (a call plan's launch). x rows of another stride than
    prepared for (a strided view) take the unprepared route, run()."""

    def __init__(self, parts, m, n, kx, dtype, device, config, fit, qw):
        self.parts, self.m, self.n, self.kx, self.dtype, self.device = parts, m, n, kx, dtype, device
        self._config, self._fit = config, fit
        self._qw = weakref.ref(qw)  # for the unprepared route only (the plan must not keep its weight alive)

    def __call__(self, x2d: torch.Tensor, bias, lo: float, hi: float) -> torch.Tensor:
        xk = _prepare_x(x2d)
        y = cuda_launch.new_rows(self.m, self.n, self.dtype, self.device)
        if bias is not None and not bias.is_contiguous():
            bias = bias.contiguous()
        if xk.stride(0) != self.kx:
            return run(self._qw(), xk, None, y, bias, lo, hi, self._config, self._fit)
        for part in self.parts:
            part(xk, y, bias, lo, hi)
        return y


def tail_rows(m: int, n: int, cfg: dict, sms: int) -> tuple[int, int]:
    """Config key TAIL: (n0, split) -- the first n0 weight rows run as whole waves of tiles, the rest as split-K
    clusters of `split` slices; (0, 0) when TAIL is off or does not apply (stream-K, split-K, less than one wave of
    tiles, or no partial wave left). n0 is rounded down to a multiple of 128, the layout's row block, where the
    second launch's weight pointers start.

    TAIL 2..8 forces that split; "auto" takes split 2 where the partial wave's tiles fill at most half the SMs, as
    their halves then all run at once: measured on the H100 (docs/kernels/cuda_wgmma.md), split 2 turned 4096 x
    14336 M = 1024 (3.4 waves) from 197 into 178 us, and lost 4-11% where the partial wave was 0.6-0.8 full (the halves
    then need two rounds) as did splits 3 and 4 (their cluster reduction costs more than the rounds they save)."""
    split = cfg.get("TAIL", 0)
    if split != "auto" and int(split) not in (0, 1, *range(2, CLUSTER_MAX + 1)):
        raise ValueError(f"bad wgmma TAIL={split}: 0 (off), 'auto' or a split-K factor 2..{CLUSTER_MAX}")
    if split in (0, 1, "0", "1") or int(cfg.get("SK", 0)) or cfg.get("SPLIT", 1) not in (1, "1"):
        return 0, 0
    rows = 64 * int(cfg.get("NWG", 2))
    tiles_n, tiles_m = -(-n // rows), -(-m // int(cfg["BM"]))
    slots = sms * int(cfg.get("MINB", 1))
    waves = tiles_n * tiles_m // slots
    n0 = waves * slots // tiles_m * rows // 128 * 128  # the launches meet at a 128-row block of the layout
    if not 0 < n0 < n:
        return 0, 0
    if split == "auto":
        tail_tiles = -(-(n - n0) // rows) * tiles_m
        return (n0, 2) if 2 * tail_tiles <= slots else (0, 0)
    return n0, int(split)


@dataclass(frozen=True)
class TileKeys:
    """A wgmma tile config's keys as ints, with their defaults: BM, NWG, STAGES, INFLIGHT, KT, TMA, SK, FOLD,
    CLUSTER, SERIAL, PDL (default: on unless SK), WS (the field order of ``astuple``)."""

    bm: int
    nwg: int
    stages: int
    inflight: int
    ktile: int
    tma: int
    sk: int
    fold: int
    cluster: int
    serial: int
    pdl: int
    ws: int

    @classmethod
    def of(cls, cfg: dict) -> TileKeys:
        sk = int(cfg.get("SK", 0))
        return cls(int(cfg["BM"]), int(cfg.get("NWG", 2)), int(cfg.get("STAGES", 4)), int(cfg.get("INFLIGHT", 1)),
                   int(cfg.get("KT", 1)), int(cfg.get("TMA", 1)), sk, int(cfg.get("FOLD", 0)),
                   int(cfg.get("CLUSTER", 0)), int(cfg.get("SERIAL", 0)), int(cfg.get("PDL", int(not sk))),
                   int(cfg.get("WS", 0)))

    @property
    def min_stages(self) -> int:
        """A stage is refilled ceil(INFLIGHT / KT) + 1 stages after it was read."""
        return 2 + -(-self.inflight // self.ktile)


def tile_error(cfg: dict) -> str | None:
    """Why the tile config cannot run (None when it can): the launch's own check, also used to keep tuning
    candidates legal. Shared-memory fit is checked at launch (it depends on the weight's layout)."""
    t = TileKeys.of(cfg)
    if (t.bm % 8 or not 8 <= t.bm <= 256 or t.nwg not in (1, 2, 3, 4) or t.inflight not in (1, 2)
            or t.ktile not in (1, 2, 4) or (t.ktile > 1 and t.inflight != 1) or t.stages < t.min_stages
            or t.tma not in (0, 1) or (t.tma and t.nwg == 3) or t.sk not in (0, 1, 2) or (t.sk and not t.tma)
            or t.fold not in (0, 1) or t.cluster not in (0, 1) or t.serial not in (0, 1) or (t.serial and t.cluster)
            or t.pdl not in (0, 1) or t.ws not in (0, 1) or (t.ws and (not t.tma or int(cfg.get("MINB", 1)) != 1))):
        return (f"bad wgmma tile BM={t.bm} NWG={t.nwg} STAGES={t.stages} INFLIGHT={t.inflight} KT={t.ktile} "
                f"TMA={t.tma} SK={t.sk} FOLD={t.fold} CLUSTER={t.cluster} SERIAL={t.serial}: BM in 8..256 (multiple "
                "of 8), NWG 1..4, INFLIGHT 1 or 2, KT 1, 2 or 4 (KT > 1 with INFLIGHT 1), STAGES >= 2 + ceil(INFLIGHT "
                "/ KT), TMA 0 or 1 (1 with NWG 1, 2 or 4), SK 0, 1 or 2 (1, 2 with TMA 1), FOLD 0 or 1, CLUSTER 0 or "
                "1, SERIAL 0 or 1 (not with CLUSTER 1), PDL 0 or 1, "
                "WS 0 or 1 (1 with TMA 1 and MINB 1: with the producer warp, two CTAs per SM lack registers)")
    return None


@dataclass(frozen=True)
class Grouped:
    """WG_GROUPED (gemm_wgmma.cu): a launch over E experts' layouts joined back to back (``layout``: the joined one,
    n and k one expert's), x's rows sorted by expert, a tile table of ``entries`` rows (the grid's y) per call, and
    ``bias_stride`` bytes between the experts' bias rows."""

    layout: WgmmaLayout
    experts: int
    entries: int
    bias_stride: int = 0


def _prepare_launch(qw: QuantizedWeight | None, m: int, x_dtype: torch.dtype, x_row_stride: int, x_cols: int,
                    conv: tuple | None, out: OutputRows, n: int, cfg: dict, fit: bool, props, row0: int,
                    chain: int = 0, grouped: Grouped | None = None) -> WgmmaPart:
    """One launch into the output columns of weight rows [row0, row0 + n) (row0: a multiple of 128), everything but the
    activation / output / bias pointers and the workspaces fixed; chain: WG_CHAIN, the role in a TAIL pair (1 the whole
    waves, 2 the tail; with PDL only); grouped: the experts' launch (qw None; no split-K, stream-K, TMA store or
    PDL)."""
    why = tile_error(cfg)
    if why:
        raise ValueError(why)
    keys = TileKeys.of(cfg)
    # (stages, tma, sk and ws_req may be lowered below to what this GPU and weight allow)
    bm, nwg, stages, inflight, ktile, tma, sk, fold_req, cluster, serial, pdl_req, ws_req = astuple(keys)
    rows = grouped is None and qw.resident == ROWS_LAYOUT
    if rows:
        if conv is not None:
            raise ValueError("a weight kept in rows_v1 has no wgmma convolution")
        tma = 1  # its rows come by TMA (the tables' configs were measured on wgmma_v1, where TMA 0 is a choice)
    if grouped is None:
        name, build = (ROWS_LAYOUT, build_rows_v1) if rows else (LAYOUT, build_wgmma_v1)
        fresh = not qw.has_layout(name)  # its build kernels write the weights read before griddepcontrol.wait: no PDL
        lay: WgmmaLayout | RowsLayout = qw.layout(name, build)
    else:
        if sk or cluster or serial or cfg.get("SPLIT", 1) not in (1, "1") or conv is not None:
            raise ValueError("the grouped experts' launch takes no stream-K, split-K or convolution")
        fresh, lay, pdl_req = False, grouped.layout, 0
    k = lay.k
    g2 = lay.group_size == 32
    sb = stage_bytes(bm, nwg, lay.bits, lay.params.element_size(), lay.mode, g2, ktile, tma)
    want_tstore = bool(tma and int(cfg.get("TSTORE", TSTORE)))
    # SK 2 stages its TMA stores past the ring (they stay in flight under the next tile): a buffer per warpgroup,
    # of the whole tile or of the largest piece that fits beside the ring
    ts_chunk, staging = bm // 8, 0
    if sk == 2 and want_tstore and out.tstore_fits(bm, nwg):
        ts_chunk = staging_chunk(bm, nwg, (fitted_stages(keys, sb) if fit else stages) * sb)
        staging = nwg * ts_chunk * 8 * 128
    if fit:
        stages = fitted_stages(keys, sb, staging)
    smem = stages * sb + staging + 1024  # + slack for the 1024-byte alignment of the stages
    split = 1 if sk else cfg.get("SPLIT", 1)
    if split == "auto":
        split = auto_split(m, n, k, cfg, props.multi_processor_count)
    kt = lay.k_tiles
    split, kt_per = k_slices(kt, min(int(split), CLUSTER_MAX) if cluster else int(split), ktile)
    csplit = cluster == 1 and split > 1  # the slices of a tile as one cluster (WG_SPLIT 2), else a workspace
    ssplit = split > 1 and serial == 1  # the slices of a tile meet in a workspace; the last one stores (WG_SPLIT 3)
    wsplit = split > 1 and not csplit and not ssplit
    band_blocks = 0
    if csplit:  # after the main loop the ring receives the peers' partials of this CTA's band: (split - 1) slots of
        # band_blocks rows of 8 x [128 NWG threads] float4
        band_blocks = cluster_band_blocks(bm, split)
        smem = max(smem, (split - 1) * band_blocks * 128 * nwg * 16 + 1024)
    if smem > SMEM_LIMIT:
        raise ValueError(f"wgmma tile BM={bm} NWG={nwg} STAGES={stages}{' CLUSTER=1' if csplit else ''} needs {smem} "
                         f"bytes of shared memory (limit {SMEM_LIMIT})")
    defs = {"WG_BITS": lay.bits, "WG_ACT": _ACT[x_dtype], "WG_SCL": _SCL[lay.params.dtype],
            "WG_MODE": _MODE[lay.mode], "WG_BM": bm, "WG_NWG": nwg, "WG_STAGES": stages, "WG_G2": int(g2),
            "WG_PC": int(lay.num_groups == 1),
            "WG_SPLIT": 2 if csplit else 3 if ssplit else int(wsplit), "WG_GROUP_M": int(cfg.get("GROUP_M", 8))}
    gt = lay.group_size // K_TILE  # 64-k tiles per group
    fold = (fold_req == 1 and lay.mode != "offset" and lay.num_groups > 1 and gt in (1, 2)
            and ktile % (2 * gt) == 0)
    if fold:
        defs["WG_FOLD"], defs["WG_GT"] = 1, gt
    # FOLD's two partial accumulators do not fit 2 CTAs' register budget (ptxas spills); WS takes MINB 1 (checked above
    # for an explicit MINB, so the default must not pick 2 either)
    minb = int(cfg.get("MINB", 2 if sk == 1 and bm <= 64 and not fold and not ws_req else 1))
    if minb != 1:
        defs["WG_MINB"] = minb
    if inflight != 1:
        defs["WG_INFLIGHT"] = inflight
    if ktile != 1:
        defs["WG_KT"] = ktile
    xmap = None
    if conv is not None:
        if not tma:
            raise ValueError("the wgmma convolution loads its activations by TMA: config TMA must be 1")
        xmap = conv[1](bm)  # 64 channels x BM output pixels of one filter tap
        defs["WG_CONV"] = 1
    elif tma:
        try:  # 64 k x BM rows; the address is written per call
            xmap = encode_tensor_map(_MAP_PLACEHOLDER, m, x_cols, x_row_stride, x_dtype, K_TILE, bm)
        except Exception as e:  # noqa: BLE001 - a driver without tensor-map support: the cp.async loader instead
            _warn_no_tma(e)
            tma = 0
    wmap = None
    if rows:
        # the part's rows [row0, N) x the padded K; one box per k-tile: 64 k x the CTA's rows, 64-byte swizzle
        wmap = encode_tensor_map(lay.weight.data_ptr() + row0 * lay.row_bytes, lay.n - row0, lay.k_padded,
                                 lay.row_bytes, torch.uint8, K_TILE, 64 * nwg, swizzle=64)
        defs["WG_ROWS"] = 1
    if not tma:  # per-thread cp.async loader instead of TMA / bulk copies (and no stream-K, no producer warp)
        if rows:
            raise ValueError("a weight kept in rows_v1 needs the TMA loader: tensor maps failed on this driver")
        defs["WG_TMA"] = 0
        sk = 0
        ws_req = 0
    if ws_req:
        defs["WG_WS"] = 1
    threads = 128 * nwg + 32 * ws_req
    if sk:
        defs["WG_SK"] = sk
    # programmatic dependent launch (as the GEMVs): off for every config under kernel_options(pdl=False)
    # (MIXGEMM_PDL=0), else config key PDL decides (default: on, but off for stream-K -- see the docstring)
    pdl = bool(pdl_req and tma and cuda_launch.pdl_on(out.device))
    if pdl:
        defs["WG_PDL"] = 1
        if chain == 1 or (chain == 2 and csplit and not sk):
            defs["WG_CHAIN"] = chain
    ymap = None
    if sk == 2:
        tstore = staging > 0
    else:  # (tma again: a driver without tensor maps turned it off above, and SK 2 with it)
        tstore = (want_tstore and tma and not sk and not wsplit and grouped is None
                  and out.tstore_fits(bm, nwg, stages * sb))
    if tstore:
        # rows per TMA store: all of the CTA's rows (CLUSTER: its band, when every band is as large), else 8 per store
        box = bm if not csplit else 8 * band_blocks if band_blocks * split == bm // 8 else 8
        if ts_chunk != bm // 8:  # SK 2 in pieces: one store per piece
            box = 8 * ts_chunk
            defs["WG_TS_CHUNK"] = ts_chunk
        try:  # 64 output columns x box rows; the address is written per call
            ymap = encode_tensor_map(_MAP_PLACEHOLDER, m, n, out.row_stride, out.dtype, K_TILE, box)
            defs["WG_TSTORE"] = 1
            if box != bm:
                defs["WG_TS_BOX"] = box
        except Exception as e:  # noqa: BLE001 - no tensor-map support: the per-element stores
            _warn_no_tma(e)
    if grouped is not None:
        defs["WG_GROUPED"] = 1
    fn = nvrtc.get_function(SOURCE, KERNEL, defs, out.device, arch_suffix="a")
    nvrtc.allow_dynamic_smem(fn, smem)
    tiles = output_tiles(m, n, bm, nwg) if grouped is None else output_tiles(1, n, 1, nwg)
    ws_floats, counters = (m * n if wsplit else 0), None
    if sk:
        work = tiles * math.ceil(kt / ktile)  # (tile, stage) pairs
        if work >= 2**31:
            raise ValueError(f"persistent-grid work of {work} stages exceeds int32; use SK 0 for M={m}, N={n}, K={k}")
        # SK 2: at most one CTA per tile (each runs whole tiles)
        ctas = min(work if sk == 1 else tiles, nvrtc.resident_blocks(fn, threads, smem) * props.multi_processor_count)
        grid = (ctas, 1, 1)
        if sk == 1:
            ws_floats, counters = ctas * 2 * (bm // 2) * 128 * nwg, "zeroed"
    else:
        grid = (tiles, 1 if grouped is None else grouped.entries, split)
        if ssplit:
            ws_floats, counters = tiles * split * (bm // 2) * 128 * nwg, "kept"
    xparam = TensorMapParam(xmap) if tma else None  # the conv's map has its address; the GEMM's is written per call
    yparam = TensorMapParam(ymap) if ymap is not None else None
    w_row0 = row0 * lay.row_bytes if rows else row0 // 128 * lay.weight.stride(0) * lay.weight.element_size()
    args = [
        # row0 / 128 blocks of 128 weight rows in: wgmma_v1's tensors are [N_pad / 128, ...] (rows_v1: its params)
        ctypes.c_void_p(lay.weight.data_ptr() + w_row0),
        ctypes.c_void_p(lay.params.data_ptr() + row0 // 128 * lay.params.stride(0) * lay.params.element_size()),
        ctypes.c_void_p(0),  # x (per call)
        ctypes.c_int(0 if conv is not None else x_row_stride),
        ctypes.c_void_p(0),  # y (per call)
        ctypes.c_int(out.row_stride),
        *nvrtc.bias_clamp_args(None, -math.inf, math.inf),  # per call (none with the workspace split)
        ctypes.c_void_p(0),  # workspace (per call)
        ctypes.c_void_p(0),  # tile counters (per call)
        ctypes.c_int(n), ctypes.c_int(m), ctypes.c_int(k if conv is not None else x_cols), ctypes.c_int(kt),
        ctypes.c_int(lay.num_groups), ctypes.c_int(lay.gk), ctypes.c_int(kt_per),
        # the 128-byte tensor maps by value (zeros when unused)
        xparam.value if xparam is not None else (ctypes.c_ubyte * 128)(),
        (conv[0] if conv is not None else _NO_CONV).as_ctypes(),
        yparam.value if yparam is not None else (ctypes.c_ubyte * 128)(),
    ]
    if rows:
        args.append(TensorMapParam(wmap).value)
    if grouped is not None:  # the tile table (per call) and the bytes from one expert to the next
        e = grouped.experts
        args += [ctypes.c_void_p(0), ctypes.c_longlong(lay.weight.numel() * lay.weight.element_size() // e),
                 ctypes.c_longlong(lay.params.numel() * lay.params.element_size() // e),
                 ctypes.c_longlong(grouped.bias_stride)]
    launch = nvrtc.prepare_launch(fn, out.device, grid, (threads, 1, 1), args, smem, pdl=pdl, first_without_pdl=fresh,
                                  cluster=(1, 1, split) if csplit else None)
    finish = _prepare_finish(m, n, out) if wsplit else None
    return WgmmaPart(launch, lay, m, n, row0, ws_floats, counters, tiles, xparam if conv is None else None, yparam,
                     finish)


_OUT_CODES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}


def _prepare_finish(m: int, n: int, out: OutputRows):
    """The workspace split-K's second kernel (splitk_finish.cu): y = clamp(ws + bias, lo, hi) as y's dtype."""
    fn = nvrtc.get_function("splitk_finish.cu", "mixgemm_splitk_finish", {"SF_OUT": _OUT_CODES[out.dtype]},
                            out.device)
    args = [ctypes.c_void_p(0), *nvrtc.bias_clamp_args(None, -math.inf, math.inf), ctypes.c_void_p(0),
            ctypes.c_int(out.row_stride), ctypes.c_int(m), ctypes.c_int(n)]
    return nvrtc.prepare_launch(fn, out.device, (-(-m * -(-n // 4) // 256), 1, 1), (256, 1, 1), args)


_MAP_PLACEHOLDER = 1 << 12  # a 16-byte aligned address to encode a map with; each call writes the real one


class TensorMapParam:
    """A 128-byte CUtensorMap kept as a kernel parameter value (64-byte aligned, as the driver's type is), whose
    global address a call replaces (cuTensorMapReplaceAddress: the shape, strides and box stay)."""

    def __init__(self, tm):
        buf = (ctypes.c_ubyte * 192)()
        addr = -(-ctypes.addressof(buf) // 64) * 64
        # from_buffer (not from_address): the value keeps its memory alive for as long as a parameter list holds it
        self.value = (ctypes.c_ubyte * 128).from_buffer(buf, addr - ctypes.addressof(buf))
        self.addr = addr
        self.ptr = None  # the global address point_to last wrote (None: the one it was encoded with)
        if tm is not None:
            ctypes.memmove(addr, tm.getPtr(), 128)

    def point_to(self, ptr: int) -> None:
        # a driver call, skipped when the address is the one already written (the map is a by-value parameter, copied
        # at each launch; a decode loop's buffers mostly come back at the same addresses)
        if ptr != self.ptr:
            cuda_launch.replace_tensor_map_address(self.addr, ptr)
            self.ptr = ptr


class WgmmaPart:
    """One prepared launch of the GEMM over weight rows [row0, row0 + n): a call writes the activation, output and
    bias pointers (and the tensor maps' addresses), allocates the workspace its split needs, launches, and for the
    workspace split-K zeroes the workspace first and adds the fp32 partials into the output after (``finish``). Holds
    the layout, so the weight pointers stay valid."""

    def __init__(self, launch, layout, m, n, row0, ws_floats, counters, tiles, xmap, ymap, finish):
        self.launch, self.layout, self.m, self.n, self.row0 = launch, layout, m, n, row0
        self.ws_floats, self.counters, self.tiles = ws_floats, counters, tiles
        self.xmap, self.ymap, self.finish = xmap, ymap, finish
        self._vals, self._lock = launch.params.values, launch.params.lock

    def __call__(self, xk: torch.Tensor, y: torch.Tensor, bias, lo: float, hi: float,
                 table: torch.Tensor | None = None) -> None:
        """table: the grouped launch's tile table (int32 [entries, 4] on y's device)."""
        dev = y.device
        stream = self.launch.current_stream()
        v = self._vals
        y_ptr = y.data_ptr() + self.row0 * y.element_size()  # this launch's output columns
        if bias is None:
            bias_ptr = bias_code = 0
        else:  # this launch's rows of the bias
            bias_ptr, bias_code = bias.data_ptr() + self.row0 * bias.element_size(), nvrtc.bias_code(bias.dtype)
        ws = torch.empty(self.ws_floats, dtype=torch.float32, device=dev) if self.ws_floats else None
        counters = None  # (held until the launch is queued)
        if self.counters == "zeroed":
            counters = torch.zeros(self.tiles, dtype=torch.int32, device=dev)
        elif self.counters == "kept":
            counters = tile_counters(dev, self.tiles)
        # (launch.Params: the parameters, tensor maps and the finishing launch's parameters are written and launched by
        # one thread at a time)
        with self._lock:
            v[2].value = xk.data_ptr()
            v[4].value = y_ptr
            if self.xmap is not None:
                self.xmap.point_to(xk.data_ptr())
            if self.ymap is not None:
                self.ymap.point_to(y_ptr)
            if self.finish is not None:  # the slices add into a zeroed workspace; the bias and clamp come after
                cuda_launch.memset_zero_async(ws.data_ptr(), self.ws_floats * 4, stream)
                nvrtc.write_epilogue(v, 6, 0, 0, -math.inf, math.inf)
            else:
                nvrtc.write_epilogue(v, 6, bias_ptr, bias_code, lo, hi)
            v[10].value = 0 if ws is None else ws.data_ptr()
            v[11].value = 0 if counters is None else counters.data_ptr()
            if table is not None:
                v[_TABLE].value = table.data_ptr()
            self.launch(stream)
            if self.finish is not None:
                f = self.finish.params.values
                f[0].value = ws.data_ptr()
                nvrtc.write_epilogue(f, 1, bias_ptr, bias_code, lo, hi)
                f[5].value = y_ptr
                self.finish(stream)


_NO_CONV = ConvGeometry(1, 1, 1, 1, 1, 1, 0, 0, 1, 1)
_TABLE = 22  # the grouped launch's tile-table parameter (after the output map)


def cluster_band_blocks(bm: int, split: int) -> int:
    """WG_SPLIT 2: 8-row blocks of the band each CTA of a split-`split` cluster stores, whole 16-row pairs (the
    stmatrix .x4 pairs of the TMA-store epilogue start at an even block); the last bands may be shorter or empty."""
    pairs = -(-bm // 16)
    return 2 * -(-pairs // split)


def tstore_fits(y: torch.Tensor, bm: int, nwg: int, ring_bytes: int | None = None) -> bool:
    """WG_TSTORE applies: a 16-bit output whose rows the TMA can address (16-byte aligned base and row stride, unit
    column stride), BM >= 16, and (ring_bytes given: the tiles are staged in the ring) a stage ring that holds the
    NWG staging tiles of BM rows x 128 bytes."""
    # BM 8 (one 8-row block) keeps the per-element stores: the staging round trip measured 0.3 us slower there (H100,
    # W4 g128 8192 x 28672, M = 1: 47.1 -> 47.4 us)
    return (y.dtype in (torch.float16, torch.bfloat16) and y.stride(1) == 1 and (y.stride(0) * 2) % 16 == 0
            and y.data_ptr() % 16 == 0 and bm >= 16 and (ring_bytes is None or ring_bytes >= nwg * bm * 128))
