"""Weight-only int4 / int8 GEMMs on the CPU through PyTorch's own kernels, on bfloat16 activations.

Contract (the CPU entry of mixgemm.matmul):

* ``cpu_can_run(x, qw) -> (ok, reason)``: ok when a kernel below takes ``x @ W.T``; reason names the route
  that runs, or why none can.
* ``cpu_linear(x, qw, bias, activation) -> y``: act(x @ dequant(W).T + bias), x bfloat16 [..., K] on the CPU,
  y [..., N] bfloat16. Raises ValueError with cpu_can_run's reason when no kernel takes the problem.

Routes (neither dequantizes the whole weight per call):

* 4 bits: ``torch._weight_int4pack_mm_for_cpu``, which computes w = (q - 8) * s + zero per group of
  ``kernel_group`` in {32, 64, 128, 256} (a divisor of the weight's group: a weight group of 512, or
  per-channel, is several kernel groups with the same scale). Every mixgemm mode has the form
  w = (q - 8) * s + m' (QuantizedWeight.centered_params_float64): zero is passed as 0 and the m' term is added
  after the kernel, in float32, as (x summed per group) @ m' -- exact, where folding m' into the kernel's
  bfloat16 zero would round it. N must be a multiple of 16 (the kernel's layout).
* 8 bits, per-channel: ``torch._weight_int8pack_mm`` (x @ (c * s).T for c int8 [N, K], one scale per row) with
  c = q - 128 and unit scales; the real scales s (and m') are applied after, in float32, so they are used exactly.
  K must be a multiple of 32: torch 2.13's kernel read past the end of rows of other lengths (wrong results and
  crashes, measured with K = 33 on an AVX2 CPU).
* 8 bits, groups of 16 (GGUF's Q6_K / Q3_K / Q2_K): the int4 kernel's groups of 32 each take one weight group's high
  and low nibbles of q - d against [16 x, x] of that group (16 x exact in bfloat16), scale s and zero 0: the group
  sums s x (16 h + l - 136) = s x (q - q0), q0 = d + 136 with d putting q0 at the middle of the codes' range (where
  q - d stays in 0..255), (q0 - 128) s joining m'. One call, N a multiple of 16.
* 8 bits, grouped: each code split into two nibbles, q = 16 q_hi + q_lo, so that
  (q - 128) s = (q_hi - 8) (16 s) + (q_lo - 8) s + 8 s: a 4-bit weight [N, 2K] (the high nibbles, then the low
  ones, with scales 16 s and s) times [x, x], through the int4 kernel in one call (8 s joins m'). Where N is not a
  multiple of 16, ``torch._weight_int8pack_mm`` once per group instead (one call per group: slow at small M).

Precision: the kernels take scales in the activation dtype, so int4 scales are rounded to bfloat16 when their
dtype is not bfloat16 (a relative change of at most 2**-9 per group scale, the order of bfloat16's own rounding
of the output). Why bfloat16 only: on x86 CPUs without AVX-512 the float32 and float16 variants of both kernels
run scalar loops, 5-20x slower than the dequantizing fallback (mixgemm.kernels.cpu.dequant) at M = 16, and
rounding float32 / float16 activations to bfloat16 would lose more than their dtype's precision.

Layouts, built once per weight and cached on it (QuantizedWeight.layout): the int4 layout is uint8 [N, K / 2],
the same size as the codes, plus 4 bytes (bf16 scale and zero) per kernel group and 4 bytes (float32 m') per
group for the asymmetric modes; the int8 layouts (int8 [G, N, group], or the nibbles in the int4 layout, paired or
not) are the size of the codes, plus 4 to 12 bytes per group (scales, m'). The plain tensors stay, so the CPU layout
doubles the codes' memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm.epilogue import clamp_bounds
from mixgemm.formats.weight import NARROW_GROUP, QuantizedWeight, partial_group

KERNEL_GROUPS = (256, 128, 64, 32)  # group sizes _weight_int4pack_mm_for_cpu accepts, largest first
INT4_N_MULTIPLE = 16  # _convert_weight_to_int4pack_for_cpu: "expect N to be dividable by 16"
INT8_K_MULTIPLE = 32


@dataclass(frozen=True)
class Int4CpuLayout:
    """packed: uint8 [N, K' / 2] (torch's CPU int4 layout); scales_and_zeros: bfloat16 [K' / kernel_group, N, 2]
    holding (s, 0); kernel_group: the kernel's group size; offsets: float32 [G, N], the m' of
    w = (q - 8) s + m' per weight group, or None for "sym". nibbles: True for an 8-bit weight split into two
    nibbles (K' = 2K, multiplied by [x, x]), False for a 4-bit weight (K' = K). paired: an 8-bit weight of groups of
    16 whose two nibbles share a kernel group (K' = 2K, multiplied by [16 x, x] per group)."""

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor
    kernel_group: int
    offsets: torch.Tensor | None
    nibbles: bool = False
    paired: bool = False


@dataclass(frozen=True)
class Int8CpuLayout:
    """codes: int8 [G, N, group] (c = q - q0, one contiguous matrix per weight group); unit: bfloat16 [N] ones
    (the kernel's per-row scale); scales: float32 [G, N]; offsets: float32 [G, N] (m') or None for "sym" weights
    centred at 128."""

    codes: torch.Tensor
    unit: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor | None


def _kernel_group(group: int) -> int | None:
    return next((kg for kg in KERNEL_GROUPS if group % kg == 0), None)


def _offsets(qw: QuantizedWeight) -> torch.Tensor | None:
    """m' float32 [G, N] of w = (q - bias) s + m', or None for "sym" (m' = 0)."""
    if qw.mode == "sym":
        return None
    return qw.centered_params_float64()[1].float().T.contiguous()


def build_int4_layout(qw: QuantizedWeight) -> Int4CpuLayout:
    """torch's CPU int4 layout of a 4-bit weight (see the module docstring for the conditions)."""
    kg = _kernel_group(qw.group_size)
    if qw.bits != 4 or kg is None or qw.out_features % INT4_N_MULTIPLE:
        raise ValueError(f"no CPU int4 layout for bits={qw.bits}, group={qw.group_size}, N={qw.out_features}")
    packed = torch._convert_weight_to_int4pack_for_cpu(qw.codes().to(torch.int32), 1)
    s = qw.scales.to(torch.bfloat16).repeat_interleave(qw.group_size // kg, dim=1).T  # [K / kg, N]
    scales_and_zeros = torch.stack((s, torch.zeros_like(s)), dim=-1).contiguous()
    return Int4CpuLayout(packed, scales_and_zeros, kg, _offsets(qw))


# centres 16 h + l of the nibble route: the kernel's zero (8 - h) 16 s or (8 - l) s is then a power of two times the
# bfloat16 scale, exact in bfloat16
_NIBBLE_CENTRES = (0, 4, 6, 7, 8)


def _code_range(q: torch.Tensor) -> tuple[int, int]:
    return int(q.min()), int(q.max())


def build_int8_nibbles_layout(qw: QuantizedWeight) -> Int4CpuLayout:
    """A grouped 8-bit weight as the 4-bit weight [N, 2K] of its high and low nibbles (module docstring), centred
    on the codes' range: (q - q0) s with q0 = 16 h + l is (q_hi - h) 16 s + (q_lo - l) s, which the kernel computes
    as (q_hi - 8) 16 s + (8 - h) 16 s and (q_lo - 8) s + (8 - l) s (its zeros exact in bfloat16), and (q0 - 128) s
    joins m'. Centring keeps the kernel's bfloat16 output and its rounded scales away from a large constant term:
    codes of 5 bits (GGUF Q5_*) centred at 128 lost several % of the output to it."""
    kg = _kernel_group(qw.group_size)
    if qw.bits != 8 or kg is None or qw.out_features % INT4_N_MULTIPLE:
        raise ValueError(f"no CPU nibble layout for bits={qw.bits}, group={qw.group_size}, N={qw.out_features}")
    q = qw.codes()
    lo, hi = _code_range(q)
    h, l = min(((h, l) for h in _NIBBLE_CENTRES for l in _NIBBLE_CENTRES),
               key=lambda hl: abs(16 * hl[0] + hl[1] - (lo + hi) / 2))
    q = q.to(torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(torch.cat((q >> 4, q & 15), dim=1), 1)
    s = qw.scales.to(torch.bfloat16)  # 16 s is then exact in bfloat16 too
    s2 = torch.cat((s * 16, s), dim=1).repeat_interleave(qw.group_size // kg, dim=1).T  # [2K / kg, N]
    z2 = torch.cat((s * (16 * (8 - h)), s * (8 - l)), dim=1).repeat_interleave(qw.group_size // kg, dim=1).T
    scales_and_zeros = torch.stack((s2, z2), dim=-1).contiguous()
    m = qw.centered_params_float64()[1].T + (16 * h + l - 128) * qw.scales.double().T  # w = (q - q0) s + m
    return Int4CpuLayout(packed, scales_and_zeros, kg, m.float().contiguous(), nibbles=True)


def build_int8_paired_layout(qw: QuantizedWeight) -> Int4CpuLayout:
    """An 8-bit weight of groups of 16 as the 4-bit weight [N, 2K] of each group's high then low nibbles, one kernel
    group of 32 per weight group (module docstring): the nibbles of q - d (in 0..255), so that the kernel's zero-free
    group sums s x (q - q0) for q0 = d + 136 at the middle of the codes' range where it fits."""
    if qw.bits != 8 or qw.group_size != NARROW_GROUP or qw.out_features % INT4_N_MULTIPLE:
        raise ValueError(f"no CPU paired layout for bits={qw.bits}, group={qw.group_size}, N={qw.out_features}")
    n, k = qw.shape
    q = qw.codes().to(torch.int32)
    lo, hi = _code_range(q)
    d = min(max((lo + hi + 1) // 2 - 136, hi - 255), lo)
    qd = (q - d).view(n, qw.num_groups, 1, NARROW_GROUP)
    packed = torch._convert_weight_to_int4pack_for_cpu(torch.cat((qd >> 4, qd & 15), dim=2).view(n, 2 * k), 1)
    s = qw.scales.to(torch.bfloat16).T  # [G, N]
    scales_and_zeros = torch.stack((s, torch.zeros_like(s)), dim=-1).contiguous()
    m = qw.centered_params_float64()[1].T + (d + 136 - 128) * qw.scales.double().T  # w = (q - q0) s + m
    return Int4CpuLayout(packed, scales_and_zeros, 2 * NARROW_GROUP, m.float().contiguous(), paired=True)


def _paired_x(x2: torch.Tensor) -> torch.Tensor:
    """[16 x, x] per group of 16 of x2 [M, K] (the paired layout's activations): [M, 2K]."""
    xg = x2.view(x2.shape[0], -1, 1, NARROW_GROUP)
    return torch.cat((xg * 16, xg), dim=2).view(x2.shape[0], -1)


def _nibbles_fit(qw: QuantizedWeight) -> bool:
    return qw.num_groups > 1 and _kernel_group(qw.group_size) is not None and qw.out_features % INT4_N_MULTIPLE == 0


def build_int8_layout(qw: QuantizedWeight) -> Int8CpuLayout:
    """Signed int8 codes c = q - q0 per weight group and float32 scales (see the module docstring); q0 is 128, or the
    middle of the codes' range when that keeps every c in int8 (as the nibble layout, for the same reason), the
    (q0 - 128) s joining m'."""
    n, k = qw.shape
    ng, g = qw.num_groups, qw.group_size
    q = qw.codes()
    lo, hi = _code_range(q)
    q0 = min(max((lo + hi + 1) // 2, hi - 127), lo + 128)
    c = (q.to(torch.int16) - q0).to(torch.int8)
    codes = c.view(n, ng, g).transpose(0, 1).contiguous()
    offsets = _offsets(qw)
    if q0 != qw.config.sym_bias:
        m = qw.centered_params_float64()[1] + (q0 - qw.config.sym_bias) * qw.scales.double()
        offsets = m.float().T.contiguous()
    return Int8CpuLayout(codes, torch.ones(n, dtype=torch.bfloat16), qw.scales.float().T.contiguous(), offsets)


def cpu_can_run(x: torch.Tensor, qw: QuantizedWeight) -> tuple[bool, str]:
    """(True, the route) when torch's CPU int4 / int8 kernel takes x @ W.T, else (False, why not)."""
    if x.device.type != "cpu" or qw.device.type != "cpu":
        return False, f"x on {x.device}, weight on {qw.device}: the CPU kernels take CPU tensors"
    if qw.resident is not None:
        return False, f"the weight keeps only its {qw.resident} layout (compacted); torch's kernels need their own"
    if partial := partial_group(qw.in_features, qw.group_size):
        return False, f"{partial}: torch's CPU int4 / int8 kernels take whole groups"
    if x.dtype != torch.bfloat16:
        return False, (f"{x.dtype} activations: torch's CPU int4/int8 kernels are fast in bfloat16 only (their "
                       "float32 / float16 paths are scalar loops on CPUs without AVX-512)")
    if qw.bits == 4:
        if not hasattr(torch, "_weight_int4pack_mm_for_cpu"):
            return False, "this torch build has no _weight_int4pack_mm_for_cpu"
        kg = _kernel_group(qw.group_size)
        if kg is None:
            return False, f"group of {qw.group_size} is not a multiple of 32 (the int4 kernel's groups: 32..256)"
        if qw.out_features % INT4_N_MULTIPLE:
            return False, f"N={qw.out_features} is not a multiple of {INT4_N_MULTIPLE} (torch's CPU int4 layout)"
        return True, f"torch._weight_int4pack_mm_for_cpu, bfloat16, kernel group {kg}"
    if qw.group_size == NARROW_GROUP:
        if not hasattr(torch, "_weight_int4pack_mm_for_cpu"):
            return False, "this torch build has no _weight_int4pack_mm_for_cpu"
        if qw.out_features % INT4_N_MULTIPLE:
            return False, f"N={qw.out_features} is not a multiple of {INT4_N_MULTIPLE} (torch's CPU int4 layout)"
        return True, ("torch._weight_int4pack_mm_for_cpu on each group of 16's two nibbles against [16 x, x], "
                      "bfloat16, kernel group 32")
    if not hasattr(torch, "_weight_int8pack_mm"):
        return False, "this torch build has no _weight_int8pack_mm"
    if qw.group_size % INT8_K_MULTIPLE:
        return False, (f"group of {qw.group_size} is not a multiple of {INT8_K_MULTIPLE} (torch's CPU int8 kernel "
                       "misreads other row lengths)")
    if _nibbles_fit(qw):
        return True, (f"torch._weight_int4pack_mm_for_cpu on the two nibbles of each code, bfloat16, kernel group "
                      f"{_kernel_group(qw.group_size)}")
    calls = "" if qw.num_groups == 1 else f", {qw.num_groups} calls (one per group)"
    return True, f"torch._weight_int8pack_mm, bfloat16{calls}"


def _group_sums(x2: torch.Tensor, ng: int) -> torch.Tensor:
    """float32 [M, G]: x summed over each weight group (the factor of m')."""
    return x2.float().view(x2.shape[0], ng, -1).sum(-1)


def cpu_linear(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None,
               activation: str | None) -> torch.Tensor:
    """act(x @ dequant(W).T + bias) through torch's CPU int4 / int8 kernels: x bfloat16 [..., K] -> [..., N]."""
    ok, why = cpu_can_run(x, qw)
    if not ok:
        raise ValueError(f"mixgemm CPU kernels cannot run this problem: {why}")
    lo, hi = clamp_bounds(activation)
    n, k = qw.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k).contiguous()
    if x2.shape[0] == 0:
        return x.new_zeros(*lead, n)
    if qw.bits == 4 or qw.group_size == NARROW_GROUP or _nibbles_fit(qw):
        if qw.bits == 4:
            lay = qw.layout("cpu_int4", build_int4_layout)
        elif qw.group_size == NARROW_GROUP:
            lay = qw.layout("cpu_int8_paired", build_int8_paired_layout)
        else:
            lay = qw.layout("cpu_int8_nibbles", build_int8_nibbles_layout)
        xk = _paired_x(x2) if lay.paired else torch.cat((x2, x2), dim=1) if lay.nibbles else x2
        y = torch._weight_int4pack_mm_for_cpu(xk, lay.packed, lay.kernel_group, lay.scales_and_zeros)
        if lay.offsets is None and bias is None and activation is None:
            return y.reshape(*lead, n)
        y = y.float()
    else:
        lay = qw.layout("cpu_int8", build_int8_layout)
        ng, g = qw.num_groups, qw.group_size
        if ng == 1:
            y = torch._weight_int8pack_mm(x2, lay.codes[0], lay.unit).float().mul_(lay.scales[0])
        else:
            xg = x2.view(-1, ng, g).transpose(0, 1).contiguous()  # [G, M, g]: one contiguous slice per group
            y = torch.zeros(x2.shape[0], n, dtype=torch.float32)
            for i in range(ng):
                y.addcmul_(torch._weight_int8pack_mm(xg[i], lay.codes[i], lay.unit), lay.scales[i])
    if lay.offsets is not None:
        y.addmm_(_group_sums(x2, qw.num_groups), lay.offsets)
    if bias is not None:
        y += bias.float()
    return y.clamp_(lo, hi).to(x.dtype).reshape(*lead, n)


__all__ = ["Int4CpuLayout", "Int8CpuLayout", "build_int4_layout", "build_int8_layout", "build_int8_nibbles_layout",
           "build_int8_paired_layout", "cpu_can_run", "cpu_linear"]
