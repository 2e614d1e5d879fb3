"""The CUDA-core GEMV's layout, built from the plain QuantizedWeight packing (built once per weight, cached by
``QuantizedWeight.layout(name, build)``).

``gemv_v2`` -- read by the CUDA-core GEMV (mixgemm/kernels/cuda_gemv/gemv.cu), M <= 16:

* ``weight``: uint8 [N, Kp * bits // 8], row-major, each row 16-byte aligned (Kp * bits / 8 is a multiple
  of 16). One 16-byte *chunk* holds ``chunk`` = 32 (int4) or 16 (int8) consecutive k in the plain packing
  (mixgemm.formats.packing): byte j of a row holds k = j (int8), or k = 2j in its low nibble and 2j + 1 in its
  high nibble (int4). Where Kp = K and the plain buffer is contiguous and 16-byte aligned (always, for weights
  quantized or loaded by mixgemm) ``weight`` *is* ``qw.qweight``: the layout costs no memory. The kernel pairs
  nibbles (k, k + 4) of each 32-bit word with one lop3 and permutes the activations to match (gemv.cu).

  Kp = K, except per-channel weights whose K is not a multiple of ``chunk``: Kp rounds K up and the
  padded codes are the zero point (the kernel feeds them zero activations); those get a padded copy.
* ``params``: per (row, group) parameters in the scale dtype: [N, G] scales for "sym" (``qw.scales`` itself);
  [N, G, 2] pairs (scale, z) for "zero_point" (z < 256 is exact in fp16/bf16/fp32);
  [N, G, 2] pairs (scale, m) for "offset". One load per group and row.
* ``gshift``: chunk c belongs to group c >> gshift (31 for per-channel: always group 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm.formats.layouts import KernelLayout
from mixgemm.formats.packing import pack_codes, unpack_codes
from mixgemm.formats.weight import PER_CHANNEL, QuantizedWeight, narrow_group_reason


@dataclass(frozen=True)
class GemvLayout(KernelLayout):
    """The ``gemv_v2`` layout of one weight (see the module docstring): weight uint8 [N, Kp * bits // 8], params
    [N, G] or [N, G, 2]."""

    chunk: int  # k per 16-byte chunk
    gshift: int

    @property
    def chunks_per_row(self) -> int:
        return self.k_padded // self.chunk


def build_gemv_v2(qw: QuantizedWeight) -> GemvLayout:
    """The CUDA-core GEMV's layout of ``qw`` (on qw's device): its own buffers wherever they already are the layout
    (see the module docstring), else a copy. The plain tensors are not modified."""
    n, k = qw.shape
    bits = qw.bits
    chunk = 32 if bits == 4 else 16
    g, ng = qw.config.groups(k)
    why = narrow_group_reason(g, ng)
    if why:
        raise ValueError(f"no gemv_v2 layout: {why}")
    kp = -(-k // chunk) * chunk
    plain = qw.qweight
    if kp == k and plain.is_contiguous() and plain.data_ptr() % 16 == 0:
        weight = plain  # the plain packing is this layout: the weight's own buffer, no second copy
    else:
        codes = qw.codes()
        if kp != k:  # per-channel, or a partial last group: its zero code (offset: code 0, x is 0 there)
            zc = qw.zero_points()[:, -1:].to(torch.uint8) if qw.mode != "offset" else 0
            pad = torch.zeros(n, kp - k, dtype=torch.uint8, device=codes.device) + zc
            codes = torch.cat([codes, pad], dim=1)
        weight = pack_codes(codes, bits).contiguous()
    if qw.mode == "sym":
        params = qw.scales.contiguous()
    elif qw.mode == "zero_point":
        params = torch.stack([qw.scales, qw.zeros.to(qw.scales.dtype)], dim=-1).contiguous()
    else:
        params = torch.stack([qw.scales, qw.offsets.to(qw.scales.dtype)], dim=-1).contiguous()
    if qw.config.group_size == PER_CHANNEL:
        gshift = 31
    else:
        cpg = g // chunk
        gshift = cpg.bit_length() - 1
        assert 1 << gshift == cpg
    return GemvLayout(weight=weight, params=params, n=n, k=k, k_padded=kp, bits=bits,
                      mode=qw.mode, group_size=g, num_groups=ng, chunk=chunk, gshift=gshift)


def unpack_gemv_v2(layout: GemvLayout) -> torch.Tensor:
    """Codes uint8 [N, K] read back from a ``gemv_v2`` layout (for tests and debugging)."""
    return unpack_codes(layout.weight, layout.bits, layout.k_padded)[:, : layout.k].contiguous()
