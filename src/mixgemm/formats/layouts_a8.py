"""Layout "a8gemv_v1": a QuantizedWeight repacked for the fused activation-quantized GEMV (W4A8 / W8A8, M <= 16).

Built once per weight by :func:`build_a8gemv_v1` and cached with ``qw.layout("a8gemv_v1", build_a8gemv_v1)``.
The kernel (mixgemm/kernels/cuda/gemv_a8.cu) reads, per output row n:

* ``weight``: uint8 [N, Kp * bits // 8], Kp = K padded to a *step* of 32 * U * CH k (CH = 32 for int4,
  16 for int8: one 16-byte chunk). Chunk kc (k = kc*CH ..) is stored at chunk position (s*U + u)*32 + l
  with kc = (s*32 + l)*U + u, so a warp load is 512 contiguous bytes and lane l's U chunks of step s are
  consecutive in K (one *unit* of U*CH k, inside one group since U <= group / CH).

  * int4: word t (4 bytes) of a chunk covers k = 8t .. 8t+7 of the chunk; byte b holds the UNSIGNED code
    q of k = 8t + b in its low nibble and of k = 8t + 4 + b in its high nibble (q = c + 8).
  * int8: the signed codes c = q - 128 in K order.
  Padding (k >= K) holds c = 0 (q = 8).
* ``sdot``: float32 [N, Gp] (Gp = Kp // g, or 1 per-channel): s for int8, s / 16 for int4 (the kernel's
  integer dot is 16 x sum(c * xq)). Padded groups are 0.
* ``moff``: float32 [N, Gp] or None (mode "sym"): m of w = c * s + m (the int8_v1 rewrite of every mode).
* ``cterm``: float32 [N, Gp]: s * sum(c over the group) + g * m (float64, rounded once), the weight side of
  the asymmetric-activation term.

The codes and params equal those of the Triton layout int8_v1 (mixgemm/kernels/triton/int8_layout.py);
only the byte order differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm.formats.weight import QuantizedWeight

LAYOUT_NAME = "a8gemv_v1"
CHUNK_K = {4: 32, 8: 16}  # k per 16-byte chunk


@dataclass(frozen=True)
class A8GemvLayout:
    weight: torch.Tensor
    sdot: torch.Tensor
    moff: torch.Tensor | None
    cterm: torch.Tensor
    bits: int
    group_size: int  # K for per-channel
    per_channel: bool
    u: int
    n: int
    k: int
    kp: int
    gp: int


def pick_u(bits: int, k: int, group: int, per_channel: bool) -> int:
    """Chunks per lane and step: at most group / CH (a unit inside one group) and at most 4; smaller when
    padding K to a step (32 * U * CH) would waste more than 1/8 of the row."""
    ch = CHUNK_K[bits]
    umax = 4 if per_channel else max(1, min(4, group // ch))
    base = -(-k // (32 * ch)) * 32 * ch
    u = umax
    while u > 1 and -(-k // (32 * u * ch)) * 32 * u * ch > base + base // 8:
        u //= 2
    return u


def order_chunks(chunks: torch.Tensor, u: int) -> torch.Tensor:
    """[N, Kc, 16] chunks in K order -> [N, Kc * 16] bytes in the lane-major step order above."""
    n, kc, _ = chunks.shape
    s = kc // (32 * u)
    return chunks.reshape(n, s, 32, u, 16).permute(0, 1, 3, 2, 4).reshape(n, kc * 16).contiguous()


def pack_int4_words(q: torch.Tensor) -> torch.Tensor:
    """Unsigned codes uint8 [N, Kp] (Kp % 32 == 0) -> [N, Kp // 32, 16] chunk bytes (word order above)."""
    n, kp = q.shape
    r = q.reshape(n, kp // 8, 2, 4)  # [word][lo/hi half][byte]
    byte = r[:, :, 0, :] | (r[:, :, 1, :] << 4)
    return byte.reshape(n, kp // 32, 16)


def unpack_int4_words(b: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_int4_words (tests): [N, Kc, 16] -> uint8 [N, Kc * 32]."""
    n, kc, _ = b.shape
    r = b.reshape(n, kc * 4, 4)
    return torch.stack((r & 0xF, r >> 4), dim=2).reshape(n, kc * 32)


def build_a8gemv_v1(qw: QuantizedWeight) -> A8GemvLayout:
    """Repack ``qw`` (plain layout, any mode / group, 4 or 8 bits) into A8GemvLayout. Does not modify qw."""
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
    bias = qw.config.sym_bias
    q = qw.codes()  # uint8 [N, K]
    qp = torch.full((n, kp), bias, dtype=torch.uint8, device=dev)  # pad: c = 0
    qp[:, :k] = q
    if bits == 4:
        chunks = pack_int4_words(qp)
    else:
        chunks = (qp.to(torch.int16) - bias).to(torch.int8).view(torch.uint8).reshape(n, kp // 16, 16)
    weight = order_chunks(chunks, u)
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
    """The cached a8gemv_v1 layout of qw (built on first use)."""
    return qw.layout(LAYOUT_NAME, build_a8gemv_v1)
