"""Fused activation-quantizing GEMV on the int8 GEMM's layout (mixgemm.kernels.cuda_gemv_a8_wg.gemv_a8_wg, W4A8 /
W8A8 sym x sym, M <= 16), the decode kernel of a compacted int8-activation weight.

CPU: a Python emulation of the kernel's integer math on the wgmma_a8_v1 bytes (each lane's words, the x codes where
the prologue puts them, the int4 bytes as 16 c, the per-k-tile fold) equals the float64 reference; NVRTC compiles the
instantiations for sm_90 / sm_80; the tile rule and the registry's reasons.
GPU (@pytest.mark.gpu): the kernel against mixgemm.reference.block_int_gemm on fresh random data: int4 / int8, groups
128 / 256 / per channel, per-block and per-token activations, fp16 / bf16 / fp32, bias, relu6, odd N, K not a multiple
of 128 (per channel), M = 1..16, every tile option; a compacted layer's decode through it; PDL chains.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import mixgemm
from described_gpus import A100, H100
from mixgemm import QuantConfig
from mixgemm.formats.activation import quantize_activation
from mixgemm.formats.layouts_wgmma_a8 import build_wgmma_a8_v1
from mixgemm.formats.weight import quantize_weight
from mixgemm.kernels import int8_activations as a8_entries
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda_gemv_a8_wg import gemv_a8_wg as gw
from mixgemm.reference.block_gemm import block_int_gemm
from mixgemm.tuning import A8_GEMV_MAX_M, A8_WG_GEMV_BLOCK_SCALES_MAX_M, A8_WG_GEMV_MAX_M
from pdl_chain import assert_pdl_chain_matches  # tests/pdl_chain.py

needs_nvrtc = pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="cuda-bindings / libnvrtc not installed")
TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}
FORMATS = [(4, 128), (4, 256), (8, -1), (8, 128), (4, -1), (8, 256)]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rel(a, b) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm())


def _x_position(kp: int) -> torch.Tensor:
    """Where the prologue puts the code of k (WgPlace in gemv_a8_wg.cu): in k-tile k // 128, word (s, hi) of quad t's
    16 bytes, s = kk // 32, hi = kk // 16 % 2, t = kk // 4 % 4, byte k % 4."""
    k = torch.arange(kp)
    kk = k % 128
    s, hi, t = kk // 32, (kk // 16) % 2, (kk // 4) % 4
    return (k - kk) + ((s // 2) * 4 + t) * 16 + ((s % 2) * 2 + hi) * 4 + k % 4


def _emulate(lay, xq: torch.Tensor, sa: torch.Tensor) -> torch.Tensor:
    """The kernel's math in int64 / float64: per 16-row tile, k-tile and lane (g, t) the words it loads, the x words
    of quad t read from the prologue's shared codes, the dp4a sums (int4 bytes as 16 c), folded per k-tile with the
    activation block's scale and the two rows' params (per channel: summed over K first). xq int [M, K] codes, sa
    float [M, blocks]."""
    m, k = xq.shape
    kt = lay.k_padded // 128
    kp = kt * 128
    smem = torch.zeros(m, kp, dtype=torch.int64)
    smem[:, _x_position(kp)[:k]] = xq.to(torch.int64)
    xw = smem.reshape(m, kt, 2, 4, 4, 4)  # [M, KT, q, t, word, byte]
    pc = 2 if lay.bits == 4 else 4
    w = lay.weight.reshape(-1, kt, 8, pc, 32, 4, 4).to(torch.int64)  # [N128, KT, 8, piece, lane, word, byte]
    w = w.permute(0, 2, 1, 4, 3, 5, 6).reshape(-1, kt, 8, 4, pc, 4, 4)  # [tile, KT, g, t, piece, word, byte]
    if lay.bits == 4:
        lo = ((w << 4) & 0xF0) - (((w << 4) & 0x80) << 1)  # signed bytes 16 c
        hi = (w & 0xF0) - ((w & 0x80) << 1)
        # row g: lo(x), hi(x) of piece q's word 0 (step 2q), lo / hi of word 2 (2q + 1); row g + 8: words 1, 3
        a_g = torch.stack([lo[..., 0, :], hi[..., 0, :], lo[..., 2, :], hi[..., 2, :]], -2)  # [.., q, 4, byte]
        a_g8 = torch.stack([lo[..., 1, :], hi[..., 1, :], lo[..., 3, :], hi[..., 3, :]], -2)
    else:
        s = w - ((w & 0x80) << 1)
        p0, p1 = s[..., 0::2, :, :], s[..., 1::2, :, :]  # pieces 2q, 2q + 1
        a_g = torch.stack([p0[..., 0, :], p0[..., 2, :], p1[..., 0, :], p1[..., 2, :]], -2)
        a_g8 = torch.stack([p0[..., 1, :], p0[..., 3, :], p1[..., 1, :], p1[..., 3, :]], -2)
    # dot[M, tile, KT, g, t] per row half: sum over q, word, byte
    d_g = torch.einsum("akgtqwb,mkqtwb->matkg", a_g, xw).sum(2)
    d_g8 = torch.einsum("akgtqwb,mkqtwb->matkg", a_g8, xw).sum(2)
    dots = torch.stack([d_g, d_g8], -1)  # [M, tile, KT, g, h] (the 4 lanes of a quad summed)
    assert int(dots.abs().max()) < 4 * 2**22  # each lane's part < 2^22
    params = lay.params.double()  # [N128, Gw, 8, 16]
    ntile = dots.shape[1]
    if lay.per_channel:
        p = params[:, 0].reshape(ntile, 16)  # rows g + 8 h of tile
        tot = dots.sum(2).double()  # [M, tile, g, h]
        y = tot.reshape(m, ntile, 16 // 2, 2).permute(0, 1, 3, 2).reshape(m, ntile, 16) * p * sa[:, :1, None].double()
    else:
        gi = torch.arange(kt) * 128 // lay.group_size
        p = params.permute(0, 2, 1, 3).reshape(ntile, -1, 16)[:, gi]  # [tile, KT, 16]
        d = dots.double().permute(0, 1, 2, 4, 3).reshape(m, ntile, kt, 16)  # rows h * 8 + g
        blocks = sa.shape[1]
        sak = sa.double()[:, torch.clamp(torch.arange(kt) * 128 // (k // blocks if blocks > 1 else kp), max=blocks - 1)]
        y = (d * p[None] * sak[:, None, :, None]).sum(2)
    return y.reshape(m, -1)[:, : lay.n]


@pytest.mark.parametrize("bits,group", FORMATS)
@pytest.mark.parametrize("per_token", [False, True])
def test_emulation_matches_reference(bits, group, per_token):
    g = _gen(bits * 10 + group + per_token)
    n, k = 200, 768 if group != -1 else 336
    qw = quantize_weight(torch.randn(n, k, generator=g) * 0.02, bits=bits, group_size=group, mode="sym")
    x = torch.randn(3, k, generator=g) * torch.linspace(0.2, 2, k)
    a = quantize_activation(x, -1 if (per_token or group == -1) else group, "sym")
    lay = build_wgmma_a8_v1(qw)
    y = _emulate(lay, a.q, a.scales)
    ref = block_int_gemm(a, qw)
    assert _rel(y, ref) <= 1e-12


def test_choose_config_and_complete():
    cfg = gw.choose_config(1, 5120, 40, 132, per_token=True)
    assert cfg["RT"] == 2 and cfg["U"] == 1 and cfg["PF"] == 1 and cfg["KS"] == 16
    # int4 at M = 1 with per-token activation scales, the k-split at its cap and at most half the target's warps (N
    # 4096: 128 x 16 warps on 132 SMs): U 2 at the same KS (one step of two k-tiles per slice here); per-block scales,
    # int8 (RT 1: twice the warps) and M >= 2 keep U 1
    narrow = gw.choose_config(1, 4096, 32, 132, per_token=True)
    assert (narrow["U"], narrow["KS"]) == (2, 16)
    assert gw.choose_config(1, 4096, 112, 132, per_token=True)["U"] == 2
    assert gw.choose_config(1, 4096, 32, 132, bits=8, per_token=True)["U"] == 1
    assert gw.choose_config(2, 4096, 32, 132, per_token=True)["U"] == 1
    assert gw.choose_config(1, 14336, 32, 132, per_token=True)["U"] == 1  # KS 16 reaches the target
    assert gw.choose_config(1, 3584, 28, 132, per_token=True)["KS"] == 16  # 14 steps over 16 slices
    # slices of one k-tile (short K): U 2 with the split halved to a step per slice, no double buffering on one step
    short = gw.choose_config(1, 8192, 16, 132, per_token=True)
    assert (short["U"], short["KS"], short["PF"]) == (2, 8, 0)
    more = gw.choose_config(1, 8192, 24, 132, per_token=True)  # 12 steps over 8 slices: PF stays
    assert (more["U"], more["KS"], more["PF"]) == (2, 8, 1)
    assert gw.choose_config(2, 2048, 16, 132, per_token=True)["U"] == 2  # a small layer: two k-tiles in flight
    assert gw.choose_config(2, 2048, 16, 132, per_token=True)["PF"] == 1  # before the PDL wait
    # int4, per-block activation scales, M <= 2 (BLOCK_U2): U 2 without double buffering, the split nearest the
    # target (4096x14336: 448 row warps x 8 = 27 per SM, not x 16 = 54); int8, per-token scales and M 4 unchanged
    for mb in (1, 2):
        blk = gw.choose_config(mb, 14336, 32, 132)
        assert (blk["RT"], blk["U"], blk["KS"], blk["PF"]) == (2, 2, 8, 0)
        assert gw.choose_config(mb, 18944, 28, 132)["KS"] == 8  # 592 x 8 = 36 per SM: nearer than x 4
        assert blk["MMA"] == 0
    # ONE_STEP_RT4 (a narrow layer, one step of two k-tiles a slice) and only it does its math on the tensor cores
    one = gw.choose_config(2, 4096, 32, 132)
    assert (one["RT"], one["U"], one["KS"], one["PF"], one["MMA"]) == (4, 2, 16, 0, 1)
    assert gw.choose_config(1, 3584, 28, 132)["MMA"] == 1
    assert gw.choose_config(2, 3584, 28, 132)["MMA"] == 0  # 14 steps over 16 slices at M = 2: not one step each
    assert gw.choose_config(1, 4096, 32, 132, bits=8)["MMA"] == 0
    assert gw.complete_config({"RT": 2, "KS": 4})["MMA"] == 0
    with pytest.raises(ValueError, match="MMA 0 or 1"):
        gw.complete_config({"RT": 2, "KS": 4, "MMA": 2})
    # every rule tile's k-slice reduction fits the static shared memory (a forced one past it is refused by name)
    for mb, n, kt, bits, per_token in itertools.product((1, 2, 4, 8, 16), (256, 2500, 4096, 14336, 65536),
                                                        (2, 16, 32, 224), (4, 8), (False, True)):
        cfg = gw.choose_config(mb, n, kt, 132, bits, per_token)
        assert gw.reduction_bytes(mb, cfg) <= gw.STATIC_SMEM - 1024, (mb, n, kt, bits, per_token, cfg)
    assert gw.reduction_bytes(16, gw.complete_config({"RT": 4, "KS": 16, "RG": 1})) > gw.STATIC_SMEM - 1024
    # narrow layers (128 row warps x 16: under half the target) whose K makes 13-16 steps of two k-tiles at M = 1,
    # exactly 16 at M = 2 (ONE_STEP_RT4): four row tiles a warp, one step a slice at KS 16, no double buffering; 18 or
    # 12 steps, M = 2 with idle slices, per-token scales and int8 keep their rules
    for mb, kt in ((1, 26), (1, 28), (1, 32), (2, 31), (2, 32)):
        c = gw.choose_config(mb, 4096, kt, 132)
        assert (c["RT"], c["U"], c["KS"], c["RG"], c["PF"]) == (4, 2, 16, 1, 0), (mb, kt)
    assert gw.choose_config(1, 4096, 36, 132)["RT"] == gw.choose_config(1, 4096, 24, 132)["RT"] == 2
    m2 = gw.choose_config(2, 4096, 28, 132)
    assert (m2["RT"], m2["U"], m2["KS"], m2["PF"]) == (2, 1, 16, 1)
    assert gw.choose_config(1, 4096, 32, 132, per_token=True)["RT"] == 2
    # int8 with per-token scales at M <= 2 past the small layers: KS 16 wherever K has 16 k-tiles (INT8_FULL_SPLIT),
    # not the target's 4 / 8 on wide layers; M 4, per-block scales and K of 15 k-tiles keep the rule
    for mb, n, kt in ((1, 28672, 64), (2, 28672, 64), (2, 18944, 28), (1, 13824, 40)):
        assert gw.choose_config(mb, n, kt, 132, bits=8, per_token=True)["KS"] == 16, (mb, n, kt)
    assert gw.choose_config(4, 28672, 64, 132, bits=8, per_token=True)["KS"] < 16
    assert gw.choose_config(2, 28672, 64, 132, bits=8)["KS"] < 16
    assert gw.choose_config(2, 28672, 15, 132, bits=8, per_token=True)["KS"] < 16
    assert gw.choose_config(1, 4096, 32, 132, bits=8)["RT"] == 1
    assert gw.choose_config(1, 14336, 32, 132, per_token=True)["U"] == gw.choose_config(4, 14336, 32, 132)["U"] == 1
    w8 = gw.choose_config(1, 14336, 32, 132, bits=8)
    assert (w8["U"], w8["PF"]) == (1, 1)
    assert gw.choose_config(4, 2048, 16, 132)["U"] == 1
    assert cfg["KS"] * cfg["RG"] in (8, cfg["KS"]) and 2 * cfg["KS"] <= 32  # every slice keeps >= 2 k-tiles
    assert gw.choose_config(16, 4096, 32, 132)["RT"] == 1
    # 896 warps of row tiles: KS doubles to the first split at >= 32 warps per SM
    assert gw.choose_config(1, 28672, 64, 132, per_token=True)["KS"] == 8
    assert gw.choose_config(1, 28672, 64, 132)["KS"] == 4  # BLOCK_U2: 896 x 4 = 27 per SM is nearer 32 than x 8
    assert gw.choose_config(4, 256, 2, 132)["KS"] == 2  # two slices of one k-tile
    assert gw.choose_config(1, 256, 2, 132)["KS"] == 1  # one step of two k-tiles: nothing to split
    assert gw.choose_config(4, 2048, 16, 132)["KS"] == 16  # a small layer: every slice one k-tile
    assert gw.choose_config(1, 2048, 16, 132)["KS"] == 8  # one step of two
    assert gw.choose_config(1, 4096, 32, 132, bits=8)["RT"] == 1  # 64 bytes of weights per lane and step
    assert gw.complete_config({"RT": 2, "KS": 4}) == {"RT": 2, "KS": 4, "U": 1, "PF": 1, "OP": 1, "RG": 2, "MMA": 0}
    with pytest.raises(ValueError, match="RT must divide 8"):
        gw.complete_config({"RT": 3, "KS": 1})
    with pytest.raises(ValueError, match="RG x KS"):
        gw.complete_config({"RT": 1, "KS": 16, "RG": 2})


def _instantiations():
    """The dispatcher's instantiations: every (bits, group, per-token) at each M bucket's rule tile (the activation
    dtype cycling), every activation dtype once, and the tile options (RT, U, PF, KS 16, the tensor-core math at one
    and two 8-token columns)."""
    out = []
    fmts = [(bits, g, at) for bits, g, at in itertools.product((4, 8), (128, 256, 0), (0, 1)) if not (at and g == 0)]
    for i, ((bits, g, at), mb) in enumerate(itertools.product(fmts, (1, 2, 4, 8, 16))):
        cfg = gw.choose_config(mb, 2048 if i % 2 else 4096, 16 if i % 2 else 32, 132, bits)
        out.append({"A8_BITS": bits, "A8_XT": i % 3, "A8_M": mb, "A8_G": g, "A8_AT": at, "A8_RT": cfg["RT"],
                    "A8_U": cfg["U"], "A8_RG": cfg["RG"], "A8_KS": cfg["KS"], "A8_PF": 1,
                    "A8_OPC": 4 if at or g == 0 else 0, "A8_MMA": cfg["MMA"]})
    for rt, u, pf, ks, mma, mb, bits, g in ((1, 2, 0, 16, 0, 1, 4, 128), (4, 1, 1, 1, 0, 1, 4, 128),
                                            (8, 2, 1, 2, 0, 1, 4, 128), (1, 2, 1, 4, 1, 16, 8, 0),
                                            (2, 1, 0, 8, 1, 4, 4, 256), (4, 2, 0, 16, 1, 2, 4, 128)):
        out.append({"A8_BITS": bits, "A8_XT": 0, "A8_M": mb, "A8_G": g, "A8_AT": 0, "A8_RT": rt, "A8_U": u,
                    "A8_RG": 1 if ks == 16 else 8 // ks, "A8_KS": ks, "A8_PF": pf, "A8_OPC": 0, "A8_MMA": mma})
    return out


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_nvrtc_compiles_every_instantiation(arch):
    cases = _instantiations() if arch == "sm_90" else _instantiations()[::9]
    for d in cases:
        assert len(nvrtc.compile_cubin(gw.SOURCE, tuple(sorted(d.items())), arch)) > 0


def _explain(m, qw, dtype=torch.float16, device=H100, **kw):
    return mixgemm.explain(torch.empty(m, qw.in_features, dtype=dtype), qw, act_mode="sym", device=device, **kw)


def test_registry_reasons(monkeypatch):
    from mixgemm.formats.weight import compact_placeholder
    from mixgemm.ops.custom_ops import compact_weight

    monkeypatch.setattr(a8_entries, "nvrtc_ok", lambda: True)
    qw = quantize_weight(torch.randn(256, 1024, generator=_gen(1)), QuantConfig(bits=4, group_size=128))
    c = _explain(1, qw)  # a plain weight keeps its own fused GEMV up to its M, then this one (sm_90)
    assert c.kernel == "cuda_gemv_a8"
    for m in range(A8_GEMV_MAX_M + 1, A8_WG_GEMV_MAX_M + 1):
        assert _explain(m, qw, act_block="token").kernel == "cuda_gemv_a8_wg"
        assert "on sm_90 only" in dict(_explain(m, qw, device=A100).declined)["cuda_gemv_a8_wg"]
    c = _explain(A8_WG_GEMV_MAX_M + 1, qw, act_block="token")
    assert c.kernel == "cuda_wgmma_a8" and "above the fused GEMV's range" in dict(c.declined)["cuda_gemv_a8_wg"]
    cw = compact_weight(qw, compact_placeholder(qw.qweight), "wgmma_a8_v1")
    for m in range(1, A8_WG_GEMV_MAX_M + 1):
        c = _explain(m, cw, act_block="token")
        assert (c.kernel, c.layout) == ("cuda_gemv_a8_wg", "wgmma_a8_v1") and {"RT", "KS", "RG", "U"} <= set(c.config)
    c = _explain(A8_WG_GEMV_MAX_M + 1, cw, act_block="token")
    assert c.kernel == "cuda_wgmma_a8" and "above the fused GEMV's range" in dict(c.declined)["cuda_gemv_a8_wg"]
    # per-block activation scales over int4 codes: further in M (plain and compacted weights alike), on layers up to
    # the size measured against the GEMMs; then the CUDA int8 GEMM, or the Triton kernel where its CTAs fill their
    # waves poorly (plain weights)
    mb = A8_WG_GEMV_BLOCK_SCALES_MAX_M
    assert _explain(mb, qw, act_block="group").kernel == "cuda_gemv_a8_wg"
    assert _explain(mb, cw, act_block="group").kernel == "cuda_gemv_a8_wg"
    c = _explain(mb + 1, cw, act_block="group")
    assert c.kernel == "cuda_wgmma_a8" and "activation scales over int4 codes" in dict(c.declined)["cuda_gemv_a8_wg"]
    big = quantize_weight(torch.randn(16512, 4096, generator=_gen(6)), QuantConfig(bits=4, group_size=128))
    big_c = compact_weight(big, compact_placeholder(big.qweight), "wgmma_a8_v1")
    assert _explain(mb, big_c, act_block="group").kernel == "cuda_wgmma_a8"  # 65M weights
    assert _explain(mb, big, act_block="group").kernel == "cuda_wgmma_a8"  # 129 CTAs: 0.98 of a wave
    wide = quantize_weight(torch.randn(18944, 3584, generator=_gen(7)), QuantConfig(bits=4, group_size=128))
    c = _explain(mb, wide, act_block="group")  # 148 CTAs: 0.56 of two waves
    assert c.kernel == "triton_a8" and "filling 0.56 of their waves" in dict(c.declined)["cuda_wgmma_a8"]
    g32 = quantize_weight(torch.randn(64, 256, generator=_gen(2)), QuantConfig(bits=4, group_size=32))
    assert "wgmma_a8_v1 layout takes" in dict(_explain(3, g32).declined)["cuda_gemv_a8_wg"]
    big8 = quantize_weight(torch.randn(8192, 8200, generator=_gen(5)), QuantConfig(bits=8, group_size=-1))
    assert _explain(A8_GEMV_MAX_M, big8).kernel == "cuda_gemv_a8"
    c = _explain(A8_WG_GEMV_MAX_M, big8)
    assert c.kernel != "cuda_gemv_a8_wg" and "the int8 GEMM measured as fast" in dict(c.declined)["cuda_gemv_a8_wg"]
    long_k = quantize_weight(torch.randn(8, 16384, generator=_gen(3)), QuantConfig(bits=8, group_size=-1))
    assert "bytes of shared memory" in dict(_explain(16, long_k).declined)["cuda_gemv_a8_wg"]


def test_rejects_bad_input():
    qw = quantize_weight(torch.randn(16, 256, generator=_gen(4)), QuantConfig(bits=4, group_size=32))
    with pytest.raises(ValueError, match="2-D CUDA x"):
        gw.gemv_a8_wg(torch.randn(1, 256), qw, None, 0.0, 1.0, torch.float16)


# ----------------------------------------------------------------------------------------------- GPU


def _ref(x, qw, bias, lo, hi, per_token=False):
    a = quantize_activation(x.float().cpu(), -1 if per_token else qw.group_size, "sym")
    y = block_int_gemm(a, qw.to("cpu"))
    if bias is not None:
        y = y + bias.double().cpu()[None, :]
    return y.clamp(lo, hi)


def _cases():
    """Every (bits, group, per_token) with M 1..16, the dtypes, bias and clamp cycling through their values."""
    ms = (1, 3, 16, 2, 7, 9, 4, 13, 1, 16, 5, 2)
    dts = (torch.float16, torch.bfloat16, torch.float32)
    out = []
    for i, ((bits, group), per_token) in enumerate(itertools.product(FORMATS, (False, True))):
        if per_token and group == -1:
            continue
        out.append((bits, group, per_token, ms[i % len(ms)], dts[i % 3], dts[(i // 3) % 3], i % 2 == 0, i % 4 == 1))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("bits,group,per_token,m,xdt,odt,use_bias,relu6", _cases())
def test_gemv_a8_wg_matches_reference(bits, group, per_token, m, xdt, odt, use_bias, relu6):
    from mixgemm.epilogue import clamp_bounds

    g = _gen(bits * 1000 + (group + 1) * 7 + m * 3 + per_token)
    n = 203
    k = 768 if group != -1 else 1040  # per channel: K not a multiple of 128 (the layout's zero padding)
    qw = quantize_weight((torch.randn(n, k, generator=g) * 0.02).cuda(), bits=bits, group_size=group, mode="sym")
    x = torch.randn(m, k, generator=g).to(xdt).cuda()
    x0 = x.clone()
    bias = (torch.randn(n, generator=g) * 0.5).to(xdt).cuda() if use_bias else None
    lo, hi = clamp_bounds("relu6" if relu6 else None)
    y = gw.gemv_a8_wg(x, qw, bias, lo, hi, odt, per_token=per_token)
    assert torch.equal(x, x0)
    ref = _ref(x, qw, bias, lo, hi, per_token)
    assert y.shape == (m, n) and y.dtype == odt
    assert _rel(y, ref) <= TOL[odt], (_rel(y, ref), bits, group, m)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [dict(RT=1, KS=1, PF=0), dict(RT=2, KS=2, PF=1), dict(RT=4, KS=2, U=2, PF=1),
                                 dict(RT=2, KS=16, RG=1, PF=1), dict(RT=1, KS=4, U=2, PF=0), dict(RT=8, KS=1, RG=2),
                                 dict(RT=2, KS=4, PF=1, OP=0), dict(RT=2, KS=2, PF=1, GRID="tiles"),
                                 dict(RT=4, KS=16, RG=1, U=2, PF=0)])
@pytest.mark.parametrize("bits,group", [(4, 128), (8, -1), (4, 256)])
def test_gemv_a8_wg_configs(cfg, bits, group):
    """Every tile option (RT up to 8 tiles, U 2 with an odd k-tile count, KS 16 with empty slices, the persistent grid
    looping over many tiles and one block per tile) at M = 1 and 5 on a layer of 2500 x 4224 (33 k-tiles)."""
    g = _gen(bits + group)
    n, k = 2500, 4224 if group != 256 else 4352
    qw = quantize_weight((torch.randn(n, k, generator=g) * 0.02).cuda(), bits=bits, group_size=group, mode="sym")
    for m, per_token in ((1, group != -1), (5, False)):
        x = torch.randn(m, k, generator=g).half().cuda()
        y = gw.gemv_a8_wg(x, qw, None, float("-inf"), float("inf"), torch.float32, per_token=per_token, config=cfg)
        assert _rel(y, _ref(x, qw, None, float("-inf"), float("inf"), per_token)) <= 1e-5, (m, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [dict(RT=4, KS=16, RG=1, U=2, PF=0), dict(RT=2, KS=4, U=1, PF=1),
                                 dict(RT=1, KS=2, RG=4, U=2, PF=1), dict(RT=8, KS=1, RG=2, U=1, PF=0)])
@pytest.mark.parametrize("bits,group,per_token", [(4, 128, False), (4, 256, True), (8, -1, False), (8, 128, False)])
def test_gemv_a8_wg_mma(cfg, bits, group, per_token):
    """The tensor-core math (A8_MMA 1: one accumulator chain at RT 4, two at RT 2, four at RT 1) against the reference
    at M = 1..16 (one and two 8-token mma columns, tokens past M), bf16 and fp16 x, on 2500 x 4224 (33 k-tiles, a
    partial row group)."""
    g = _gen(bits + group + 7 * per_token + cfg["RT"])
    n, k = 2500, 4224 if group != 256 else 4352
    qw = quantize_weight((torch.randn(n, k, generator=g) * 0.02).cuda(), bits=bits, group_size=group, mode="sym")
    inf = float("inf")
    for i, m in enumerate((1, 2, 3, 8, 9, 16)):
        if gw.reduction_bytes(gw.m_bucket(m), gw.complete_config(cfg)) > gw.STATIC_SMEM - 1024:
            with pytest.raises(ValueError, match="static shared memory"):  # RT 4 x KS 16 at M 9..16
                gw.gemv_a8_wg(torch.randn(m, k, device="cuda"), qw, None, -inf, inf, torch.float32, config=cfg)
            continue
        x = torch.randn(m, k, generator=g).to(torch.bfloat16 if i % 2 else torch.float16).cuda()
        y = gw.gemv_a8_wg(x, qw, None, -inf, inf, torch.float32, per_token=per_token, config={**cfg, "MMA": 1})
        assert _rel(y, _ref(x, qw, None, -inf, inf, per_token)) <= 1e-5, (m, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("bits,group,k,n,m", [(4, 128, 8192, 1000, 1), (8, -1, 28672, 999, 1), (4, 128, 4096, 4096, 16),
                                              (8, 256, 4096, 3000, 2), (4, -1, 14336, 4096, 1), (4, 128, 3584, 4096, 1),
                                              (4, 128, 4096, 3584, 2)])
def test_gemv_a8_wg_large(bits, group, k, n, m):
    """Whole layers at the rule's tile (3584 x 4096 at M = 1: ONE_STEP_RT4, four row tiles a warp, one step a slice)."""
    g = _gen(k + n + m)
    qw = quantize_weight((torch.randn(n, k, generator=g) * 0.02).cuda(), bits=bits, group_size=group, mode="sym")
    x = torch.randn(m, k, generator=g).half().cuda()
    y = gw.gemv_a8_wg(x, qw, None, float("-inf"), float("inf"), torch.float32)
    assert _rel(y, _ref(x, qw, None, float("-inf"), float("inf"))) <= 1e-5


@pytest.mark.gpu
def test_gemv_a8_wg_pdl_chain():
    g = _gen(31)
    qa = quantize_weight((torch.randn(2048, 2048, generator=g) * 0.02).cuda(), bits=4, group_size=128)
    qb = quantize_weight((torch.randn(2048, 2048, generator=g) * 0.02).cuda(), bits=8, group_size=-1)
    x0 = torch.randn(1, 2048, generator=g).half().cuda()
    inf = float("inf")

    def chain(x):
        for _ in range(4):
            x = gw.gemv_a8_wg(x, qa, None, -inf, inf, torch.float16, per_token=True)
            x = gw.gemv_a8_wg(x * 0.05, qb, None, -inf, inf, torch.float16)
            x = torch.tanh(x)
        return x

    assert_pdl_chain_matches(chain, x0)


@pytest.mark.gpu
@pytest.mark.parametrize("bits,group,act_block", [(4, 128, "group"), (8, -1, "group"), (4, 128, "token")])
def test_every_a8_entry_on_one_weight(bits, group, act_block):
    """One weight object through every int8-activation entry (each forced), then through each again after all of them
    built their layouts on it: every result against the float64 reference, the plain tensors unchanged."""
    from mixgemm.kernels.registry import entries, kernel_options
    from mixgemm.ops.int8 import matmul_a8

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the int8 wgmma GEMM needs sm_90")
    g = _gen(bits + group + len(act_block))
    n, k = 515, 1024
    qw = quantize_weight((torch.randn(n, k, generator=g) * 0.02).cuda(), bits=bits, group_size=group, mode="sym")
    before = [t.clone() for t in (qw.qweight, qw.scales)]
    per_token = act_block == "token" or group == -1
    x = torch.randn(3, k, generator=g).half().cuda()
    ref = _ref(x, qw, None, float("-inf"), float("inf"), per_token)
    names = [e.name for e in entries("linear_a8")]

    def run_all():
        for name in names:
            with kernel_options(force=name):
                assert mixgemm.explain(x, qw, act_mode="sym", act_block=act_block).kernel == name
                y = matmul_a8(x, qw, "sym", act_block=act_block)
            assert _rel(y, ref) <= TOL[torch.float16], name

    run_all()
    assert {"a8gemv_v2", "wgmma_a8_v1", "int8_v1"} <= set(qw._layouts)
    run_all()
    assert all(torch.equal(a, b) for a, b in zip(before, (qw.qweight, qw.scales), strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 8])
def test_gemv_a8_wg_unaligned_x_odd_k_and_out_buffer(bits):
    """Rows that are not 16-byte aligned (the launch copies them; the caller's x is untouched), K not a multiple of 8
    (the prologue's scalar tail), a given output buffer, fp32 x."""
    g = _gen(40 + bits)
    n, k = 77, 1002
    qw = quantize_weight((torch.randn(n, k, generator=g) * 0.02).cuda(), bits=bits, group_size=-1, mode="sym")
    xb = torch.randn(2, k + 1, generator=g).cuda()
    x = xb[:, 1:]
    x0 = x.clone()
    out = torch.empty(2, n, dtype=torch.float32, device="cuda")
    y = gw.gemv_a8_wg(x, qw, None, float("-inf"), float("inf"), torch.float32, out=out)
    assert y.data_ptr() == out.data_ptr() and torch.equal(x, x0)
    assert _rel(y, _ref(x, qw, None, float("-inf"), float("inf"))) <= 1e-5
