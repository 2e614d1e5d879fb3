"""The ``triton_gemm_v1_ks<KS>`` kernel layouts of a QuantizedWeight, read by mixgemm.kernels.triton_gemm.gemm.

Built once per weight from the plain interchange layout and cached with ``get_layout(qw, ks)``
(``qw.layout(layout_name(ks), ...)``).

* ``words``: int32 [Np, Kp * bits // 32], row-major (K contiguous per output channel). K is cut into
  *chunks* of E * KS consecutive k (E = 32 / bits codes per word; KS = 16, 32 or 64 words per chunk
  row is the layout parameter). Field f (bits f*bits .. f*bits + bits-1) of word j of chunk c holds
  the code of k = E * KS * c + f * KS + j.
  Why: one shift + mask of a [BN, KS] word tile yields the codes of KS *consecutive* k, a ready
  [BN, KS] register operand for one tensor-core dot against x[:, E*KS*c + f*KS : +KS]. Each thread
  loads exactly the words whose codes its own wgmma A-fragment needs (every nibble it unpacks is
  used; no register shuffles or shared-memory round trip), and a tile's loads are 16-byte vectors.
* Np = N rounded up to 256 (the largest BLOCK_N), Kp = K rounded up to 2 chunks (a BLOCK_K of 1 or 2
  chunks stays inside the rows and the group table): no masks on the weight side. Padded codes are 0;
  padded k meet zero activations (masked x loads), padded n are never stored.
* ``scales`` [Gp, Np] (scale dtype), ``zeros`` [Gp, Np] uint8 (mode "zero_point"), ``offsets`` [Gp, Np]
  (mode "offset"): the group parameters transposed so that one group's BN channels are one contiguous
  load. Gp = ceil(Kp / group_size) (padded groups have scale 0), or 1 for per-channel (one group over
  all of K, signalled by ``group_size`` = 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm.formats.weight import QuantizedWeight

LAYOUT_PREFIX = "triton_gemm_v1"
KS_CHOICES = (16, 32, 64)
N_ALIGN = 256  # the largest BLOCK_N a configuration may use
KCH_MAX = 2  # the largest BLOCK_K is 2 chunks


def layout_name(ks: int) -> str:
    return f"{LAYOUT_PREFIX}_ks{ks}"


def chunk_k(bits: int, ks: int) -> int:
    """k per chunk: E * KS."""
    return (32 // bits) * ks


@dataclass(frozen=True)
class TritonGemmLayout:
    words: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    offsets: torch.Tensor | None
    bits: int
    mode: str
    group_size: int  # 0 = one group over all of K (per-channel)
    ks: int
    n: int
    k: int
    np_: int
    kp: int

    @property
    def kw(self) -> int:
        """int32 words per row."""
        return self.kp * self.bits // 32


def _round_up(v: int, a: int) -> int:
    return -(-v // a) * a


def pack_words(codes: torch.Tensor, bits: int, ks: int) -> torch.Tensor:
    """uint8 codes [Np, Kp] (Kp a multiple of the chunk) -> int32 words [Np, Kp * bits // 32] (docstring)."""
    np_, kp = codes.shape
    e = 32 // bits
    chunk = e * ks
    c = codes.to(torch.int64).reshape(np_, kp // chunk, e, ks)
    shifts = (torch.arange(e, device=codes.device, dtype=torch.int64) * bits).reshape(1, 1, e, 1)
    w = (c << shifts).sum(dim=2)  # [Np, chunks, KS], in [0, 2**32)
    w = w - ((w >> 31) & 1) * (1 << 32)  # two's complement reinterpretation as int32
    return w.to(torch.int32).reshape(np_, kp * bits // 32).contiguous()


def build_triton_gemm_v1(qw: QuantizedWeight, ks: int = 16) -> TritonGemmLayout:
    """Build the layout with KS words per chunk row (on qw's device). qw's tensors are not modified."""
    if ks not in KS_CHOICES:
        raise ValueError(f"KS must be one of {KS_CHOICES}, got {ks}")
    n, k = qw.shape
    bits = qw.bits
    kp = _round_up(k, KCH_MAX * chunk_k(bits, ks))
    np_ = _round_up(n, N_ALIGN)
    codes = torch.zeros((np_, kp), dtype=torch.uint8, device=qw.device)
    codes[:n, :k] = qw.codes()
    words = pack_words(codes, bits, ks)
    per_channel = qw.num_groups == 1
    gs = 0 if per_channel else qw.group_size
    gp = 1 if per_channel else -(-kp // gs)
    g = qw.num_groups

    def transpose_pad(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        out = torch.zeros((gp, np_), dtype=t.dtype, device=t.device)
        out[:g, :n] = t.T
        return out

    return TritonGemmLayout(
        words=words,
        scales=transpose_pad(qw.scales),
        zeros=transpose_pad(qw.zeros) if qw.mode == "zero_point" else None,
        offsets=transpose_pad(qw.offsets) if qw.mode == "offset" else None,
        bits=bits,
        mode=qw.mode,
        group_size=gs,
        ks=ks,
        n=n,
        k=k,
        np_=np_,
        kp=kp,
    )


def get_layout(qw: QuantizedWeight, ks: int = 16) -> TritonGemmLayout:
    """The cached layout of qw with KS words per chunk row (built on first use)."""
    return qw.layout(layout_name(ks), lambda w: build_triton_gemm_v1(w, ks))
