"""Fused activation-quantized GEMV (mixgemm.kernels.cuda_gemv_a8.gemv_a8, W4A8 / W8A8, M <= 16).

CPU: the a8gemv_v2 layout is the weight's own buffer (a padded copy where K is no whole number of chunks), a Python
emulation of the kernel's unit-wise integer math (the lanes' chunk order, the int4 even / odd nibble split, the
-8 / -128 sum(xq) bias correction, the per-group offset terms) equals the float64 reference, and NVRTC
compiles every instantiation for sm_80 / sm_90.
GPU (@pytest.mark.gpu): the kernel against mixgemm.reference.block_int_gemm on fresh random data (every
group size and per-channel, int4 / int8, every weight mode, sym / asym activations, fp16 / bf16 / fp32,
bias, relu6, odd N and K, M = 1..16), and an identity-weight test that checks the activation codes exactly.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import mixgemm
from mixgemm import tuning
from mixgemm.formats.activation import quantize_activation
from mixgemm.formats.packing import unpack_codes
from mixgemm.formats.weight import quantize_weight
from mixgemm.kernels.cuda import act_quant_rows as aq
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda_gemv_a8 import gemv_a8 as ga
from mixgemm.kernels.cuda_gemv_a8.layout import CHUNK_K, build_a8gemv_v2, get_a8gemv_layout, pick_u
from mixgemm.kernels.registry import NoKernel
from mixgemm.reference.block_gemm import block_int_gemm
from mixgemm.tuning import A8_GEMV_MAX_M, gemv_m1
from pdl_chain import assert_pdl_chain_matches  # tests/pdl_chain.py

needs_nvrtc = pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="cuda-bindings / libnvrtc not installed")
GROUPS = (32, 64, 128, 256, -1)
TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rel(a, b) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm())


def _codes(lay):
    """Kernel weight bytes -> unsigned codes int64 [N, Kp] in K order (Kp: the kernel's step padding, code 0 there;
    those k meet zero activation codes). Grouped layouts hold their chunks in the unit order: undone here."""
    w = lay.weight
    if not lay.per_channel:
        s = lay.kw // (32 * lay.u)
        w = w.reshape(lay.n, s, lay.u, 32, 16).permute(0, 1, 3, 2, 4).reshape(lay.n, lay.kw * 16)
    q = unpack_codes(w, lay.bits, lay.kw * CHUNK_K[lay.bits]).to(torch.int64)
    out = torch.zeros(lay.n, lay.kp, dtype=torch.int64)
    out[:, : q.shape[1]] = q
    return out


def _emulate(lay, a, x_codes_padded):
    """The kernel's math in float64 / int64 on the layout's bytes: per chunk the dp4a sums over the unsigned codes
    (int4: 16 x the even-k nibbles' sum + the odd-k nibbles read in place, i.e. times 16), per fold (per-channel: the
    U chunks (s*U + u)*32 + l of lane l at step s; grouped: the U chunks (s*32 + l)*U + u) their sum minus 128 x the
    unit's activation code sum, times sA * sdot of the unit's group; plus the per-group offset terms."""
    n, kp = lay.n, lay.kp
    m = x_codes_padded.shape[0]
    ch = CHUNK_K[lay.bits]
    nc, u = kp // ch, lay.u
    g = lay.group_size
    q = _codes(lay)  # [N, Kp]
    xq = x_codes_padded.to(torch.int64)  # [M, Kp]
    if lay.bits == 4:
        byte = q[:, 0::2] | (q[:, 1::2] << 4)  # the plain bytes: k = 2b low nibble, 2b + 1 high nibble
        even, odd16 = byte & 0x0F, byte & 0xF0
        ie = torch.einsum("ncj,mcj->mnc", even.reshape(n, nc, ch // 2), xq[:, 0::2].reshape(m, nc, ch // 2))
        io = torch.einsum("ncj,mcj->mnc", odd16.reshape(n, nc, ch // 2), xq[:, 1::2].reshape(m, nc, ch // 2))
        dot = ie * 16 + io  # [M, N, NC] = 16 sum(q xq) per chunk
    else:
        dot = torch.einsum("ncj,mcj->mnc", q.reshape(n, nc, ch), xq.reshape(m, nc, ch))
    xs = xq.reshape(m, nc, ch).sum(-1)  # [M, NC]
    # unit (s, l): chunks (s*U + u)*32 + l per channel, (s*32 + l)*U + u grouped (u < U)
    nu = nc // u
    if lay.per_channel:
        unit_of = ((torch.arange(nc) // 32) // u) * 32 + torch.arange(nc) % 32
        first_chunk = (torch.arange(nu) // 32) * 32 * u + torch.arange(nu) % 32
    else:
        unit_of, first_chunk = torch.arange(nc) // u, torch.arange(nu) * u
    t = torch.zeros(m, n, nu, dtype=torch.int64).index_add_(2, unit_of, dot)
    corr = torch.zeros(m, nu, dtype=torch.int64).index_add_(1, unit_of, xs)
    t = t - 128 * corr[:, None, :]
    assert int(t.abs().max()) < 2**22  # the kernel's magic int -> float conversion range
    grp = torch.zeros(nu, dtype=torch.int64) if lay.per_channel else first_chunk * ch // g
    gr = 1 if lay.per_channel else lay.k // g
    sa = torch.zeros(m, lay.gp, dtype=torch.float64)
    sa[:, :gr] = a.scales.double()
    oa = torch.zeros_like(sa)
    oa[:, :gr] = a.offsets.double()
    sums = torch.zeros_like(sa)
    sums[:, :gr] = a.sums.double()
    y = (t.double() * sa[:, grp][:, None, :] * lay.sdot.double()[:, grp][None]).sum(-1)
    mo = lay.moff.double() if lay.moff is not None else torch.zeros(n, lay.gp, dtype=torch.float64)
    y = y + (sa * sums) @ mo.T + oa @ lay.cterm.double().T
    return y


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("mode", ["sym", "zero_point", "offset"])
@pytest.mark.parametrize("group", GROUPS)
def test_layout_codes_and_emulation(bits, mode, group):
    k = 1024 if group != -1 else (334 if bits == 4 else 333)
    n = 13
    w = torch.randn(n, k, generator=_gen(group + bits)) * 0.02
    qw = quantize_weight(w, bits=bits, group_size=group, mode=mode)
    before = qw.qweight.clone()
    lay = build_a8gemv_v2(qw)
    assert torch.equal(qw.qweight, before)
    ch = CHUNK_K[bits]
    # per channel the weight's own buffer (a copy padded to a whole chunk where K is not one); grouped a copy in the
    # unit order, padded to Kp
    assert (lay.weight is qw.qweight) == (k % ch == 0 and group == -1)
    assert lay.kw == (-(-k // ch) if group == -1 else lay.kp // ch) and lay.weight.is_contiguous()
    q = _codes(lay)
    assert torch.equal(q[:, :k], qw.codes().to(torch.int64))
    assert torch.equal(q[:, k : lay.kw * ch], torch.full_like(q[:, k : lay.kw * ch], qw.config.sym_bias))
    assert lay.kp % (32 * lay.u * ch) == 0
    for act in ("sym", "asym"):
        x = torch.randn(3, k, generator=_gen(7))
        a = quantize_activation(x, qw.group_size, act)
        xp = torch.zeros(3, lay.kp, dtype=torch.int8)
        xp[:, :k] = a.q
        ref = block_int_gemm(a, qw)
        assert _rel(_emulate(lay, a, xp), ref) < 1e-6


def test_pick_u():
    assert pick_u(4, 8192, 128, False) == 4
    assert pick_u(4, 28672, 128, False) == 4
    assert pick_u(8, 8192, -1, True) == 4
    assert pick_u(4, 1024, 32, False) == 1
    assert pick_u(4, 4224, 128, False) < 4  # a 4096-k step would nearly double the row


def _instantiations(full: bool = True):
    """The gemv_a8.cu instantiations the dispatcher can build (M buckets up to tuning.A8_GEMV_MAX_M): every
    (bits, group, M bucket, activation dtype) at the default U and KS = 1, U = 1 (short K), the KS splits
    of choose_config, and the tuned configs. full=False: fp16 activations only (the sm_80 check)."""
    out = []
    mbs = [mb for mb in (1, 2, 4, 8, 16) if mb <= A8_GEMV_MAX_M]
    for bits, g, mb, xt in itertools.product((4, 8), (32, 64, 128, 256, 0), mbs, (0, 1, 2) if full else (0,)):
        umax = 4 if g == 0 else max(1, min(4, g // CHUNK_K[bits]))
        for u in sorted({umax, 1}):
            if xt != 0 and u != umax:
                continue
            cfg = {"R": ga.ROWS_PER_WARP[mb], "KS": 1, "RG": 8, "PF": 0}
            out.append({"A8_BITS": bits, "A8_XT": xt, "A8_M": mb, "A8_G": g, "A8_U": u, "A8_R": cfg["R"],
                        "A8_RG": 8, "A8_KS": 1, "A8_PF": 0})
    for bits, ks, mb in itertools.product((4, 8), (2, 4, 8), mbs):
        out.append({"A8_BITS": bits, "A8_XT": 0, "A8_M": mb, "A8_G": 128 if bits == 4 else 0, "A8_U": 4,
                    "A8_R": ga.ROWS_PER_WARP[mb], "A8_RG": 8 // ks, "A8_KS": ks, "A8_PF": 0})
    tuned = [(bits, e.value) for bits, entries in gemv_m1.A8_M1.items() for e in entries]
    for (bits, cfg), xt in itertools.product(tuned, (0, 1, 2) if full else (0,)):
        for g in (32, 64, 128, 256, 0):  # the tuned entries are keyed by bucket, so any group can meet them
            u = 4 if g == 0 else max(1, min(4, g // CHUNK_K[bits]))
            out.append({"A8_BITS": bits, "A8_XT": xt, "A8_M": 1, "A8_G": g, "A8_U": u, "A8_R": cfg["R"],
                        "A8_RG": cfg["NW"] // cfg["KS"], "A8_KS": cfg["KS"], "A8_PF": cfg["PF"]})
    # per-token activation scales over grouped weights (act_block "token")
    for bits, g, mb, xt in itertools.product((4, 8), (32, 128, 256), mbs, (0, 1, 2) if full else (0,)):
        u = max(1, min(4, g // CHUNK_K[bits]))
        out.append({"A8_BITS": bits, "A8_XT": xt, "A8_M": mb, "A8_G": g, "A8_U": u, "A8_R": ga.ROWS_PER_WARP[mb],
                    "A8_RG": 8, "A8_KS": 1, "A8_PF": 0, "A8_AT": 1})
    # the one-pass row prologue (per-channel weights, per-token activations)
    for bits, g, opc, xt in itertools.product((4, 8), (128, 0), (1, 4, 8), (0, 1, 2) if full else (0,)):
        if opc * (2 if xt == 2 else 1) > ga.OPC_MAX:
            continue
        out.append({"A8_BITS": bits, "A8_XT": xt, "A8_M": 1, "A8_G": g, "A8_U": 4, "A8_R": 2, "A8_RG": 16,
                    "A8_KS": 1, "A8_PF": int(opc != 4), "A8_AT": int(g > 0), "A8_OPC": opc})
    return out


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_nvrtc_compiles_every_instantiation(arch):
    for d in _instantiations(full=arch == "sm_90"):
        assert len(nvrtc.compile_cubin(ga.SOURCE, tuple(sorted(d.items())), arch)) > 0


def test_choose_config():
    assert ga.choose_config(1, 28672, 2, 132) == {"R": 4, "KS": 1, "RG": 8, "NW": 8, "PF": 0}
    cfg = ga.choose_config(1, 8192, 7, 132)
    assert cfg["KS"] * cfg["RG"] == 8 and cfg["KS"] >= 2
    assert ga.choose_config(16, 64, 1, 132)["KS"] == 1  # one step: nothing to split
    assert ga.choose_config(1, 8192, 7, 132, 4, 28672) == {"R": 4, "KS": 1, "NW": 16, "PF": 0, "RG": 16}  # tuned


def test_one_pass_chunks():
    """A8_OPC: the row's 8-k chunks per thread when they fit in OPC_MAX registers' worth, row-wide blocks only."""
    g = _gen(4)
    lay = get_a8gemv_layout(quantize_weight(torch.randn(40, 28672, generator=g), bits=4, group_size=128))
    assert ga.one_pass_chunks(lay, 0, 512, True) == 7  # 3584 chunks over 512 threads
    assert ga.one_pass_chunks(lay, 0, 256, True) == 0  # 14 > OPC_MAX: two passes
    assert ga.one_pass_chunks(lay, 2, 512, True) == 0  # fp32 x: 2 x 16 bytes per chunk
    assert ga.one_pass_chunks(lay, 0, 512, False) == 0  # per-group activations: blocks are not rows
    odd = get_a8gemv_layout(quantize_weight(torch.randn(40, 333, generator=g), bits=8, group_size=-1))
    assert ga.one_pass_chunks(odd, 0, 256, True) == 0  # K % 8 != 0: the scalar tail needs the two-pass loads
    cfg = ga.choose_config(1, 8192, 7, 132, 4, 28672)  # 16 warps
    assert ga.defines_for(lay, 0, 1, cfg, per_token=True)["A8_OPC"] == 7
    assert ga.defines_for(lay, 0, 1, dict(cfg, OP=0), per_token=True)["A8_OPC"] == 0


# ----------------------------------------------------------------------------------------------- GPU


def _ref(x, qw, act, bias, lo, hi, per_token=False):
    a = quantize_activation(x.float().cpu(), -1 if per_token else qw.group_size, act)
    y = block_int_gemm(a, qw.to("cpu"))
    if bias is not None:
        y = y + bias.double().cpu()[None, :]
    return y.clamp(lo, hi)


def _cases():
    """A covering sample of the format space (not the full product): every (bits, group, act) triple,
    with M, weight mode, dtypes, bias and clamp cycling through their values."""
    ms = (1, 3, 16, 2, 7, 9, 4, 13, 1, 16)
    modes = ("sym", "zero_point", "offset")
    dts = (torch.float16, torch.bfloat16, torch.float32)
    out = []
    for i, (bits, group, act) in enumerate(itertools.product((4, 8), GROUPS, ("sym", "asym"))):
        out.append((bits, group, act, ms[i % len(ms)], modes[i % 3], dts[(i // 3) % 3], dts[(i // 2) % 3],
                    i % 2 == 0, i % 4 in (1, 2)))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("bits,group,act,m,mode,xdt,odt,use_bias,relu6", _cases())
def test_gemv_a8_matches_reference(bits, group, act, m, mode, xdt, odt, use_bias, relu6):
    from mixgemm.epilogue import clamp_bounds

    g = _gen(bits * 1000 + (group + 1) * 7 + m * 3 + (act == "asym"))
    n = 203
    k = 768 if group != -1 else (334 if bits == 4 else 333)
    w = (torch.randn(n, k, generator=g) * 0.02).cuda()
    qw = quantize_weight(w, bits=bits, group_size=group, mode=mode)
    x = torch.randn(m, k, generator=g).to(xdt).cuda()
    x0 = x.clone()
    bias = (torch.randn(n, generator=g) * 0.5).to(xdt).cuda() if use_bias else None
    lo, hi = clamp_bounds("relu6" if relu6 else None)
    # the dispatcher sends M <= A8_GEMV_MAX_M here (the kernel itself takes M <= 16)
    try:
        chosen = mixgemm.explain(x, qw, act_mode=act).kernel
    except NoKernel:  # no kernel takes the layer (e.g. 4-bit with K % 64 != 0 above the GEMV's M): the reference runs
        chosen = None
    assert (chosen == "cuda_gemv_a8") == (m <= A8_GEMV_MAX_M)
    y = ga.gemv_a8(x, qw, act, bias, lo, hi, odt)
    assert torch.equal(x, x0)
    ref = _ref(x, qw, act, bias, lo, hi)
    assert y.shape == (m, n) and y.dtype == odt
    assert _rel(y, ref) <= TOL[odt], (_rel(y, ref), bits, group, act, m, mode)


@pytest.mark.gpu
@pytest.mark.parametrize("bits,group,k,n,m", [(4, 128, 8192, 1000, 1), (4, 128, 4096, 4096, 16), (8, -1, 8192, 999, 1),
                                              (8, -1, 4096, 3000, 8), (4, 32, 4096, 517, 3), (8, 256, 2048, 4097, 5)])
@pytest.mark.parametrize("act", ["sym", "asym"])
def test_gemv_a8_large(bits, group, k, n, m, act):
    """Decode-sized K (full steps, U = 4, KS > 1 splits) against the reference."""
    g = _gen(k + n + m)
    w = (torch.randn(n, k, generator=g) * 0.02).cuda()
    qw = quantize_weight(w, bits=bits, group_size=group, mode="zero_point" if act == "asym" else "sym")
    x = torch.randn(m, k, generator=g).half().cuda()
    y = ga.gemv_a8(x, qw, act, None, float("-inf"), float("inf"), torch.float32)
    assert _rel(y, _ref(x, qw, act, None, float("-inf"), float("inf"))) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [dict(R=4, KS=1, NW=8, PF=0), dict(R=2, KS=1, NW=8, PF=1),
                                 dict(R=1, KS=2, NW=8, PF=1), dict(R=4, KS=1, NW=8, PF=1),
                                 dict(R=2, KS=2, NW=16, PF=1), dict(R=4, KS=1, NW=16, PF=0),
                                 dict(R=2, KS=4, NW=8, PF=0), dict(R=4, KS=1, NW=16, PF=0, OP=0)])
@pytest.mark.parametrize("grid", [None, "tiles", 1])
@pytest.mark.parametrize("bits,group", [(4, 128), (8, -1)])
def test_gemv_a8_configs(cfg, grid, bits, group):
    """Every tile config / grid the benchmark sweeps (PF double buffering across steps and tiles, 16-warp
    blocks, a persistent grid of one block per SM looping over many tiles) against the reference."""
    g = _gen(bits + 17)
    n, k = 2500, 8192
    w = (torch.randn(n, k, generator=g) * 0.02).cuda()
    qw = quantize_weight(w, bits=bits, group_size=group, mode="offset" if bits == 8 else "sym")
    for m, act in ((1, "sym"), (3, "asym")):
        x = torch.randn(m, k, generator=g).half().cuda()
        y = ga.gemv_a8(x, qw, act, None, float("-inf"), float("inf"), torch.float32, config=dict(cfg, GRID=grid))
        assert _rel(y, _ref(x, qw, act, None, float("-inf"), float("inf"))) <= 1e-5, (m, act)


@pytest.mark.gpu
@pytest.mark.parametrize("group", [32, 128, 256, -1])
@pytest.mark.parametrize("act", ["sym", "asym"])
@pytest.mark.parametrize("xdt", [torch.float16, torch.bfloat16, torch.float32])
def test_gemv_a8_codes_exact(group, act, xdt):
    """W = identity (int8, exact codes 127 on the diagonal): y[m, n] = (xq sA + oA)[m, n] * w, so one
    activation code off by one would move an output by >= 1/255 of its value; fp32 output must match the
    float64 reference per element (1e-5 relative + 1e-6 of the row's largest output)."""
    k = 1024 if group != -1 else 1000
    g = _gen(group + 5)
    x = (torch.randn(5, k, generator=g) * torch.rand(5, 1, generator=g) * 3).to(xdt).cuda()
    qw = quantize_weight(torch.eye(k).cuda(), bits=8, group_size=group, mode="sym", scale_dtype=torch.float32)
    y = ga.gemv_a8(x, qw, act, None, float("-inf"), float("inf"), torch.float32).double().cpu()
    ref = _ref(x, qw, act, None, float("-inf"), float("inf"))
    tol = 1e-5 * ref.abs() + 1e-6 * ref.abs().amax(1, keepdim=True)  # per-row: asym terms may cancel
    assert bool(((y - ref).abs() <= tol).all()), float((y - ref).abs().max())


@pytest.mark.gpu
@pytest.mark.parametrize("bits,group,mode", [(4, 128, "sym"), (4, 32, "zero_point"), (8, 256, "offset"),
                                             (4, 256, "sym"), (8, 64, "sym")])
@pytest.mark.parametrize("act", ["sym", "asym"])
@pytest.mark.parametrize("m", [1, 2, 5])
def test_gemv_a8_per_token(bits, group, mode, act, m):
    """act_block "token": one activation scale per token over grouped weights (A8_AT), every dtype."""
    g = _gen(bits * 31 + group + m + (act == "asym"))
    n, k = 517, 2048
    qw = quantize_weight((torch.randn(n, k, generator=g) * 0.02).cuda(), bits=bits, group_size=group, mode=mode)
    for xdt, odt in ((torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)):
        x = (torch.randn(m, k, generator=g) * torch.linspace(0.1, 3, k)).to(xdt).cuda()
        y = ga.gemv_a8(x, qw, act, None, float("-inf"), float("inf"), odt, per_token=True)
        ref = _ref(x, qw, act, None, float("-inf"), float("inf"), per_token=True)
        assert _rel(y, ref) <= TOL[odt], (_rel(y, ref), xdt)
    # fp32 output: equal to the reference up to float32 rounding (one code off would show)
    y = ga.gemv_a8(x, qw, act, None, float("-inf"), float("inf"), torch.float32, per_token=True)
    assert _rel(y, ref) <= 1e-5
    # and different from the per-group quantization of the same x (the flag is not ignored)
    assert _rel(y, _ref(x, qw, act, None, float("-inf"), float("inf"))) > 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("bits,group,k", [(4, 128, 28672), (4, 128, 8192), (8, -1, 28672), (4, 256, 4608),
                                          (8, -1, 8200)])
@pytest.mark.parametrize("act", ["sym", "asym"])
@pytest.mark.parametrize("xdt", [torch.float16, torch.bfloat16, torch.float32])
def test_gemv_a8_one_pass_prologue(bits, group, k, act, xdt):
    """Row-wide activation blocks (per-token over groups, per-channel weights): the one-pass prologue (OP 1, x held
    in registers) gives the same bits as the two-pass one (OP 0) and matches the reference, on 8- and 16-warp blocks
    and with KS 2 (fp32 x at K = 28672 and 8-warp blocks at K = 28672 fall back to two passes)."""
    g = _gen(bits + group + k + len(act))
    n, m = 1031, 1
    qw = quantize_weight((torch.randn(n, k, generator=g) * 0.02).cuda(), bits=bits, group_size=group,
                         mode="zero_point" if act == "asym" else "sym")
    x = (torch.randn(m, k, generator=g) * torch.linspace(0.1, 3, k)).to(xdt).cuda()
    per_token = group != -1
    ref = _ref(x, qw, act, None, float("-inf"), float("inf"), per_token=per_token)
    outs = []
    for cfg in (dict(R=2, KS=1, NW=16, PF=1, OP=0), dict(R=2, KS=1, NW=16, PF=1, OP=1),
                dict(R=4, KS=1, NW=16, PF=0, OP=1), dict(R=2, KS=1, NW=8, PF=0, OP=1),
                dict(R=4, KS=2, NW=8, PF=0, OP=1)):
        y = ga.gemv_a8(x, qw, act, None, float("-inf"), float("inf"), torch.float32, per_token=per_token,
                       config=cfg)
        assert _rel(y, ref) <= 1e-5, cfg
        outs.append(y)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.mark.gpu
@pytest.mark.parametrize("pf", [0, 1])
def test_gemv_a8_pdl_dependent_chain(pf):
    """Programmatic dependent launch: each GEMV reads the output of the kernel right before it (another GEMV, or a
    torch elementwise op), eagerly and replayed from a CUDA graph; equal bit for bit to the PDL-off run, so no GEMV
    quantized its x before the producer had finished."""
    g = _gen(31)
    qa = quantize_weight((torch.randn(2048, 2048, generator=g) * 0.02).cuda(), bits=4, group_size=128)
    qb = quantize_weight((torch.randn(2048, 2048, generator=g) * 0.02).cuda(), bits=8, group_size=-1, mode="offset")
    x0 = torch.randn(1, 2048, generator=g).half().cuda()
    inf = float("inf")

    cfg = dict(R=2, KS=1, NW=8, PF=pf)

    def chain(x):
        for _ in range(4):
            x = ga.gemv_a8(x, qa, "sym", None, -inf, inf, torch.float16, per_token=True, config=cfg)
            x = ga.gemv_a8(x * 0.05, qb, "asym", None, -inf, inf, torch.float16, config=cfg)  # the op writes x
            x = torch.tanh(x)
        return x

    assert_pdl_chain_matches(chain, x0)


@pytest.mark.gpu
def test_gemv_a8_unaligned_x_and_out_buffer():
    g = _gen(11)
    qw = quantize_weight((torch.randn(77, 256, generator=g) * 0.02).cuda(), bits=4, group_size=64)
    xb = torch.randn(2, 257, generator=g).half().cuda()
    x = xb[:, 1:]  # rows not 16-byte aligned: the wrapper copies
    out = torch.empty(2, 77, dtype=torch.float16, device="cuda")
    y = ga.gemv_a8(x, qw, "sym", None, float("-inf"), float("inf"), torch.float16, out=out)
    assert y.data_ptr() == out.data_ptr()
    assert _rel(y, _ref(x, qw, "sym", None, float("-inf"), float("inf"))) <= 2e-3


@pytest.mark.gpu
def test_matmul_a8_dispatches_small_m():
    from mixgemm.ops.int8 import matmul_a8

    g = _gen(12)
    qw = quantize_weight((torch.randn(300, 512, generator=g) * 0.02).cuda(), bits=4, group_size=128)
    for m in (1, 2, 16, 17):  # M <= A8_GEMV_MAX_M: the fused CUDA GEMV, else the Triton path
        x = torch.randn(m, 512, generator=g).half().cuda()
        y = matmul_a8(x, qw, "asym", activation="relu")
        ref = _ref(x, qw, "asym", None, 0.0, float("inf"))
        assert _rel(y, ref) <= 2e-3, m


# ------------------------------------------------------------------ long-row activation quantization


def test_act_quant_rows_supported_rules():
    x = torch.zeros(2, 8192)  # CPU: never
    assert not aq.act_quant_rows_supported(x, -1)


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_nvrtc_compiles_act_quant_rows(arch):
    for xt in (0, 1, 2):
        for cpt in (2, 7, 16):
            assert len(nvrtc.compile_cubin(aq.SOURCE, tuple(sorted({"A8_ACTQ": cpt, "A8_XT": xt}.items())), arch))


def test_act_quant_rows_threads():
    """Threads per row: a power of two in 32..ACTQ_NT giving each thread about ACTQ_UNITS 8-element units, and never
    more units than the registers hold (ACTQ_MAX_CPT) up to the longest row supported."""
    assert aq.actq_threads(4096) == min(aq.ACTQ_NT, 512 // tuning.A8_ACTQ_UNITS)
    for k in (8, 2048, 4096, 4104, 5120, 8192, 12344, 28672, 8 * aq.ACTQ_NT * aq.ACTQ_MAX_CPT):
        nt = aq.actq_threads(k)
        assert 32 <= nt <= aq.ACTQ_NT and nt & (nt - 1) == 0
        cpt = -(-(k // 8) // nt)
        assert cpt <= aq.ACTQ_MAX_CPT and (cpt <= tuning.A8_ACTQ_UNITS or nt == aq.ACTQ_NT)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [4104, 5120, 8192, 12344, 28672])
@pytest.mark.parametrize("mode", ["sym", "asym"])
@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("units", [1, 4])
def test_act_quant_rows_exact(k, mode, dt, units, monkeypatch):
    """Codes, sums, scales and offsets bit-identical to the CPU reference (and to the Triton act_quant), with one
    8-element unit per thread and with the default's several (fewer threads per row)."""
    from mixgemm.kernels.triton.act_quant import act_quant

    monkeypatch.setattr(tuning, "A8_ACTQ_UNITS", units)

    g = _gen(k + len(mode))
    x = (torch.randn(37, k, generator=g) * torch.rand(37, 1, generator=g) * 4).to(dt)
    x[3] = 0.0  # an all-zero row: d = 0 (sym) / a constant row (asym)
    x[5, :] = 1.5
    xc = x.cuda()
    assert aq.act_quant_rows_supported(xc, -1)
    q, s, o, sm = aq.act_quant_rows(xc, mode)
    ref = quantize_activation(x.float(), -1, mode)
    assert torch.equal(q.cpu(), ref.q)
    assert torch.equal(sm.cpu(), ref.sums)
    assert torch.equal(s.cpu(), ref.scales)
    assert torch.equal(o.cpu(), ref.offsets)
    t = act_quant(xc, -1, mode)
    assert all(torch.equal(a, b) for a, b in zip((q, s, o, sm), t, strict=True))


@pytest.mark.gpu
def test_matmul_a8_large_m_per_channel_uses_rows_quantizer():
    from mixgemm.ops.int8 import matmul_a8

    g = _gen(21)
    k, n, m = 8200, 300, 40
    qw = quantize_weight((torch.randn(n, k, generator=g) * 0.02).cuda(), bits=8, group_size=-1)
    x = torch.randn(m, k, generator=g).half().cuda()
    for act in ("sym", "asym"):
        y = matmul_a8(x, qw, act, out_dtype=torch.float32)
        assert _rel(y, _ref(x, qw, act, None, float("-inf"), float("inf"))) <= 1e-5
