"""rows_v1, the resident layout of compacted int8 weight-only layers (kernels/cuda/rows_layout.py): the layout and its
read-back on the CPU, its builds of the three kernels that read it (NVRTC), and on an sm_90 GPU each of them forced on
a compacted weight against the float64 reference."""

from __future__ import annotations

import itertools

import pytest
import torch

import mixgemm
import mixgemm.reference as ref
from described_gpus import H100
from mixgemm.formats.weight import QuantConfig, compact_placeholder, quantize_weight
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda.rows_layout import ROWS_PERM, build_rows_v1, unpack_rows_v1
from mixgemm.kernels.cuda_wgmma.layout import build_wgmma_v1
from mixgemm.ops.custom_ops import compact_weight

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}
FORMATS = [(-1, "sym"), (32, "zero_point"), (128, "offset"), (64, "sym")]


def _qw(n, k, group, mode, seed=0, device="cpu", bits=8, scale_dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    cfg = QuantConfig(bits=bits, group_size=group, mode=mode, scale_dtype=scale_dtype)
    return quantize_weight(w, cfg).to(device)


@pytest.mark.parametrize("group,mode", FORMATS)
def test_rows_layout_round_trip_and_word_order(group, mode):
    """Odd N and K: the codes read back exactly; word t of every 16-byte chunk holds k 2t, 2t + 1, 2t + 8, 2t + 9 of it
    (the A-fragment word the kernels take); rows pad to 16 and K to 64; the parameters are wgmma_v1's."""
    k = 200 if group == -1 else 384
    qw = _qw(75, k, group, mode)
    lay = build_rows_v1(qw)
    codes = qw.codes()
    assert torch.equal(unpack_rows_v1(lay), codes)
    assert lay.weight.shape == (80, 256 if k == 200 else 384) and lay.k_padded % 64 == 0
    chunk = lay.weight[:75, :16].long()
    for t, i in itertools.product(range(4), range(4)):
        assert torch.equal(chunk[:, 4 * t + i], codes[:, 2 * t + (i & 1) + 8 * (i >> 1)].long())
    assert sorted(ROWS_PERM) == list(range(16))
    assert torch.equal(lay.params, build_wgmma_v1(qw).params)


def test_rows_layout_rejects_int4_and_keeps_inputs():
    qw = _qw(32, 128, 32, "sym", bits=4)
    with pytest.raises(ValueError, match="rows_v1 holds int8 weights, this one is int4"):
        build_rows_v1(qw)
    q8 = _qw(32, 128, 32, "zero_point")
    before = [t.clone() for t in (q8.qweight, q8.scales, q8.zeros)]
    build_rows_v1(q8)
    assert all(torch.equal(a, b) for a, b in zip(before, (q8.qweight, q8.scales, q8.zeros), strict=True))


def test_compacted_int8_weight_reads_back_its_codes():
    qw = _qw(40, 192, 64, "offset")
    one = compact_weight(qw, compact_placeholder(qw.qweight), "rows_v1")
    assert one.resident == "rows_v1" and torch.equal(one.codes(), qw.codes())
    assert torch.equal(one.packed(), qw.qweight)


def test_int8_layer_compacts_to_rows_on_request(torch_gen):
    """rows_v1 is opt-in (the default stays wgmma_v1): an int8 weight-only layer keeps it with compact_("rows_v1"),
    gives the same results (CPU: from the codes read back) and the plain state dict; int4 and int8-activation layers say
    why not."""
    from torch import nn

    from mixgemm.nn import QuantLinear

    lin = nn.Linear(200, 75)
    q = QuantLinear.from_linear(lin, QuantConfig(bits=8, group_size=-1, mode="zero_point"))
    x = torch.randn(3, 200, generator=torch_gen)
    want, sd = q(x), {k: v.clone() for k, v in q.state_dict().items()}
    assert q.compact_reason() is None and q.compact_("rows_v1").compact == "rows_v1"
    assert torch.equal(q(x), want) and all(torch.equal(q.state_dict()[k], v) for k, v in sd.items())
    assert set(mixgemm.resident_bytes(q)["layouts"]) == {"rows_v1"}
    q4 = QuantLinear.from_linear(lin, QuantConfig(bits=4, group_size=-1))
    assert q4.compact_reason("rows_v1") == "rows_v1 holds int8 weights, the layer is int4"
    a8 = QuantLinear.from_linear(lin, QuantConfig(bits=8, group_size=-1), act_mode="sym")
    assert "kernels read wgmma_a8_v1" in a8.compact_reason("rows_v1")


def test_tensor_core_gemv_on_rows_caps_its_registers():
    """On rows_v1 the tensor-core GEMV's tile (wgmma_v1's) is capped at two blocks per SM (MINB 2) from M = 2, and says
    so; M = 1 and the wgmma_v1 weight keep their configs."""
    import dataclasses

    from mixgemm.kernels import linear_common
    from mixgemm.kernels.registry import entry

    qw = _qw(4096, 1024, -1, "sym")
    for m in (2, 8, 16):
        p = dataclasses.replace(linear_common.linear_problem(m, qw, torch.float16, H100), resident="rows_v1", k=4096)
        cfg = entry("cuda_gemv_mma").config(p)
        assert cfg["ROWS"] == 1 and cfg["WG"] == 0 and cfg["MINB"] == 2, cfg
        assert "MINB 2" in cfg.source
        wg = entry("cuda_gemv_mma").config(dataclasses.replace(p, resident="wgmma_v1"))
        assert wg.get("MINB", 0) < 2 and "ROWS" not in wg
    one = dataclasses.replace(linear_common.linear_problem(1, qw, torch.float16, H100), resident="rows_v1", k=4096)
    assert entry("cuda_gemv_mma").config(one).get("MINB", 0) < 2


@pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="NVRTC (cuda-bindings + nvidia-cuda-nvrtc) not installed")
def test_nvrtc_compiles_rows_builds():
    """The CUDA-core GEMV (every activation dtype, scale dtype and mode; a lane-group tile and the bulk ring) and the
    tensor-core GEMV (deferred scaling or not, row tiles, double buffering, act-order, packed pairs) on rows_v1."""
    from mixgemm.kernels.cuda_gemv.host import defines_for
    from mixgemm.kernels.cuda_gemv_mma.host import choose_mma_config, mma_defines_for

    keys = set()
    tiles = ({"R": 4, "U": 2, "RG": 4, "KS": 2, "PF": 1}, {"R": 2, "U": 1, "RG": 8, "KS": 1, "LW": 16},
             {"R": 8, "U": 1, "RG": 1, "KS": 7, "BULK": 2, "BPAR": 1, "MINB": 2})
    for i, (act, scl, mode) in enumerate(itertools.product((0, 1, 2), (0, 1), (0, 1, 2))):
        d = defines_for(8, act, scl, mode, (1, 4)[i % 2], {**tiles[i % 3], "ROWS": 1})
        assert d["GEMV_ROWS"] == 1
        keys.add(("cuda_gemv/gemv.cu", tuple(sorted(d.items()))))
    for i, (act, mode, mb) in enumerate(itertools.product((0, 1), (0, 1, 2), (1, 2))):
        cfg = {**choose_mma_config(mb, 4096, 64, 132, 8), "ROWS": 1, "WG": 1}
        extra = ({"DEFER": 0, "MINB": 2}, {"DEFER": 1, "RT": 2, "PF": 1, "EARLY": 1}, {"PERM": 1, "PACK": 1})[i % 3]
        d = mma_defines_for(8, act, 0, mode, mb, {**cfg, **extra})
        assert d["MMA_ROWS"] == 1 and "MMA_WG" not in d
        keys.add(("cuda_gemv_mma/gemv_mma.cu", tuple(sorted(d.items()))))
    for src, key in sorted(keys):
        cubin = nvrtc.compile_cubin(src, key, "sm_90")
        assert len(cubin) > 1000 and cubin[:4] == b"\x7fELF", (src, key)


# ------------------------------------------------------------------------------------------------ GPU
def _sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_sm90 = pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
# the kernels that read rows_v1, with the M each takes and the activation dtypes
KERNELS = {
    "cuda_gemv": ((1, 3, 16), (torch.float16, torch.bfloat16, torch.float32)),
    "cuda_gemv_mma": ((1, 3, 16), (torch.float16, torch.bfloat16)),
    "cuda_wgmma": ((1, 17, 129, 300), (torch.float16, torch.bfloat16)),
}


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("group,mode", FORMATS)
def test_rows_kernels_match_the_reference(kernel, group, mode):
    """Each kernel forced on a compacted int8 weight (odd N, K past whole tiles, bias), every M it takes and every
    activation dtype, against the float64 reference on the same codes; the dispatcher says it reads rows_v1; inputs
    unchanged; M = 0 gives [0, N]."""
    k = 200 if group == -1 else 640
    ms, dtypes = KERNELS[kernel]
    gen = torch.Generator().manual_seed(4)
    weights = {}  # per scale dtype: bf16 x with bf16 scales (as bf16 models' checkpoints carry), else fp16 scales
    for sd in (torch.float16, torch.bfloat16):
        qw = _qw(1000, k, group, mode, seed=3, device="cuda", scale_dtype=sd)
        weights[sd] = compact_weight(qw, compact_placeholder(qw.qweight), "rows_v1")
    one = weights[torch.float16]
    for dtype, m in itertools.product(dtypes, ms):
        w = weights[torch.bfloat16 if dtype == torch.bfloat16 else torch.float16]
        x = torch.randn(m, k, generator=gen).to("cuda", dtype)
        b = (torch.randn(1000, generator=gen) * 0.1).to("cuda", dtype)
        x0 = x.clone()
        with mixgemm.kernel_options(force=kernel):
            y = mixgemm.matmul(x, w, b)
            choice = mixgemm.explain(x, w)
        assert (choice.kernel, choice.layout) == (kernel, "rows_v1"), str(choice)
        r = ref.matmul(x, w, b, None, out_dtype=torch.float64)
        err = float((y.double() - r).norm() / r.norm())
        assert torch.equal(x, x0) and y.dtype == dtype and y.shape == (m, 1000)
        assert err <= TOL[dtype], (kernel, group, mode, dtype, m, err)
    with mixgemm.kernel_options(force=kernel):
        assert mixgemm.matmul(torch.randn(0, k, device="cuda", dtype=torch.float16), one).shape == (0, 1000)

