"""Fused activation-quantizing GEMV on the int8 wgmma GEMM's layout (W4A8 / W8A8 sym x sym), M = 1..16: CUDA kernel
gemv_a8_wg.cu via NVRTC.

The decode kernel of a weight that keeps ``wgmma_a8_v1`` as its one resident layout (``mixgemm.compact_``): the same
one-launch design as gemv_a8 (every block quantizes x into shared memory, exactly
mixgemm.formats.activation.quantize_activation, then streams the weights with dp4a, or mma.sync where all of a tile's
math follows the PDL wait), reading the GEMM's bytes.

``prepare_gemv_a8_wg(qw, m, x_dtype, dev, out_dtype, per_token, config, act_mode)(x2d, bias, lo, hi)`` =
clamp(Qa(x2d) @ W.T + bias, lo, hi) [M, N]; qw: sym int4 / int8, group 128 / 256 or per channel (what
``wgmma_a8_v1`` holds); activations "sym" or "sym_full" (act_quant_rows.mode_defines), per token and weight group,
or per token (per_token).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from mixgemm.formats.layouts_wgmma_a8 import K_TILE, WgmmaA8Layout, build_wgmma_a8_v1
from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.act_quant_rows import mode_defines
from mixgemm.kernels.cuda.launch import pdl_on
from mixgemm.kernels.cuda_gemv_a8.gemv_a8 import GemvA8Launch, m_bucket, persistent_grid, row_chunks
from mixgemm.kernels.cuda_gemv_a8_wg.gemv_a8_wg_config import GemvA8WgConfig

SOURCE = "cuda_gemv_a8_wg/gemv_a8_wg.cu"
KERNEL = "mixgemm_gemv_a8_wg"
LAYOUT = "wgmma_a8_v1"
MAX_M = 16
ROW_TILE = 16
_XT = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
_OUT = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
# warps per SM the k-split aims for (as gemv_a8's choose_config): a decode GEMV is latency-bound, it needs many loads
# in flight
TARGET_WARPS_PER_SM = 32
SMALL_LAYER_WEIGHTS = 8 << 20  # N x K up to which M <= 2 takes two k-tiles a step (choose_config)
MAX_WARPS = 16  # per block (the k-slice reduction red[KS][M][16 RG RT] stays within 32 KiB at M = 16, RT = 2)
STATIC_SMEM = 48 << 10  # static shared memory of a kernel: the reduction and two small arrays (reduction_bytes)
# NARROW_CAP_U2 (choose_config): with the k-split at its cap and the grid at most half the target's warps, two k-tiles
# in flight per warp make up for the missing warps at M = 1 with per-token activation scales. Source:
# tools/bench/gemv_a8_wg.py --grid (W4A8 g128 with per-token activations and integer group scales, M = 1, whole calls,
# us: rule U 1 -> U 2 at KS 16, the plain weight's fused GEMV): H100 4096x4096 6.38 -> 5.60 (5.51), 14336x4096 16.26
# -> 15.25 (15.38); H200 4096x4096 5.73 -> 4.75 (4.80), 14336x4096 14.45 -> 12.22 (12.64). With more warps U 2 lost:
# 5120x5120 (2560 warps, 0.6 of the target) 8.34 -> 9.59, 4096x14336 14.11 -> 15.68, 3584x4608 (2304) 5.82 -> 6.98
# (H100); 3584x3584 (1792 warps, 14 steps of two k-tiles over 16 slices) 5.33 -> 4.81 (4.60). At M = 2 and with
# per-block activation scales it lost too (mixgemm bench, H100, 4096x4096 / 14336x4096: M = 2 per token 6.4 -> 7.3 /
# 17.4 -> 17.8 us; per block at M = 1 6.3 -> 6.9).
# SHORT_SLICE_U2 (choose_config): a k-split that leaves slices of one k-tile keeps too little in flight per warp. Same
# grid, H100, us, rule -> U 2 / halved KS / PF (plain): 2048x8192 6.07 -> 4.56 (4.48), 2048x11008 7.60 -> 6.52 (6.32),
# 3072x8192 7.21 -> 6.88 (7.27), 3584x4608 5.82 -> 5.69 (4.80), 1536x8960 5.03 -> 4.94 (4.79); without halving KS
# (2048x8192 (RT 2, U 2, KS 16) 6.03) or with PF on one step (2048x8192 5.45) it did not pay.
# BLOCK_U2 (choose_config): int4 with per-block activation scales at M = 1, and at M = 2 except on narrow layers,
# takes two k-tiles a step without register double buffering (with it, U 2 lost: 4096x4096 6.3 -> 6.9 above), and a
# k-split that the doubling carried past the target by more than sqrt(2) is halved back (the split nearest the target:
# 4096x14336's 448 row warps x 16 are 54 per SM, x 8 are 27). Source: tools/bench/gemv_a8_wg.py --grid (W4A8 g128,
# per-block activations, whole calls, H100, 14 layers from 2048x2048 to 28672x8192, M = 1 and 2): time over each
# case's fastest grid tile, geometric mean, 1.127 -> 1.050 (M = 1) and 1.108 -> 1.053 (M = 2); us, rule -> BLOCK_U2
# (the plain weight's fused GEMV): M = 1 4096x14336 17.17 -> 15.05 (14.63), 3584x4608 7.79 -> 6.27 (5.06), 2048x11008
# 8.74 -> 7.19 (7.43), 3072x8192 8.82 -> 7.74 (9.18), 2048x2048 4.00 -> 3.62 (3.73); M = 2 4096x14336 17.64 -> 15.31
# (16.82), 2048x11008 9.10 -> 7.61 (8.00); at most 1.02x slower (5120x5120 M = 2 10.78 -> 11.02). The narrow layers at
# M = 2 (N 3584-4096) lost 3-4% with it (4096x4096 6.51 -> 6.78, 14336x4096 17.65 -> 18.16). Per-token scales kept
# their rules: there U 2 without them lost on 4096x14336 (14.11 -> 16.35) and 5120x5120 (8.34 -> 9.97).
# ONE_STEP_RT4 (choose_config): int4 with per-block activation scales on a narrow layer whose K makes 13-16 steps of
# two k-tiles at M = 1, exactly 16 at M = 2: KS 16, so each warp's slice is one step, and four row tiles a warp, so
# that step is all of its eight 64-byte loads in flight at once, no double buffering. Source:
# tools/bench/gemv_a8_wg.py --grid (W4A8 g128, per-block activations, whole calls, H100, us, the rule -> RT 4 U 2 KS
# 16 PF 0 (the plain weight's fused GEMV)):
# 4096x4096 6.36 -> 5.40 (6.16), 3584x3584 5.51 -> 5.03 (5.23); where some slices take two steps it lost (4608x4096,
# 18 steps, 7.25 -> 8.55). Checked in mixgemm bench (H100, one run, the rule before -> after): 3328x3328 5.2 -> 5.0,
# 3584x4096 6.0 -> 5.2, 3840x3840 6.0 -> 5.2, 4096x3584 5.8 -> 5.3, 4096x4096 6.4 -> 5.4; at M = 2 it won only where
# every slice holds a step (16 steps: 4096x4096 6.6 -> 6.4, 4096x3584 6.3 -> 6.1; grid 6.47 -> 6.38) and lost where
# some slices hold none (3584x4096 6.0 -> 6.9, 3584x3584 5.9 -> 6.2, 3840x3840 6.2 -> 6.4).
# ONE_STEP_MMA (choose_config): the ONE_STEP_RT4 tile does its math on the int8 tensor cores (A8_MMA: one
# mma.m16n8k32 per 32 k, 16 rows and 8 tokens, where dp4a takes 4 x M instructions a lane). That tile issues all its
# loads before the PDL wait, so all of its math follows the wait, on the call's critical path, and its four row tiles
# are four independent mma chains. Elsewhere the math overlaps loads, and the mma's latency on fewer chains lost.
# Source: tools/bench/gemv_a8_wg.py --no-sweep --mma 0,1 (H200, whole calls, us, dp4a -> mma at the rule's tile): W4A8
# g128 per-block 4096x4096 M = 1 5.11 -> 5.03, M = 2 5.89 -> 5.68 (5.70 in a second run), 3584x3584 M = 1 4.93 ->
# 4.85; at the other rules' tiles of 10 layers (2048x2048 .. 8192x28672, M 1 / 2 / 4) the mma took 1.00-1.09x (int4)
# and up to 1.43x (int8 per channel, RT 1) the time at M = 1 and 2, 0.82-1.07x at M = 4 (int8), so no rule of it.
# INT8_FULL_SPLIT (choose_config): int8 with per-token activation scales (W8A8 per channel) at M <= 2 past the small
# layers splits K 16 ways whenever K has 16 k-tiles, past the warp target: the target stopped the wide layers at KS 4 /
# 8, and the longer slices kept too few loads in flight. Source: tools/bench/gemv_a8_wg.py --grid (H100, whole calls,
# 9 layers of 42-235M weights, M = 1 and 2, us, the rule -> KS 16): M = 2 8192x28672 92.0 -> 88.9, 3584x18944 30.6 ->
# 29.7, 8192x22016 72.1 -> 70.5, 5120x13824 32.3 -> 31.8, 4096x14336 26.5 -> 26.2; M = 1 5120x13824 30.5 -> 29.8,
# 3584x18944 28.9 -> 27.8; the four layers where the rule already split 16 ways unchanged.


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class WgGemvShape:
    """The x-code geometry of one layout and tile: Kp = the layout's K padded to whole steps of U k-tiles, and the
    activation blocks held per token (Gp)."""

    kp: int
    gp: int

    @classmethod
    def of(cls, k_padded: int, group: int, u: int) -> WgGemvShape:
        """k_padded: the layout's K (a multiple of K_TILE); group: the weight group, 0 per channel."""
        kp = _cdiv(k_padded, K_TILE * u) * K_TILE * u
        return cls(kp, kp // group if group else 1)

    @classmethod
    def of_layout(cls, lay: WgmmaA8Layout, u: int) -> WgGemvShape:
        return cls.of(lay.k_padded, 0 if lay.per_channel else lay.group_size, u)

    def smem_bytes(self, mb: int) -> int:
        """Dynamic shared memory of a block (a8_prologue.cuh's Smem): codes, three per-block arrays, chunk sums."""
        return mb * self.kp + 4 * mb * (3 * self.gp + self.kp // 32)


def choose_config(mb: int, n: int, k_tiles: int, num_sms: int, bits: int = 4, per_token: bool = False) -> dict:
    """The tile from the problem's arithmetic. RT row tiles per warp so that a lane's k-tile is 64 bytes of weights
    (int4 RT 2, int8 RT 1; RT 1 from M = 8, where the accumulators grow); U k-tiles a step: 2 on small layers at M <= 2
    (up to SMALL_LAYER_WEIGHTS: a warp's whole slice is then in flight before the PDL wait, which the prologue's
    quantization of x follows; 0.67-0.96x the time on 2-4M-weight layers, 1.1-1.25x on 7-17M ones), else 1, with PF
    register double buffering; KS warps along K doubled while the warps stay under TARGET_WARPS_PER_SM per SM and every
    k-slice keeps a step (a small layer's few row tiles need the split: 2048x2048 measured 0.7x the time at KS 16
    against 8); blocks of 8 warps (or KS). int4 at M = 1 with per-token activation scales: where the k-split reaches
    its cap with at most half the target's warps (few output rows: N up to ~4k), also U 2 at that KS (NARROW_CAP_U2);
    else where the split leaves slices of less than two k-tiles (short K), U 2 with the split halved until every slice
    holds a step, no double buffering where that step is a slice's only one (SHORT_SLICE_U2). int4 at M <= 2 with
    per-block activation scales, at M = 1 and on layers that are not narrow at M = 2: U 2 without double buffering, at
    the k-split nearest the target (BLOCK_U2); on narrow layers whose K makes 13-16 steps of two k-tiles at M = 1
    (exactly 16 at M = 2), RT 4 and KS 16, one step a slice (ONE_STEP_RT4), its math on the tensor cores
    (ONE_STEP_MMA). int8 with per-token scales at M <= 2 past
    the small layers: KS 16 wherever K has 16 k-tiles (INT8_FULL_SPLIT)."""
    rt = (2 if bits == 4 else 1) if mb <= 4 else 1
    warps_n = _cdiv(_cdiv(n, ROW_TILE), rt)
    target = TARGET_WARPS_PER_SM * num_sms
    narrow = 2 * warps_n * MAX_WARPS <= target  # at most half the target's warps even at the k-split's cap
    block_u2 = bits == 4 and not per_token and (mb == 1 or (mb == 2 and not narrow))  # BLOCK_U2
    u = 2 if block_u2 or (mb <= 2 and n * k_tiles * K_TILE <= SMALL_LAYER_WEIGHTS) else 1
    steps2 = _cdiv(k_tiles, 2)  # steps of two k-tiles
    steps = _cdiv(k_tiles, u)
    ks = 1
    while ks < MAX_WARPS and warps_n * ks < target and steps >= 2 * ks:
        ks *= 2
    if block_u2 and ks > 1 and (warps_n * ks) ** 2 > 2 * target**2:
        ks //= 2  # the split nearest the target (log scale)
    if bits == 8 and per_token and mb <= 2 and u == 1 and k_tiles >= MAX_WARPS:
        ks = MAX_WARPS  # INT8_FULL_SPLIT
    pf = 0 if block_u2 else 1
    if mb == 1 and per_token and u == 1 and bits == 4:
        if ks == MAX_WARPS and narrow and 4 * steps2 >= 3 * ks:
            u = 2  # NARROW_CAP_U2 (at least 3 / 4 of the slices keep a step)
        elif k_tiles < 2 * ks:  # SHORT_SLICE_U2
            u = 2
            while ks > 1 and steps2 < ks:
                ks //= 2
            pf = int(steps2 > ks)
    mma = 0
    one_step = 13 <= steps2 <= MAX_WARPS if mb == 1 else mb == 2 and steps2 == MAX_WARPS
    if bits == 4 and not per_token and narrow and one_step:
        rt, u, ks, pf, mma = 4, 2, MAX_WARPS, 0, 1  # ONE_STEP_RT4, ONE_STEP_MMA
    nw = max(8, ks)
    return {"RT": rt, "U": u, "KS": ks, "RG": nw // ks, "PF": pf, "OP": 1, "MMA": mma}


def complete_config(cfg: dict) -> dict:
    """A given config (RT, U, KS; RG default 8 / KS or 1; PF default 1; OP default 1; MMA default 0; GRID as gemv_a8)
    completed and checked."""
    GemvA8WgConfig.from_dict(cfg)  # (a ValueError naming a key the kernel does not have)
    out = {"U": 1, "PF": 1, "OP": 1, "MMA": 0, **cfg}
    out.setdefault("RG", max(1, 8 // out["KS"]))
    if 8 % out["RT"] or out["U"] not in (1, 2) or out["RG"] * out["KS"] > MAX_WARPS or out["MMA"] not in (0, 1):
        raise ValueError(f"gemv_a8_wg config {cfg}: RT must divide 8, U be 1 or 2, RG x KS <= {MAX_WARPS}, MMA 0 or 1")
    return out


def reduction_bytes(mb: int, cfg: dict) -> int:
    """Static shared memory of the k-slice reduction red[KS][M][16 RG RT] (fp32) of a block."""
    return 4 * cfg["KS"] * mb * ROW_TILE * cfg["RG"] * cfg["RT"]


def config_for(lay: WgmmaA8Layout, m: int, num_sms: int, per_token: bool = False) -> dict:
    return choose_config(m_bucket(m), lay.n, lay.k_padded // K_TILE, num_sms, lay.bits, per_token)


def defines_for(lay: WgmmaA8Layout, xt: int, mb: int, cfg: dict, per_token: bool, act_mode: str = "sym") -> dict:
    threads = 32 * cfg["RG"] * cfg["KS"]
    shape = WgGemvShape.of_layout(lay, cfg["U"])
    opc = row_chunks(lay.k, shape.kp, xt, threads, per_token or lay.per_channel) if cfg.get("OP", 1) else 0
    return {"A8_BITS": lay.bits, "A8_XT": xt, "A8_M": mb, "A8_G": 0 if lay.per_channel else lay.group_size,
            "A8_AT": int(per_token and not lay.per_channel), **GemvA8WgConfig.from_dict(cfg).defines(), "A8_OPC": opc,
            **mode_defines(act_mode)}


def smem_needed(qw: QuantizedWeight, m: int) -> int:
    """Dynamic shared memory of the M bucket's block at U = 1 (the can-run check; bounds every config's)."""
    group = 0 if qw.config.group_size == -1 else qw.group_size
    return WgGemvShape.of(_cdiv(qw.in_features, K_TILE) * K_TILE, group, 1).smem_bytes(m_bucket(m))


def prepare_gemv_a8_wg(qw: QuantizedWeight, m: int, x_dtype: torch.dtype, dev: torch.device,
                       out_dtype: torch.dtype, per_token: bool, config: dict | None,
                       act_mode: str = "sym") -> GemvA8Launch:
    """The GEMV's launch for M rows of x_dtype, built once (layout, compiled kernel, grid, parameters); called like
    gemv_a8's (x2d, bias, lo, hi[, out]). act_mode: "sym" or "sym_full" (its symmetric activation modes)."""
    if act_mode not in ("sym", "sym_full"):
        raise ValueError(f"gemv_a8_wg takes act_mode 'sym' or 'sym_full', got {act_mode!r}")
    if not 1 <= m <= MAX_M:
        raise ValueError(f"gemv_a8_wg handles 1 <= M <= {MAX_M}, got M={m}")
    fresh = not qw.has_layout(LAYOUT)  # its build kernels write the weights read before pdl_wait: no PDL first
    lay: WgmmaA8Layout = qw.layout(LAYOUT, build_wgmma_a8_v1)
    mb = m_bucket(m)
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    cfg = complete_config(config) if config is not None else config_for(lay, m, num_sms, per_token)
    if reduction_bytes(mb, cfg) > STATIC_SMEM - 1024:
        raise ValueError(f"gemv_a8_wg config {cfg} at M bucket {mb}: its k-slice reduction takes "
                         f"{reduction_bytes(mb, cfg)} bytes of static shared memory, over {STATIC_SMEM - 1024}")
    shape = WgGemvShape.of_layout(lay, cfg["U"])
    smem = shape.smem_bytes(mb)
    fn = nvrtc.get_function(SOURCE, KERNEL, defines_for(lay, _XT[x_dtype], mb, cfg, per_token, act_mode), dev)
    nvrtc.allow_dynamic_smem(fn, smem)
    threads = 32 * cfg["RG"] * cfg["KS"]
    ntiles = _cdiv(_cdiv(lay.n, ROW_TILE), cfg["RG"] * cfg["RT"])
    grid = persistent_grid(ntiles, fn, threads, smem, num_sms, cfg.get("GRID"))
    args = [
        ctypes.c_void_p(lay.weight.data_ptr()),
        ctypes.c_void_p(lay.params.data_ptr()),
        *GemvA8Launch.call_args(_OUT[out_dtype]),
        ctypes.c_int(lay.n),
        ctypes.c_int(lay.k),
        ctypes.c_int(shape.kp),
        ctypes.c_int(lay.k_padded // K_TILE),
        ctypes.c_int(lay.num_groups),
        ctypes.c_int(shape.gp),
        ctypes.c_int(m),
    ]
    pdl = pdl_on(dev)
    launch = nvrtc.prepare_launch(fn, dev, (grid, 1, 1), (threads, 1, 1), args, smem, pdl=pdl,
                                  first_without_pdl=fresh)
    return GemvA8Launch(launch, lay, m, lay.n, out_dtype, dev, x_at=2)


@torch.compiler.disable
def gemv_a8_wg(x2d: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None, lo: float, hi: float,
               out_dtype: torch.dtype, out: torch.Tensor | None = None, per_token: bool = False,
               config: dict | None = None, act_mode: str = "sym") -> torch.Tensor:
    """clamp(Qa(x2d) @ W.T + bias, lo, hi) -> [M, N] out_dtype with act_mode "sym" / "sym_full" activations (per token
    and weight group, or per token), reading qw's wgmma_a8_v1 (built on first use). x2d: fp16 / bf16 / fp32 [M, K]
    CUDA, 1 <= M <= 16."""
    from mixgemm.formats.layouts_wgmma_a8 import a8_layout_supported

    if not x2d.is_cuda or x2d.dim() != 2:
        raise ValueError("gemv_a8_wg needs a 2-D CUDA x [M, K]")
    m, k = x2d.shape
    if k != qw.in_features:
        raise ValueError(f"shape mismatch: x has K={k}, weight expects K={qw.in_features}")
    if x2d.dtype not in _XT or out_dtype not in _OUT:
        raise TypeError(f"gemv_a8_wg: activation dtype {x2d.dtype} / out_dtype {out_dtype} not supported (float16, "
                        "bfloat16, float32)")
    if not a8_layout_supported(qw):
        raise ValueError(f"gemv_a8_wg reads wgmma_a8_v1: sym int4 / int8 weights with group 128, 256 or per-channel, "
                         f"got mode={qw.mode!r} bits={qw.bits} group_size={qw.config.group_size}")
    if qw.device != x2d.device:
        raise ValueError(f"device mismatch: x on {x2d.device}, weight on {qw.device}")
    if out is None:
        out = torch.empty(m, qw.out_features, dtype=out_dtype, device=x2d.device)
    if qw.out_features == 0:
        return out
    return prepare_gemv_a8_wg(qw, m, x2d.dtype, x2d.device, out_dtype, per_token, config, act_mode)(
        x2d, None if bias is None else bias.contiguous(), lo, hi, out)
