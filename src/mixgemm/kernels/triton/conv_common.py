"""What the Triton conv kernels share (the implicit GEMM, the depthwise and whole-K kernels, the int8-activation conv,
the dequantize + cuDNN route, and the CUDA depthwise conv, which reads the same layout): the weight layout
``conv_triton_v1`` (the plain packed codes as int32 words, the group parameters as float32 [G, Co]), the output pixel
decode and the bias / clamp / store epilogue, and the conv sweep's lookups of this GPU (mixgemm.tuning.conv_table).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mixgemm.formats.conv import QuantizedConvWeight
from mixgemm.formats.weight import QuantizedWeight
from mixgemm.kernels.triton.dequant import MODE_IDS

LAYOUT_NAME = "conv_triton_v1"


# --------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class ConvLayout:
    """``conv_triton_v1``: the plain packed codes as int32 words ([Co, KW], see _word_rows) and the
    per-group parameters as float32 [G, Co] (transposed so a program's BLOCK_N channels of one group are
    contiguous): w[n, k] = (q[n, k] - shift[g, n]) * scale[g, n] (sym: shift = 2**(bits-1), zero_point: z), or
    q[n, k] * scale[g, n] + shift[g, n] for mode "offset" (``affine``); g = k // group_size."""

    weight: torch.Tensor
    scale: torch.Tensor
    shift: torch.Tensor
    n: int
    k: int
    bits: int
    group_size: int
    num_groups: int
    affine: bool  # mode "offset": shift is m (w = q * s + m); otherwise shift is the zero point z
    zero_mode: int  # mixgemm.kernels.triton.dequant.MODE_IDS

    @property
    def scale_in_tile(self) -> bool:
        """False for per-channel sym / zero_point weights: the kernels' tiles then hold the exact integers q - z and
        the scale multiplies the fp32 accumulator once at the end (one multiply per output instead of per weight)."""
        return not (self.num_groups == 1 and self.zero_mode != MODE_IDS["offset"])


def build_conv_layout(qw: QuantizedWeight) -> ConvLayout:
    s = qw.scales.double()
    if qw.mode == "offset":
        sh = qw.offsets.double()  # w = q * s + m
    else:
        sh = qw.zero_points().double()  # w = (q - z) * s, z an integer (exact in any float dtype)
    return ConvLayout(
        weight=_word_rows(qw.qweight),
        scale=s.t().float().contiguous(),
        shift=sh.t().float().contiguous(),
        n=qw.shape[0],
        k=qw.shape[1],
        bits=qw.bits,
        group_size=qw.group_size,
        num_groups=qw.num_groups,
        affine=qw.mode == "offset",
        zero_mode=MODE_IDS[qw.mode],
    )


def _word_rows(qweight: torch.Tensor) -> torch.Tensor:
    """The packed codes as int32 words [Co, KW] (little-endian: word i holds k = E*i .. E*i + E - 1, E = 32 / bits,
    code f of the word at bits f*bits: the order the shared dequant primitive unpacks). Rows are padded with zero
    bytes to a multiple of 4 bytes only when needed (no copy otherwise: a view of the plain packing)."""
    q = qweight.contiguous()
    n, kb = q.shape
    if kb % 4 or q.data_ptr() % 16:
        pad = torch.zeros(n, (kb + 15) // 16 * 16, dtype=torch.uint8, device=q.device)
        pad[:, :kb] = q
        q = pad
    return q.view(torch.int32)


def conv_layout(qw: QuantizedWeight) -> ConvLayout:
    return qw.layout(LAYOUT_NAME, build_conv_layout)


# --------------------------------------------------------------------------------------------- kernel helpers
@triton.jit
def out_pixels(offs_m, HO, WO):
    """Output pixel m of the [B*HO*WO] GEMM row space -> (batch, oh, ow) (shared by every conv kernel)."""
    ow = offs_m % WO
    t = offs_m // WO
    return t // HO, t % HO, ow


@triton.jit
def conv_epilogue(acc, out_ptr, bias_ptr, offs_n, mask_n, bb, oh, ow, mask_m, sob, soc, soh, sow, lo, hi,
                   HAS_BIAS: tl.constexpr):
    """+ bias[offs_n], clamp to [lo, hi], store the [BLOCK_M, BLOCK_N] tile (rows: output pixels (bb, oh, ow),
    columns: output channels offs_n) into out with its NCHW or channels_last strides."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    acc = tl.minimum(tl.maximum(acc, lo), hi)
    o_ptrs = out_ptr + (bb.to(tl.int64) * sob + oh * soh + ow * sow)[:, None] + offs_n[None, :].to(tl.int64) * soc
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def _dot_prec(dtype: torch.dtype) -> str:
    # fp32 activations: exact fp32 products (no silent TF32 rounding); fp16/bf16 ignore this flag.
    return "ieee" if dtype == torch.float32 else "tf32"


def _num_sms(device) -> int:
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def _pow2_at_least(v: int, lo: int) -> int:
    p = lo
    while p < v:
        p *= 2
    return p


_GPU_NAMES: dict[int, str] = {}


def _gpu_name(device) -> str:
    if device.type != "cuda":
        return "cpu"
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _GPU_NAMES:
        _GPU_NAMES[idx] = torch.cuda.get_device_name(idx)
    return _GPU_NAMES[idx]


def tuned_wgmma_choice(device, qw: QuantizedConvWeight, stride, m: int) -> tuple[bool, dict | None]:
    """(measured, config) of the wgmma conv for this layer on this GPU (conv_table.lookup_wgmma; groups 1)."""
    from mixgemm.tuning import conv_table

    return conv_table.lookup_wgmma(_gpu_name(device), conv_table.layer_key(qw, stride, 1, m))
