"""Layout "a8gemv_v2": a QuantizedWeight as the fused activation-quantized GEMV (W4A8 / W8A8, M <= 16) reads it.

Built once per weight by :func:`build_a8gemv_v2` and cached with ``qw.layout("a8gemv_v2", build_a8gemv_v2)``.
The kernel (gemv_a8.cu beside this file) reads, per output row n:

* ``weight``: uint8 [N, Kw * 16]: 16-byte chunks of CH k (32 for int4, 16 for int8) in the plain byte order
  (mixgemm.formats.packing: unsigned codes q, int4 low nibble first). A step of the kernel is 32 lanes x U chunks; at
  (step s, u) lane l reads position (s*U + u)*32 + l of the row, and its U chunks of a step are one *unit* whose
  integer dot is folded into fp32 once (one weight scale).

  * per-channel: position p holds chunk p, so ``weight`` is ``qw.qweight`` itself wherever K is a whole number of
    chunks and the buffer is contiguous and 16-byte aligned (else a copy padded to whole chunks with the code of
    c = 0): no memory of its own.
  * grouped: position (s*U + u)*32 + l holds chunk (s*32 + l)*U + u, so a unit is U consecutive chunks inside one
    group (U <= group / CH); rows padded to Kp with the code of c = 0. A copy: read in the plain order, a lane's
    chunks lie in U different groups and each needs its own fold, which measured up to 1.3x slower.

  Kp = K padded to a step (32 * U * CH) sizes the kernel's shared activation codes.
* ``sdot``: float32 [N, Gp] (Gp = Kp // g, or 1 per-channel): s for int8, s / 16 for int4 (the kernel's
  integer dot is 16 x sum(c * xq)). Padded groups are 0.
* ``moff``: float32 [N, Gp] or None (mode "sym"): m of w = c * s + m (the int8_v1 rewrite of every mode).
* ``cterm``: float32 [N, Gp]: s * sum(c over the group) + g * m (float64, rounded once), the weight side of
  the asymmetric-activation term.

c = q - 8 (int4) or q - 128 (int8) is the signed code of that rewrite; the kernel multiplies the unsigned q and
subtracts the bias times the unit's activation code sum. The params equal those of the Triton layout int8_v1
(mixgemm/kernels/triton_a8/layout.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm.formats.packing import pack_codes
from mixgemm.formats.weight import QuantizedWeight

LAYOUT_NAME = "a8gemv_v2"
CHUNK_K = {4: 32, 8: 16}  # k per 16-byte chunk


@dataclass(frozen=True)
class A8GemvLayout:
    weight: torch.Tensor  # uint8 [N, kw * 16]
    sdot: torch.Tensor
    moff: torch.Tensor | None
    cterm: torch.Tensor
    bits: int
    group_size: int  # K for per-channel
    per_channel: bool
    u: int
    n: int
    k: int
    kp: int  # K padded to a step (32 * u chunks): the kernel's shared activation codes
    gp: int

    @property
    def kw(self) -> int:
        """16-byte weight chunks per row."""
        return self.weight.shape[1] // 16


def pick_u(bits: int, k: int, group: int, per_channel: bool) -> int:
    """Chunks per lane and step: at most 4 and (grouped weights) at most group / CH, as many as the kernel's measured
    tiles were made for; smaller when padding K to a step (32 * U * CH) would waste more than 1/8 of the row."""
    ch = CHUNK_K[bits]
    umax = 4 if per_channel else max(1, min(4, group // ch))
    base = -(-k // (32 * ch)) * 32 * ch
    u = umax
    while u > 1 and -(-k // (32 * u * ch)) * 32 * u * ch > base + base // 8:
        u //= 2
    return u


def unit_order(chunks: torch.Tensor, u: int) -> torch.Tensor:
    """[N, Kc, 16] chunk bytes in K order (Kc a multiple of 32 * u) -> [N, Kc * 16] in the grouped unit order above."""
    n, kc, _ = chunks.shape
    return chunks.reshape(n, kc // (32 * u), 32, u, 16).permute(0, 1, 3, 2, 4).reshape(n, kc * 16).contiguous()


def build_a8gemv_v2(qw: QuantizedWeight) -> A8GemvLayout:
    """The fused GEMV's layout of ``qw`` (plain layout, any mode / group, 4 or 8 bits): per channel its own codes
    buffer wherever that already is the layout, else a copy (see the module docstring); the params are computed. Does
    not modify qw."""
    n, k = qw.shape
    g, ng = qw.group_size, qw.num_groups
    per_channel = ng == 1 and g == k and qw.config.group_size == -1
    bits = qw.bits
    ch = CHUNK_K[bits]
    u = pick_u(bits, k, g, per_channel)
    step = 32 * u * ch
    kp = -(-k // step) * step
    gp = 1 if per_channel else kp // g
    dev = qw.device
    plain = qw.qweight
    if per_channel and k % ch == 0 and plain.is_contiguous() and plain.data_ptr() % 16 == 0:
        weight = plain  # the plain packing is this layout: the weight's own buffer, no second copy
    else:
        width = -(-k // ch) * ch if per_channel else kp
        qp = torch.full((n, width), qw.config.sym_bias, dtype=torch.uint8, device=dev)  # pad: c = 0
        qp[:, :k] = qw.codes()
        weight = pack_codes(qp, bits)
        if not per_channel:
            weight = unit_order(weight.reshape(n, width // ch, 16), u)
    s64, m64 = qw.centered_params_float64()
    _, cterm = qw.centered_group_sums()

    def padg(t: torch.Tensor) -> torch.Tensor:
        out = torch.zeros((n, gp), dtype=torch.float32, device=dev)
        out[:, :ng] = t.float()
        return out.contiguous()

    return A8GemvLayout(
        weight=weight,
        sdot=padg(s64 / (16 if bits == 4 else 1)),
        moff=None if qw.mode == "sym" else padg(m64),
        cterm=padg(cterm),
        bits=bits,
        group_size=g,
        per_channel=per_channel,
        u=u,
        n=n,
        k=k,
        kp=kp,
        gp=gp,
    )


def get_a8gemv_layout(qw: QuantizedWeight) -> A8GemvLayout:
    """The cached a8gemv_v2 layout of qw (built on first use)."""
    return qw.layout(LAYOUT_NAME, build_a8gemv_v2)
