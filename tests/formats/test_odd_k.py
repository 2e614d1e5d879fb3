"""4-bit weights with an odd K (per-channel: depthwise 3x3 / 7x7 / 1x7 convs, the 3-channel stem, odd in_features): rows
of ceil(K / 2) bytes whose last high nibble is padding (mixgemm.formats.packing.PAD_CODE_4BIT), read by nobody.

CPU: the packing, every layout builder's codes, the CPU matmul and conv paths, QuantLinear / QuantConv2d state dicts,
quantize_, tensor-parallel shards and mixgemm's checkpoint format (a wrong packed width is a clear error); the Triton
GEMM and conv kernels (implicit GEMM, depthwise, small-K, conv as matmul, dequantize + conv) under the interpreter
against the float64 reference of the same codes.
GPU (gpu, sm_90): every CUDA / Triton entry that accepts odd K, forced, against the float64 reference; the entries
that cannot take it decline with a reason.
"""

from __future__ import annotations

import pytest
import torch

import mixgemm
from conv_cases import assert_conv_matches, make_conv_case
from mixgemm import reference
from mixgemm.epilogue import clamp_bounds
from mixgemm.formats.packing import PAD_CODE_4BIT, pack_codes, packed_width, unpack_codes
from mixgemm.formats.weight import MODES, dequantize_weight, from_codes, quantize_weight
from mixgemm.nn.conv import QuantConv2d
from mixgemm.nn.linear import QuantLinear
from mixgemm.ops.conv import cuda_conv2d
from mixgemm.reference.matmul import matmul as ref_matmul

HAS_CUDA = torch.cuda.is_available()
INTERP = pytest.mark.skipif(HAS_CUDA, reason="interpreter tests run on CPU-only machines")
_SM90 = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
needs_sm90 = pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}
ODD_K = (49, 25, 7, 129)


def _qw(n, k, mode, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05 + torch.randn(n, 1, generator=g) * 0.02
    return w, quantize_weight(w, bits=4, group_size=-1, mode=mode).to(device)


# ------------------------------------------------------------------------------------------- format
@pytest.mark.parametrize("k", (1, 7, 25, 49, 129, 8))
def test_packing_holds_exactly_k_codes(k):
    g = torch.Generator().manual_seed(k)
    codes = torch.randint(0, 16, (2, 3, k), generator=g, dtype=torch.uint8)
    before = codes.clone()
    packed = pack_codes(codes, 4)
    assert packed.shape == (2, 3, packed_width(k, 4)) == (2, 3, (k + 1) // 2) and torch.equal(codes, before)
    assert torch.equal(packed & 0xF, codes[..., 0::2])
    if k % 2:
        assert bool(((packed[..., -1] >> 4) == PAD_CODE_4BIT).all())
    back = unpack_codes(packed, 4, k)
    assert back.shape == codes.shape and back.is_contiguous() and torch.equal(back, codes)
    with pytest.raises(ValueError, match=rf"does not hold K={k + 2} codes of 4 bits \(expected"):
        unpack_codes(packed, 4, k + 2)
    assert packed_width(k, 8) == k


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k", ODD_K)
def test_quantized_weight_and_every_layout_hold_the_codes(mode, k):
    """Quantization within half a step, from_codes, and the codes every kernel layout builder holds (read back by its
    own unpack) equal the plain codes: each builds from the true K, the padding nibble never enters."""
    from mixgemm.formats.layouts_wgmma_a8 import build_wgmma_a8_v1, unpack_wgmma_a8_v1
    from mixgemm.kernels.cuda_gemv.layout import build_gemv_v2, unpack_gemv_v2
    from mixgemm.kernels.cuda_gemv_a8.layout import build_a8gemv_v2
    from mixgemm.kernels.cuda_gemv_mma.layout import build_gemv_mma_v1, unpack_gemv_mma_v1
    from mixgemm.kernels.cuda_wgmma.layout import build_wgmma_v1, unpack_wgmma_v1
    from mixgemm.kernels.triton.conv_common import build_conv_layout

    w, qw = _qw(19, k, mode, seed=k)
    assert qw.qweight.shape == (19, (k + 1) // 2) and qw.codes().shape == (19, k)
    step = qw.scales.double()
    assert bool(((dequantize_weight(qw, torch.float64) - w.double()).abs() <= step / 2 * (1 + 1e-3) + 1e-9).all())
    again = from_codes(qw.codes(), qw.scales, qw.config, zeros=qw.zeros, offsets=qw.offsets)
    assert torch.equal(again.qweight, qw.qweight)
    codes = qw.codes()
    assert torch.equal(unpack_gemv_v2(build_gemv_v2(qw)), codes)
    assert torch.equal(unpack_gemv_mma_v1(build_gemv_mma_v1(qw)), codes)
    assert torch.equal(unpack_wgmma_v1(build_wgmma_v1(qw)), codes)
    a8 = build_a8gemv_v2(qw)  # per channel: a copy padded to whole chunks with the code of c = 0
    a8_codes = unpack_codes(a8.weight, 4, a8.weight.shape[1] * 2)
    assert torch.equal(a8_codes[:, :k], codes) and bool((a8_codes[:, k:] == 8).all())
    conv = build_conv_layout(qw)  # the plain rows as words, padded to 16 bytes
    assert torch.equal(unpack_codes(conv.weight.view(torch.uint8)[:, : (k + 1) // 2].contiguous(), 4, k), codes)
    if mode == "sym":
        assert torch.equal((unpack_wgmma_a8_v1(build_wgmma_a8_v1(qw)) + 8).to(torch.uint8), codes)


def check_cpu_matmul(qw, rel_err):
    """mixgemm.matmul on the CPU at M = 0, 1, 3, 17 in fp16 / bf16 / fp32 with a bias and relu, against the float64
    reference of the same codes; x is not modified."""
    n, k = qw.shape
    g = torch.Generator().manual_seed(2)
    b = torch.randn(n, generator=g) * 0.1
    assert mixgemm.matmul(torch.randn(0, k), qw).shape == (0, n)
    for m in (1, 3, 17):
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            x = torch.randn(m, k, generator=g).to(dtype)
            x0 = x.clone()
            y = mixgemm.matmul(x, qw, b.to(dtype), "relu")
            assert torch.equal(x, x0) and y.dtype == dtype and y.shape == (m, n)
            assert rel_err(y, ref_matmul(x, qw, b.to(dtype), "relu", out_dtype=torch.float64)) <= TOL[dtype]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k", ODD_K)
def test_cpu_matmul_against_the_reference(mode, k, rel_err):
    check_cpu_matmul(_qw(24, k, mode, seed=k + 1)[1], rel_err)


def test_quant_linear_state_dict_and_width_errors():
    from mixgemm.ops.custom_ops import weight_from_tensors

    lin = torch.nn.Linear(49, 24)
    layer = QuantLinear.from_linear(lin, mixgemm.QuantConfig(bits=4, group_size=-1, mode="zero_point"))
    assert layer.qweight.shape == (24, 25)
    fresh = QuantLinear(49, 24, bits=4, group_size=-1, mode="zero_point", bias_dtype=torch.float32)
    assert fresh.qweight.shape == (24, 25)
    fresh.load_state_dict(layer.state_dict())
    x = torch.randn(3, 49)
    assert torch.equal(fresh(x), layer(x))
    want = x.double() @ fresh.dequantize(torch.float64).T + lin.bias.double()
    assert torch.allclose(fresh(x).double(), want, rtol=1e-5, atol=1e-5)
    bad = {**layer.state_dict(), "qweight": torch.zeros(24, 24, dtype=torch.uint8)}
    with pytest.raises(RuntimeError, match="size mismatch for qweight"):
        fresh.load_state_dict(bad)
    with pytest.raises(ValueError, match=r"qweight must be uint8 \[24, 25\] \(ceil\(K \* bits / 8\)\)"):
        weight_from_tensors(torch.zeros(24, 24, dtype=torch.uint8), layer.scales, layer.zeros, None, 4, -1,
                            "zero_point", 24, 49)


def test_native_checkpoint_round_trip_and_wrong_width(tmp_path):
    """A W4A16 per-channel model whose down_proj has K = 129 saves and loads back bit for bit (mixgemm's format,
    through mixgemm.from_pretrained and transformers); a checkpoint whose packed width is wrong is refused by name."""
    import safetensors.torch as st
    from transformers import AutoModelForCausalLM

    from mixgemm.integrations.hf import llama_config, random_llama

    model = random_llama(llama_config(hidden_size=64, intermediate_size=129))
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=-1, mode="offset"))
    name = "model.layers.0.mlp.down_proj"
    assert name in report.replaced and model.get_submodule(name).qweight.shape == (64, 65)
    check_round_trip(model, name, tmp_path / "ok")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text((tmp_path / "ok" / "config.json").read_text())
    tensors = st.load_file(str(tmp_path / "ok" / "model.safetensors"))
    tensors[f"{name}.qweight"] = tensors[f"{name}.qweight"][:, :64].contiguous()  # K / 2 bytes: one code short
    st.save_file(tensors, str(tmp_path / "bad" / "model.safetensors"), metadata={"format": "pt"})
    wrong = rf"'{name}\.qweight' is torch\.uint8 \(64, 64\).*torch\.uint8 \(64, 65\)"
    with pytest.raises(ValueError, match=wrong):
        mixgemm.from_pretrained(str(tmp_path / "bad"), progress=False)
    with pytest.raises(ValueError, match=wrong):
        AutoModelForCausalLM.from_pretrained(tmp_path / "bad")


def check_round_trip(model, name: str, folder) -> None:
    """model saves to ``folder`` and loads back (mixgemm.from_pretrained and transformers) with layer ``name``'s codes
    and parameters and the model's logits equal."""
    from transformers import AutoModelForCausalLM

    model.save_pretrained(folder)
    ids = torch.randint(0, 256, (1, 7), generator=torch.Generator().manual_seed(0))
    for loaded in (mixgemm.from_pretrained(str(folder), progress=False), AutoModelForCausalLM.from_pretrained(folder)):
        for t in ("qweight", "scales"):
            assert torch.equal(getattr(loaded.get_submodule(name), t), getattr(model.get_submodule(name), t))
        with torch.no_grad():
            assert torch.equal(loaded(ids).logits, model(ids).logits)


@pytest.mark.parametrize("world", [3, 7])
def test_row_parallel_shards_of_odd_k(world):
    """A per-channel 4-bit weight split along K into odd shards (K = 21 over 3 or 7 ranks): each shard repacked, the
    shards' codes and values reassemble the weight exactly."""
    from mixgemm.distributed.shard import shard_quantized_weight

    _, qw = _qw(8, 21, "zero_point", seed=world)
    shards = [shard_quantized_weight(qw, 1, r, world) for r in range(world)]
    assert all(s.qweight.shape == (8, packed_width(21 // world, 4)) for s in shards)
    assert torch.equal(torch.cat([s.codes() for s in shards], dim=1), qw.codes())
    assert torch.equal(torch.cat([dequantize_weight(s, torch.float64) for s in shards], dim=1),
                       dequantize_weight(qw, torch.float64))


@pytest.mark.usefixtures("isolated_tuning")
def test_which_cuda_entries_take_odd_k(monkeypatch):
    """On a described H200 (no GPU needed): every weight-only linear entry and the fused int8-activation GEMVs take a
    4-bit odd-K weight; the int8 GEMMs decline it with the reason (K % 16, the int8_v1 layout's K % 64)."""
    from described_gpus import H200
    from mixgemm.kernels import int8_activations as a8_entries
    from mixgemm.kernels.int8_activations import a8_problem
    from mixgemm.kernels.linear_common import linear_problem
    from mixgemm.kernels.registry import entries

    monkeypatch.setattr(a8_entries, "nvrtc_ok", lambda: True)
    _, qw = _qw(203, 49, "sym")
    for m in (1, 600):
        p = linear_problem(m, qw, torch.float16, H200)
        for e in entries("linear"):
            d = e.can_run(p)
            assert d.ok or d.soft or f"M={m}" in d.reason, (e.name, m, d)  # (only M ranges decline hard)
    p = a8_problem(1, qw, torch.float16, H200, "sym", True)
    reasons = {e.name: e.can_run(p) for e in entries("linear_a8")}
    assert reasons["cuda_gemv_a8"].ok and (reasons["cuda_gemv_a8_wg"].ok or reasons["cuda_gemv_a8_wg"].soft)
    assert not reasons["cuda_wgmma_a8"].ok and "K=49 not a multiple of 16" in reasons["cuda_wgmma_a8"].reason
    assert not reasons["triton_a8"].ok and "K % 64 == 0, got K=49" in reasons["triton_a8"].reason


# --------------------------------------------------------------------------------------------- convs
def test_quant_conv2d_odd_k_state_dict_and_quantize_():
    """Depthwise 7x7 / 3x3 and a grouped 1x7 stay 4-bit (no warning with group_size=-1, strict accepts them); the state
    dict round-trips; quantize_ on a ConvNeXt-like block stores every conv with 4 bits."""
    import warnings

    g = torch.Generator().manual_seed(0)
    for conv, k in ((torch.nn.Conv2d(24, 24, 7, padding=3, groups=24), 49),
                    (torch.nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=16), 9),
                    (torch.nn.Conv2d(12, 8, (1, 7), padding=(0, 3), groups=4), 21)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            q = QuantConv2d.from_conv(conv, bits=4, group_size=-1, mode="offset", strict=True)
        assert q.qconfig.bits == 4 and q.qweight.shape == (conv.out_channels, (k + 1) // 2)
        x = torch.randn(2, conv.in_channels, 9, 11, generator=g)
        ref = torch.nn.functional.conv2d(x.double(), q.dequantized_weight(torch.float64), q.bias.double(),
                                         conv.stride, conv.padding, conv.dilation, conv.groups)
        y = q(x)
        assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5)
        fresh = QuantConv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                            groups=conv.groups, bits=4, group_size=-1, mode="offset")
        fresh.load_state_dict(q.state_dict())
        assert torch.equal(fresh(x), y)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 24, 4, 4), torch.nn.Conv2d(24, 24, 7, padding=3, groups=24),
                              torch.nn.Conv2d(24, 48, 1), torch.nn.GELU(), torch.nn.Conv2d(48, 24, 1)).eval()
    x = torch.randn(1, 3, 28, 28, generator=g)
    with torch.no_grad():
        want = net(x)
        mixgemm.quantize_(net, mixgemm.W4A16(group_size=-1), progress=False)
        got = net(x)
    assert all(isinstance(m, QuantConv2d) and m.qconfig.bits == 4 for m in (net[0], net[1], net[2], net[4]))
    assert float((got - want).norm() / want.norm()) < 0.1


def _check_conv(x, qw, bias, stride, padding, dilation, groups, act, rel_err, path):
    x_before = x.clone()
    lo, hi = clamp_bounds(act)
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)
    y = cuda_conv2d(x, qw, bias, pair(stride), pair(padding), pair(dilation), groups, lo, hi, act, None, path)
    ref = reference.conv2d(x.cpu(), qw.to("cpu"), None if bias is None else bias.cpu(), stride, padding, dilation,
                           groups, act)
    assert_conv_matches(y, ref, x, x_before, rel_err)


# (b, ci, h, w, co, k, stride, padding, dilation, groups, paths): every geometry has an odd K at 4 bits
CONV_GEOMS = {
    "dw7x7": (1, 24, 9, 7, 24, 7, 1, 3, 1, 24, ("dw", "igemm", "dequant")),  # K = 49
    "dw3x3_mult2_s2": (1, 16, 9, 8, 32, 3, 2, 1, 1, 16, ("dw", "igemm", "dequant")),  # K = 9
    "dw1x7": (1, 16, 6, 11, 16, (1, 7), 1, (0, 3), 1, 16, ("dw", "igemm", "dequant")),  # K = 7
    "grouped1x7_ci3": (1, 12, 6, 11, 8, (1, 7), 1, (0, 3), 1, 4, ("igemm", "dequant")),  # K = 21
    "stem7x7_s2": (1, 3, 13, 11, 16, 7, 2, 3, 1, 1, ("igemm", "smallk", "dequant")),  # K = 147
    "1x1_ci25": (2, 25, 5, 3, 24, 1, 1, 0, 1, 1, ("igemm", "matmul", "dequant")),  # K = 25
}


@INTERP
@pytest.mark.parametrize("name", sorted(CONV_GEOMS))
def test_interp_conv_paths(name, rel_err):
    """Every Triton conv kernel that takes the geometry (and conv as matmul, dequantize + conv) on 4-bit odd-K weights:
    the three modes over the geometries, NCHW and channels_last, fp16 and fp32."""
    b, ci, h, w, co, k, s, p, d, g, paths = CONV_GEOMS[name]
    for i, channels_last in enumerate((False, True)):
        mode = MODES[(len(name) + i) % 3]
        dtype = (torch.float16, torch.float32)[i]
        x, qw, bias = make_conv_case(b, ci, h, w, co, k, g, dtype, channels_last, 4, -1, mode, seed=len(name) + i)
        for path in paths:
            if path != "matmul" or channels_last:  # (the [B*H*W, Ci] view needs channels_last)
                _check_conv(x, qw, bias, s, p, d, g, "relu" if i else None, rel_err, path)


def check_triton_gemm(qw, rel_err, seed):
    """The Triton GEMM (one small tile config) at M = 1, 3 and 17 (split K) in fp16 and fp32 with a bias and relu6,
    against the float64 reference of the same codes; x is not modified."""
    from mixgemm.kernels.triton_gemm.gemm import gemm

    n, k = qw.shape
    g = torch.Generator().manual_seed(seed + 3)
    b = torch.randn(n, generator=g) * 0.1
    lo, hi = clamp_bounds("relu6")
    for i, m in enumerate((1, 3, 17)):
        dtype = (torch.float16, torch.float32)[(i + seed) % 2]
        x = torch.randn(m, k, generator=g).to(dtype)
        x0 = x.clone()
        y = gemm(x, qw, b.to(dtype), lo, hi, dict(BM=16, BN=32, KCH=1, SPLIT_K=1 + (m == 17), GROUP_M=2))
        assert torch.equal(x, x0) and y.dtype == dtype
        assert rel_err(y, ref_matmul(x, qw, b.to(dtype), "relu6", out_dtype=torch.float64)) <= TOL[dtype]


@INTERP
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k", ODD_K)
def test_interp_triton_gemm(mode, k, rel_err):
    """The Triton GEMM on odd K (its layout pads K to two chunks with zero codes, x masked past K)."""
    check_triton_gemm(_qw(40, k, mode, seed=k)[1], rel_err, k)


# ----------------------------------------------------------------------------------------------- GPU
# (entry, its config, activation dtypes, Ms): every linear entry that takes odd K at 4 bits
LINEAR_ENTRIES = {
    "gemv_mma": ("cuda_gemv_mma", {"WG": 0}, (torch.float16, torch.bfloat16), (1, 3, 16)),
    "gemv_mma_wg": ("cuda_gemv_mma", {"WG": 1}, (torch.float16, torch.bfloat16), (1, 3, 16)),
    "wg_simt": ("cuda_gemv_wg_simt", {}, (torch.float16, torch.bfloat16), (1,)),
    "gemv_simt": ("cuda_gemv", {}, (torch.float16, torch.bfloat16, torch.float32), (1, 3, 16)),
    "wgmma": ("cuda_wgmma", {}, (torch.float16, torch.bfloat16), (1, 17, 130)),
    "dequant_cublas": ("dequant_cublas", {}, (torch.float16, torch.bfloat16), (600,)),
    "triton_gemm": ("triton_gemm", {}, (torch.float16, torch.bfloat16, torch.float32), (1, 17, 130)),
}


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("name", sorted(LINEAR_ENTRIES))
@pytest.mark.parametrize("mode", MODES)
def test_gpu_linear_entries(name, mode, rel_err):
    for k in (49, 129, 1001):
        check_forced_entry(name, _qw(203, k, mode, seed=k, device="cuda")[1], rel_err, k)


def check_forced_entry(name: str, qw, rel_err, seed: int) -> None:
    """LINEAR_ENTRIES[name] forced on the CUDA weight qw at its Ms and activation dtypes, with a bias and relu6,
    against the float64 reference of the same codes."""
    entry, cfg, dtypes, ms = LINEAR_ENTRIES[name]
    n, k = qw.shape
    g = torch.Generator().manual_seed(seed)
    bias = torch.randn(n, generator=g) * 0.1
    for i, m in enumerate(ms):
        for dtype in dtypes:
            x = (torch.randn(m, k, generator=g) * (1 + 3 * (i % 2))).to("cuda", dtype)
            with mixgemm.kernel_options(force=entry, configs={entry: cfg} if cfg else {}):
                assert mixgemm.explain(x, qw).kernel == entry
                y = mixgemm.matmul(x, qw, bias.to("cuda", dtype), "relu6")
            ref = ref_matmul(x, qw, bias.to("cuda", dtype), "relu6", out_dtype=torch.float64)
            assert rel_err(y, ref) <= TOL[dtype], (name, qw, m, dtype, rel_err(y, ref))


@pytest.mark.gpu
@needs_sm90
def test_gpu_compacted_layer_keeps_the_plain_format(rel_err):
    """A QuantLinear of 1001 input features on the GPU keeps one resident layout (auto-compaction), runs every M against
    the reference, and its state dict still holds the plain [N, 501] codes, equal to the original."""
    lin = torch.nn.Linear(1001, 203)
    layer = QuantLinear.from_linear(lin, mixgemm.QuantConfig(bits=4, group_size=-1, mode="offset"))
    plain = layer.qweight.clone()
    layer = layer.to("cuda", torch.float16)
    layer.set_auto_compact(True)
    assert layer.compact is not None
    g = torch.Generator().manual_seed(0)
    for m in (1, 5, 17, 600):
        x = torch.randn(m, 1001, generator=g).to("cuda", torch.float16)
        with torch.no_grad():
            y = layer(x)
        ref = ref_matmul(x, layer.quantized_weight(), layer.bias, out_dtype=torch.float64)
        assert rel_err(y, ref) <= TOL[torch.float16], (m, rel_err(y, ref))
    assert torch.equal(layer.state_dict()["qweight"].cpu(), plain)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("mode", MODES)
def test_gpu_a8_entries(mode, rel_err):
    """The fused int8-activation GEMVs take odd K (padded with the code of c = 0, x quantized over the true K); the int8
    GEMMs decline it with a reason."""
    from mixgemm.formats.activation import quantize_activation
    from mixgemm.kernels.registry import NoKernel
    from mixgemm.ops.int8 import matmul_a8
    from mixgemm.reference.block_gemm import block_int_gemm

    for k in (49, 129, 1001):
        _, qw = _qw(203, k, mode, seed=k, device="cuda")
        g = torch.Generator().manual_seed(k)
        for m in (1, 3, 16):
            for act, dtype in (("sym", torch.float16), ("asym", torch.bfloat16), ("sym", torch.float32)):
                x = torch.randn(m, k, generator=g).to("cuda", dtype)
                entries = ["cuda_gemv_a8"] + (["cuda_gemv_a8_wg"] if mode == "sym" and act == "sym" else [])
                for entry in entries:
                    with mixgemm.kernel_options(force=entry):
                        assert mixgemm.explain(x, qw, act_mode=act, act_block="token").kernel == entry
                        y = matmul_a8(x, qw, act, act_block="token")
                    ref = block_int_gemm(quantize_activation(x.float().cpu(), -1, act), qw.to("cpu"))
                    assert rel_err(y, ref) <= TOL[dtype], (entry, mode, k, m, act, dtype, rel_err(y, ref))
                # (the int8 GEMM checks for sym activations and weights before K)
                gemm_why = (f"K={k} not a multiple of 16" if act == "sym" == mode else
                            "act_mode 'asym'" if act == "asym" else "the wgmma_a8_v1 layout takes sym")
                for entry, why in (("cuda_wgmma_a8", gemm_why),
                                   ("triton_a8", f"4-bit int8_v1 layout needs K % 64 == 0, got K={k}")):
                    with mixgemm.kernel_options(force=entry), pytest.raises(NoKernel) as declined:
                        mixgemm.explain(x, qw, act_mode=act, act_block="token")
                    assert why in str(declined.value), (entry, str(declined.value))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("name", sorted(CONV_GEOMS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_conv_paths(name, dtype, rel_err):
    """Every conv kernel that takes the geometry (the CUDA depthwise conv too, channels_last) on 4-bit odd-K weights,
    every mode; the wgmma implicit GEMM declines (Ci % 64)."""
    from mixgemm.kernels.conv_geometry import conv_problem
    from mixgemm.kernels.registry import entry

    b, ci, h, w, co, k, s, p, d, g, paths = CONV_GEOMS[name]
    depthwise_cuda = ci == g and co == ci
    for i, mode in enumerate(MODES):
        for channels_last in (False, True):
            x, qw, bias = make_conv_case(b, ci, h, w, co, k, g, dtype, channels_last, 4, -1, mode, seed=i)
            run = paths + (("dw_cuda",) if channels_last and depthwise_cuda else ())
            for path in run:
                if path != "matmul" or channels_last:
                    _check_conv(x, qw, bias, s, p, d, g, "relu6" if i == 1 else None, rel_err, path)
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)
    assert not entry("cuda_conv_wgmma").can_run(conv_problem(x, qw, b, pair(s), pair(p), g, pair(d))).ok


@pytest.mark.gpu
@needs_sm90
def test_gpu_quantized_convnext_block(rel_err):
    """A ConvNeXt-like block quantized with W4A16 per channel (the 7x7 depthwise now 4-bit) runs on the dispatcher's
    picks, eager, within the fp16 tolerance of the float64 conv of its dequantized weights."""
    g = torch.Generator().manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 96, 4, 4), torch.nn.Conv2d(96, 96, 7, padding=3, groups=96),
                              torch.nn.Conv2d(96, 384, 1), torch.nn.Conv2d(384, 96, 1)).eval()
    mixgemm.quantize_(net, mixgemm.W4A16(group_size=-1), progress=False)
    net = net.to("cuda", torch.float16).to(memory_format=torch.channels_last)
    assert net[1].qconfig.bits == 4 and net[1].qweight.shape == (96, 25)
    x = torch.randn(2, 3, 56, 56, generator=g).to("cuda", torch.float16).to(memory_format=torch.channels_last)
    with torch.no_grad():
        y, ref = net(x), x.double().cpu()
        for layer in net:
            ref = torch.nn.functional.conv2d(ref, layer.dequantized_weight(torch.float64).cpu(),
                                             layer.bias.double().cpu(), layer.stride, layer.padding, layer.dilation,
                                             layer.groups)
    assert rel_err(y.cpu(), ref) <= 5e-3
