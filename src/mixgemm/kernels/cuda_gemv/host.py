"""The CUDA-core weight-only GEMV's host code (gemv.cu, compiled by NVRTC), M = 1..16, float16 / bfloat16 / float32
activations: its tile rule (``simt_config``: the GPU table's measured M = 1 tiles, else the step-cost model of
gemv_steps.py, else the rule), its compile-time defines and its launch (``prepare_simt`` / ``gemv_simt``). It reads
the weight's ``gemv_v2`` layout (layout.py: the weight's own packed buffer), or rows_v1 for a weight kept there.
The call contract is mixgemm.kernels.cuda.gemv_launch's.
"""

from __future__ import annotations

import ctypes

import torch

from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.gemv_launch import (
    _ACT,
    _MODE,
    _SCL,
    WARPS,
    GemvLaunch,
    _common_args,
    _prepare_and_run,
    chunks_per_row,
    m_bucket,
)
from mixgemm.kernels.cuda.launch import pdl_on
from mixgemm.kernels.cuda.rows_layout import ROWS_LAYOUT, RowsLayout, build_rows_v1
from mixgemm.kernels.cuda_gemv.config import GemvConfig
from mixgemm.kernels.cuda_gemv.gemv_steps import cheapest_tile
from mixgemm.kernels.cuda_gemv.layout import GemvLayout, build_gemv_v2
from mixgemm.tuning.buckets import ShapeBucket, SourcedConfig
from mixgemm.tuning.gemv_m1 import m1_entry
from mixgemm.tuning.gemv_steps import step_costs

# Programmatic dependent launch on sm_90+ (gemv_common.cuh explains the kernel side). Not used for the first
# launch after a weight's layout was built in this call: its build kernels write the weights the GEMV
# reads before its griddepcontrol.wait. Off under kernel_options(pdl=False) (and MIXGEMM_PDL=0).
LAYOUT = "gemv_v2"
SOURCE = "cuda_gemv/gemv.cu"
KERNEL = "mixgemm_gemv"


# GEMV_XS / GEMV_LITE (gemv.cu) for fp16 activations: off by default. Measured on H200 (docs/kernels/cuda_gemv.md):
# XS only helped R = 2 configs and never beat the R = 4 defaults; LITE within noise.
DEFAULT_XS = 0
DEFAULT_LITE = 0


# Config keys that only appear when set (defines_for adds their macros only then, so default compile keys stay put).
OPTIONAL_KEYS = ("MINB", "XS", "LITE", "BULK", "BPAR", "BPS", "ZSUM", "LW")
OPTIONAL_DEFAULTS = {"LW": 32}  # the value an optional key has when absent (0 for the others)


def _with_optional_keys(cfg: dict, src: dict) -> dict:
    """cfg plus the OPTIONAL_KEYS that src (a tuning override or a tuned tile's fields) sets to a value other than its
    default (OPTIONAL_DEFAULTS, else 0)."""
    return {**cfg, **{key: src[key] for key in OPTIONAL_KEYS
                      if src.get(key, OPTIONAL_DEFAULTS.get(key, 0)) != OPTIONAL_DEFAULTS.get(key, 0)}}


def simt_override(forced: dict) -> dict:
    """A forced CUDA-core tile (kernel_options(configs={"cuda_gemv": {...}})): R, U and KS given, RG (default 8 warps
    / KS) and PF (default 0) completed, and the OPTIONAL_KEYS it sets."""
    r, u, ks = forced["R"], forced["U"], forced["KS"]
    cfg = {"R": r, "U": u, "RG": forced.get("RG", WARPS // ks), "KS": ks, "PF": forced.get("PF", 0)}
    return _with_optional_keys(cfg, forced)


def m1_tile_serves(tile, n: int, num_sms: int) -> bool:
    """Whether a measured M = 1 tile (tuning.gemv_m1.M1Tile) serves a layer of N rows: its blocks per SM, rounded up,
    at most the entry's MAXB (0: any). Why: past the blocks an SM holds at once a tile runs a second round of blocks,
    and a tile kept for one round lost there (H100, W4 sym, 4096x11008 / 4096x12288's R 2 U 1 KS 1 tile at 6 blocks
    per SM 0.875x the rule's time, on 4096x13696 at 7 blocks per SM 1.085x)."""
    return not tile.MAXB or blocks_per_sm(n, {"R": tile.R, "RG": tile.RG or WARPS // tile.KS, "LW": tile.LW},
                                          num_sms) <= tile.MAXB


def choose_config(m: int, n: int, kc: int, num_sms: int, act: int = 0, bits: int = 4, k: int = 0,
                  gpu_name: str = "", mode: str = "") -> dict:
    """Tile choice from the problem size only (deterministic, no autotuning): the measured tile of the layer's
    bucket at M = 1 with fp16 activations (mixgemm.tuning.gemv_m1; k = 0: none), else at M = 1 with fp16 activations
    the tile of least modelled cost (gemv_steps.cheapest_tile, costs from mixgemm.tuning.gemv_steps), else the rule
    below.

    R rows per warp (one activation load serves R weight rows), U chunks in flight per lane and row,
    KS k-slices per row (split-K inside the block, when N / R alone cannot fill the GPU); a block is
    8 warps = (8 / KS) row groups x KS k-slices. m is the compiled M bucket, act the activation code.
    PF (register double buffering) measured slower on H200 (register pressure): off by default.
    """
    # fp16 activations: x staged in shared memory (XS, dropped by gemv() where it does not apply) and
    # the lighter per-chunk bookkeeping (LITE), when DEFAULT_XS / DEFAULT_LITE turn them on (gemv.cu)
    extra = {"XS": DEFAULT_XS, "LITE": DEFAULT_LITE} if act == 0 else {}
    mode = mode or "sym"  # (no mode given: a sym weight, for the bucket lookup and the model alike)
    hit = m1_entry(gpu_name, mode, bits, k, n) if m == 1 and act == 0 and k > 0 else None
    # the measured tile of the layer's bucket (mixgemm.tuning.gemv_m1), where each of its k-slices gets at least one
    # full step of U chunks per lane (LW lanes a row) or as many chunks as on the layer it was measured on (a shorter K
    # in the bucket takes the rule), and its blocks per SM stay within the entry's MAXB (m1_tile_serves)
    if (hit is not None and kc >= min(hit.value.LW * hit.value.U * hit.value.KS, chunks_per_row(bits, hit.measured[0]))
            and m1_tile_serves(hit.value, n, num_sms)):
        t = hit.value
        cfg = {"R": t.R, "U": t.U, "RG": t.RG or WARPS // t.KS, "KS": t.KS, "PF": t.PF, **extra}
        where = f"gemv_m1 {'H100' if 'H100' in gpu_name else 'H200'} W{bits}, {hit.where(ShapeBucket.of(k, n))}"
        return SourcedConfig(_with_optional_keys(cfg, t._asdict()), where)
    if m == 1 and act == 0:
        # no measured bucket: the tile of least modelled cost (kernels/cuda_gemv/gemv_steps.py: rounds of resident
        # blocks
        # x steps a lane waits for, with the step costs fitted per family in tuning.gemv_steps)
        costs = step_costs(gpu_name, bits, mode)
        tile = cheapest_tile(n, kc, bits, mode, num_sms, costs)
        if tile is not None:
            return SourcedConfig({**tile.config(), **extra}, f"gemv step-cost model ({costs.source})")
    if m == 1:
        r = (4 if n >= 8192 else 2) if act == 0 else 2
        u = 2
    else:
        r, u = 2, 1
    rows = -(-n // r)
    ks = 1
    # ~62 warps per SM over the grid (about two waves), each lane keeping >= one full U step
    while ks < WARPS and rows * ks < num_sms * 62 and kc >= 32 * u * ks * 2:
        ks *= 2
    return {"R": r, "U": u, "RG": WARPS // ks, "KS": ks, "PF": 0, **extra}


def perm_config(cfg: dict, mb: int, act: int, kp: int) -> dict:
    """cfg for an act-order call: PERM on, and x staged in shared memory (XS) where it can be: the block then gathers
    x through the permutation once, from shared memory, instead of every lane its pieces from global memory."""
    cfg = {**cfg, "PERM": 1}
    return {**cfg, "XS": 1} if _xs_ok(cfg, mb, act, kp) else cfg


def stages_perm(cfg: dict, m: int, x_dtype: torch.dtype, bits: int, k: int) -> bool:
    """True when an act-order call of the CUDA-core GEMV with this config gathers x into shared memory (perm_config
    sets XS), False when its lanes would gather from global memory."""
    kp = chunks_per_row(bits, k) * (32 if bits == 4 else 16)
    return bool(perm_config(cfg, m_bucket(m), _ACT[x_dtype], kp).get("XS", 0))


def defines_for(bits: int, act: int, scl: int, mode: int, m: int, cfg: dict) -> dict:
    """NVRTC -D macros of one gemv.cu instantiation (config.GemvConfig.build_defines)."""
    return GemvConfig.from_dict(cfg).build_defines(bits, act, scl, mode, m)


LANE_WIDTHS = (32, 16, 8, 4)  # gemv.cu GEMV_LW: lanes per weight row


def tile_rows(cfg: dict) -> int:
    """Weight rows of one block of the CUDA-core GEMV: RG row groups x R rows per lane group x the warp's 32 / LW lane
    groups (gemv.cu GEMV_LW)."""
    lw = cfg.get("LW", 32)
    if lw not in LANE_WIDTHS or (lw != 32 and cfg.get("BULK", 0)):
        raise ValueError(f"CUDA-core GEMV config {cfg}: LW (lanes per row) must be one of {LANE_WIDTHS}, and 32 with "
                         "BULK")
    return cfg["RG"] * cfg["R"] * (32 // lw)


def blocks_per_sm(n: int, cfg: dict, num_sms: int) -> int:
    """Blocks per SM (rounded up) of the CUDA-core GEMV with tile ``cfg`` (one block per tile_rows rows) over N rows."""
    blocks = -(-n // tile_rows(cfg))
    return -(-blocks // num_sms)


def bulk_smem_bytes(cfg: dict, param_row_bytes: int = 0) -> int:
    """Dynamic shared memory of a GEMV_BULK ring: BULK stages x (RG x R rows) x (KS x 32 x U chunks of 16 bytes), plus
    with BPAR two tiles' parameters (RG x R rows of param_row_bytes each)."""
    rows = cfg["RG"] * cfg["R"]
    ring = cfg["BULK"] * rows * cfg["KS"] * 32 * cfg["U"] * 16
    return ring + (2 * rows * param_row_bytes if cfg.get("BPAR", 0) else 0)


def _bulk_config(cfg: dict, props, param_row_bytes: int, x_smem: int) -> dict:
    """cfg with BULK dropped where it cannot run (before sm_90, or a ring too big for one block) and BPAR (the
    parameters by bulk copy) set where each row's parameters are a whole number of 16-byte units, unless the
    config says BPAR 0."""
    if not cfg.get("BULK", 0):
        return cfg
    cfg = {**cfg, "BPAR": int(cfg.get("BPAR", 1) and param_row_bytes % 16 == 0)}
    if props.major < 9 or bulk_smem_bytes(cfg, param_row_bytes) + x_smem > BULK_MAX_BYTES:
        return {**cfg, "BULK": 0, "BPAR": 0}
    return cfg


# The bulk-copy ring must fit one block's dynamic shared memory on sm_90 (227 KiB) with room for the static part.
BULK_MAX_BYTES = 224 * 1024


# x staged in shared memory (GEMV_XS) only up to this many bytes per block (K <= 32768 at fp16), so
# that three 256-thread blocks still fit on an SM next to L1.
XS_MAX_BYTES = 64 * 1024


def _x_bytes(cfg: dict, kp: int) -> int:
    """x in fp16 (K * 2 bytes), twice with PERM (as it is, then gathered)."""
    return kp * 2 * (2 if cfg.get("PERM", 0) else 1)


def x_smem_bytes(cfg: dict, kp: int) -> int:
    """Dynamic shared memory of GEMV_XS: x (_x_bytes), and with PERM the int32 indices (K * 4 bytes)."""
    return _x_bytes(cfg, kp) + (kp * 4 if cfg.get("PERM", 0) else 0)


def _xs_ok(cfg: dict, mb: int, act: int, kp: int) -> bool:
    """GEMV_XS applies to fp16 activations at the M = 1 bucket, without PF, when x (_x_bytes) fits
    XS_MAX_BYTES; PERM's indices come on top of that (up to 2 * XS_MAX_BYTES in all)."""
    return mb == 1 and act == 0 and not cfg.get("PF", 0) and _x_bytes(cfg, kp) <= XS_MAX_BYTES


def simt_config(m: int, n: int, k: int, bits: int, x_dtype: torch.dtype, mode: str, num_sms: int,
                gpu_name: str) -> dict:
    """The CUDA-core GEMV's config for this problem (choose_config on the compiled M bucket)."""
    return choose_config(m_bucket(m), n, chunks_per_row(bits, k), num_sms, _ACT[x_dtype], bits, k, gpu_name, mode)


@torch.compiler.disable
def gemv_simt(x2d: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None, lo: float, hi: float,
              cfg: dict, perm: torch.Tensor | None = None) -> torch.Tensor:
    """The CUDA-core GEMV with the tile config ``cfg`` (simt_config's keys); XS and BULK are dropped where they
    cannot run. perm: an act-order layer's kernel permutation (module docstring), applied while x is read."""
    return _prepare_and_run(prepare_simt, x2d, qw, bias, lo, hi, cfg, perm)


def prepare_simt(qw: QuantizedWeight, m: int, x_dtype: torch.dtype, dev: torch.device, cfg: dict,
                 act_order: bool = False) -> GemvLaunch:
    """The CUDA-core GEMV's launch for M rows of x_dtype with the tile config ``cfg``, built once (layout, compiled
    kernel, grid, parameters); call it with x2d, bias, lo, hi (and an act_order layer's kernel permutation)."""
    n = qw.out_features
    props = torch.cuda.get_device_properties(dev)
    rows = qw.resident == ROWS_LAYOUT  # an int8 weight kept in rows_v1 (GEMV_ROWS)
    name, build = (ROWS_LAYOUT, build_rows_v1) if rows else (LAYOUT, build_gemv_v2)
    fresh = not qw.has_layout(name)
    lay: GemvLayout | RowsLayout = qw.layout(name, build)
    if act_order:
        cfg = perm_config(cfg, m_bucket(m), _ACT[x_dtype], lay.k_padded)
    if cfg.get("XS", 0) and not _xs_ok(cfg, m_bucket(m), _ACT[x_dtype], lay.k_padded):
        cfg = {**cfg, "XS": 0}
    x_smem = x_smem_bytes(cfg, lay.k_padded) if cfg.get("XS", 0) else 0
    if rows:  # one row's parameters: contiguous only per channel (rows_v1 keeps wgmma_v1's order, groups 128 apart)
        param_row_bytes = lay.num_groups * lay.params.shape[-1] * lay.params.element_size()
    else:
        param_row_bytes = lay.params.stride(0) * lay.params.element_size()  # [N, G] or [N, G, 2], contiguous
    cfg = _bulk_config(cfg, props, param_row_bytes, x_smem)
    if rows:
        cfg = {**cfg, "ROWS": 1, "BPAR": cfg.get("BPAR", 0) if lay.num_groups == 1 else 0}
    defs = defines_for(qw.bits, _ACT[x_dtype], _SCL[qw.scales.dtype], _MODE[qw.mode], m_bucket(m), cfg)
    fn = nvrtc.get_function(SOURCE, KERNEL, defs, dev)
    rows_per_block = tile_rows(cfg)
    block = (32 * cfg["RG"] * cfg["KS"] + (32 if cfg.get("BULK", 0) else 0), 1, 1)  # + the bulk producer warp
    tiles = -(-n // rows_per_block)
    # dynamic shared memory: the bulk ring, then x when it is staged there (x_smem_bytes: fp16, M = 1)
    smem = (bulk_smem_bytes(cfg, param_row_bytes) if cfg.get("BULK", 0) else 0) + x_smem
    if smem:
        nvrtc.allow_dynamic_smem(fn, smem)
    if cfg.get("BULK", 0):  # persistent grid of as many blocks as fit, each looping over tiles through its ring
        # BPS caps the blocks per SM, leaving room for the next PDL kernel's blocks to start their rings
        per_sm = nvrtc.resident_blocks(fn, block[0], smem)
        tiles = min(tiles, min(per_sm, cfg.get("BPS", 0) or per_sm) * props.multi_processor_count)
    args = _common_args(lay, n) + [
        ctypes.c_int(lay.chunks_per_row),
        ctypes.c_int(lay.num_groups),
        ctypes.c_int(lay.gshift),
        ctypes.c_int(m),
        ctypes.c_void_p(0),  # the kernel permutation (per call; act-order only)
    ]
    pdl = pdl_on(dev)
    return GemvLaunch(nvrtc.prepare_launch(fn, dev, (tiles, 1, 1), block, args, smem, pdl=pdl, first_without_pdl=fresh),
                      lay, m, n, x_dtype, dev)
