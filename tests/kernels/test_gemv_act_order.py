"""Act-order GEMVs: the CUDA GEMVs gather x through an act-order layer's input permutation while they read it
(gemv.cu GEMV_PERM, gemv_mma.cu MMA_PERM; mixgemm.ops.dispatch.kernel_perm / run_linear), with no separate gather;
where they do not, the gather kernel (gather_x.cu) runs before them.

CPU: NVRTC compiles the gathering variants and the gather kernel for sm_90a and sm_80; kernel_perm's padding and
cache. GPU: the gather kernel equals x[:, perm] zero-padded (fp16 / bf16 / fp32, aligned and unaligned rows); each
gathering kernel equals the same kernel run on x[:, perm] bit for bit (the same arithmetic on the same numbers: only
where x comes from differs) and the float64 reference within the dtype's tolerance, at M = 1, 3, 16, fp16 / bf16
(fp32 on the CUDA-core kernel), int4 sym / zero point g128, int8, per-channel with odd K (padded layouts); and
QuantLinear picks the gathering kernel at decode under CUDA graphs and torch.library's op."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import mixgemm.reference as ref
from mixgemm.formats.weight import dequantize_weight, quantize_weight
from mixgemm.kernels.cuda import nvrtc
from mixgemm.kernels.cuda_gemv import host as gemv_host
from mixgemm.kernels.cuda_gemv.host import choose_config, defines_for
from mixgemm.kernels.cuda_gemv_mma import host as gemv_mma_host
from mixgemm.kernels.cuda_gemv_mma.host import choose_mma_config, mma_defines_for
from mixgemm.ops.dispatch import PERM_PAD, kernel_perm
from mixgemm.tuning import gemv_m1

needs_nvrtc = pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="cuda-bindings / libnvrtc not installed")
TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}

# (bits, act, scl, mode, M bucket, config) of gemv.cu variants with the gather: x staged in shared memory at M = 1
# (fp16), per-lane gathers with register double buffering (PF, where XS cannot run), bf16 / fp32 at larger M buckets,
# and (sm_90 only) the bulk-copy ring tile with x staged
SIMT_VARIANTS = [
    (4, 0, 0, 1, 1, {"R": 4, "U": 1, "RG": 4, "KS": 2, "PF": 0, "XS": 1, "LITE": 1}),
    (8, 0, 0, 0, 1, {"R": 2, "U": 2, "RG": 1, "KS": 8, "PF": 1}),
    (4, 1, 1, 2, 4, choose_config(4, 4096, 128, 132, 1)),
    (8, 2, 2, 1, 16, choose_config(16, 4096, 256, 132, 2, 8)),
]
BULK_VARIANT = (4, 0, 0, 1, 1, {**gemv_m1._K28672_BULK._asdict(), "XS": 1, "BPAR": 1})
MMA_VARIANTS = [(4, 0, 0, 1, 1, {**choose_mma_config(1, 4096, 64, 132), "DEFER": 1}),
                (8, 1, 1, 0, 2, {**choose_mma_config(2, 4096, 128, 132), "DEFER": 0})]


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_nvrtc_compiles_gathering_variants(arch):
    simt = SIMT_VARIANTS + ([BULK_VARIANT] if arch == "sm_90a" else [])
    keys = [("cuda_gemv/gemv.cu", defines_for(b, a, s, mo, mb, {**cfg, "PERM": 1})) for b, a, s, mo, mb, cfg in simt]
    keys += [("cuda_gemv_mma/gemv_mma.cu", mma_defines_for(b, a, s, mo, mb, {**cfg, "PERM": 1})) for b, a, s,
             mo, mb, cfg in
             MMA_VARIANTS]
    for source, defs in keys:
        assert defs.get("GEMV_PERM", defs.get("MMA_PERM")) == 1
        if source == "cuda_gemv/gemv.cu" and defs["GEMV_M"] == 1 and defs["GEMV_ACT"] == 0 and not defs["GEMV_PF"]:
            assert defs.get("GEMV_XS") == 1  # the gather-into-shared-memory path is compiled, not only per-lane
        cubin = nvrtc.compile_cubin(source, tuple(sorted(defs.items())), arch)
        assert len(cubin) > 1000 and cubin[:4] == b"\x7fELF", defs


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("es", [2, 4])
def test_nvrtc_compiles_the_gather_kernel(arch, es):
    cubin = nvrtc.compile_cubin("gather_x.cu", (("GX_ES", es),), arch)
    assert len(cubin) > 1000 and cubin[:4] == b"\x7fELF"


def test_perm_config_stages_x_where_it_can():
    cfg = {"R": 4, "U": 1, "RG": 4, "KS": 2, "PF": 0}
    assert gemv_host.perm_config(cfg, 1, 0, 4096) == {**cfg, "PERM": 1, "XS": 1}
    assert gemv_host.perm_config(cfg, 2, 0, 4096) == {**cfg, "PERM": 1}  # M bucket 2: per-lane gathers
    assert gemv_host.perm_config(cfg, 1, 1, 4096) == {**cfg, "PERM": 1}  # bf16 x
    assert gemv_host.perm_config({**cfg, "PF": 1}, 1, 0, 4096) == {**cfg, "PF": 1, "PERM": 1}
    assert gemv_host.perm_config(cfg, 1, 0, 16384) == {**cfg, "PERM": 1, "XS": 1}
    assert gemv_host.perm_config(cfg, 1, 0, 16384 + 32) == {**cfg, "PERM": 1}  # x twice exceeds 64 KiB
    # x as it is, x gathered, and the int32 indices
    xs = gemv_host.x_smem_bytes
    assert xs({**cfg, "PERM": 1, "XS": 1}, 4096) == 4 * xs({**cfg, "XS": 1}, 4096)


def test_kernel_perm_is_int32_identity_padded_and_cached(torch_gen):
    for k in (200, 256, 4096 + 32):
        perm = torch.randperm(k, generator=torch_gen)
        kp = kernel_perm(perm)
        size = -(-k // PERM_PAD) * PERM_PAD
        assert kp.dtype == torch.int32 and kp.shape == (size,) and kp.is_contiguous()
        assert torch.equal(kp[:k].long(), perm) and torch.equal(kp[k:].long(), torch.arange(k, size))
        assert kernel_perm(perm) is kp  # made once per permutation tensor
        before = perm.clone()
        perm.copy_(perm.flip(0))  # an in-place change (load_state_dict) is seen
        again = kernel_perm(perm)
        assert again is not kp and torch.equal(again[:k].long(), before.flip(0))


# ----------------------------------------------------------------------------------------------- GPU
# (bits, group, mode, K): int4 sym / zero point g128, int8 g128 and per-channel, per-channel int4 / int8 with K not a
# multiple of the layouts' chunks (x zero-padded, the permutation padded with the identity)
FORMATS = [(4, 128, "sym", 768), (4, 128, "zero_point", 1024), (8, 128, "sym", 512), (8, -1, "zero_point", 200),
           (4, -1, "sym", 200)]
# how each kernel is run: its own config rule, or the CUDA-core kernel with register double buffering (no shared
# memory staging: every lane gathers its pieces)
KERNELS = ["simt", "simt_pf", "mma", "mma_wg"]


def _config(kernel: str, m: int, n: int, k: int, qw, dtype):
    if kernel.startswith("mma"):
        return {**gemv_mma_host.mma_config(m, n, k, qw.bits, qw.group_size, 132), "WG": int(kernel == "mma_wg")}
    if kernel == "simt_pf":
        return {"R": 2, "U": 2, "RG": 4, "KS": 2, "PF": 1}
    return gemv_host.simt_config(m, n, k, qw.bits, dtype, qw.mode, 132, torch.cuda.get_device_name())


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bits,group,mode,k", FORMATS)
def test_gathering_gemv_equals_the_kernel_on_permuted_x(kernel, bits, group, mode, k):
    gen = torch.Generator(device="cuda").manual_seed(7)
    n = 203
    qw = quantize_weight(torch.randn(n, k, generator=gen, device="cuda") * 0.02, bits=bits, group_size=group,
                         mode=mode)
    bias = torch.randn(n, generator=gen, device="cuda").half()
    perm = torch.randperm(k, generator=gen, device="cuda")
    kp = kernel_perm(perm)
    run = gemv_mma_host.gemv_mma if kernel.startswith("mma") else gemv_host.gemv_simt
    dtypes = (torch.float16, torch.bfloat16) + (() if kernel.startswith("mma") else (torch.float32,))
    for dtype in dtypes:
        for m in (1, 3, 16):
            x = torch.randn(m, k, generator=gen, device="cuda").to(dtype)
            cfg = _config(kernel, m, n, k, qw, dtype)
            got = run(x, qw, bias, -math.inf, math.inf, cfg, kp)
            xp = x[:, perm].contiguous()
            want = run(xp, qw, bias, -math.inf, math.inf, cfg)
            r = ref.matmul(xp, qw, bias, None, out_dtype=torch.float64)
            err = float((got.double() - r).norm() / r.norm())
            assert err <= TOL[dtype], f"{dtype} M={m}: rel err {err:.2e} against the reference"
            assert torch.equal(got, want), (f"{dtype} M={m}: differs from the same kernel on x[:, perm] (max "
                                            f"{(got.float() - want.float()).abs().max().item():.3e})")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("k", [64, 1000, 4096 + 17])
def test_gather_kernel_writes_x_permuted_and_zero_padded(dtype, k):
    from mixgemm.kernels.cuda.gather_x import gather_x

    gen = torch.Generator(device="cuda").manual_seed(k)
    perm = torch.randperm(k, generator=gen, device="cuda")
    kp = kernel_perm(perm)
    for m in (1, 3, 16):
        wide = torch.randn(m, k + 24, generator=gen, device="cuda").to(dtype)
        # rows with an aligned and an unaligned start
        for start in (0, 5):
            x = wide[:, start:start + k] if start else wide[:, :k]
            before = wide.clone()
            got = gather_x(x, kp)
            assert got.shape == (m, kp.numel()) and got.is_contiguous()
            assert torch.equal(got[:, :k], x[:, perm]), (dtype, m, start)
            assert not got[:, k:].any(), "the padding past K must be zero"
            assert torch.equal(wide, before)


@pytest.mark.gpu
def test_gather_kernel_rejects_a_bad_perm():
    from mixgemm.kernels.cuda.gather_x import gather_x

    x = torch.randn(1, 128, device="cuda").half()
    with pytest.raises(ValueError, match="int32 kernel permutation"):
        gather_x(x, torch.randperm(128, device="cuda"))
    with pytest.raises(ValueError, match="int32 kernel permutation"):
        gather_x(x, torch.arange(64, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="unit stride"):
        gather_x(x.t(), kernel_perm(torch.randperm(1, device="cuda")))


@pytest.mark.gpu
def test_gathering_gemv_rejects_a_bad_perm():
    gen = torch.Generator(device="cuda").manual_seed(3)
    qw = quantize_weight(torch.randn(64, 512, generator=gen, device="cuda"), bits=4, group_size=128)
    x = torch.randn(1, 512, generator=gen, device="cuda").half()
    cfg = _config("simt", 1, 64, 512, qw, torch.float16)
    with pytest.raises(ValueError, match="int32"):
        gemv_host.gemv_simt(x, qw, None, -math.inf, math.inf, cfg, torch.randperm(512, device="cuda"))
    with pytest.raises(ValueError, match=">= 512 entries"):
        gemv_host.gemv_simt(x, qw, None, -math.inf, math.inf, cfg, torch.arange(256, dtype=torch.int32, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_quantlinear_gathers_in_the_gemv(dtype, torch_gen):
    """Eager, torch.library's op and a CUDA-graph replay give the same output; decode runs the gathering GEMV, larger
    M the separate gather where the plan says so."""
    import mixgemm
    from mixgemm.nn.linear import QuantLinear
    from mixgemm.ops.dispatch import plans_of

    k, n = 4096 + 128, 512
    qw = quantize_weight(torch.randn(n, k, generator=torch_gen), bits=4, group_size=128, mode="zero_point")
    perm = torch.randperm(k, generator=torch_gen)
    layer = QuantLinear.from_quantized(qw, torch.randn(n, generator=torch_gen), input_perm=perm).cuda().to(dtype)
    w = dequantize_weight(layer.quantized_weight(), torch.float32)
    for m in (1, 3, 64):
        x = torch.randn(m, k, generator=torch_gen).to(dtype).cuda()
        want = F.linear(x.float()[:, layer.input_perm], w, layer.bias.float())
        with torch.no_grad():
            got = layer(x)
            via_op = torch.ops.mixgemm.linear_wxa16(x, layer.qweight, layer.scales, layer.zeros, layer.offsets,
                                                    layer.bias, 4, 128, "zero_point", n, k, -math.inf, math.inf,
                                                    layer.input_perm)
        choice = mixgemm.explain(x, layer.quantized_weight(), act_order=True)
        for y in (got, via_op):
            err = float((y.double() - want.double()).norm() / want.double().norm())
            assert err <= TOL[dtype], (m, err)
        if choice.kernel.startswith("cuda_gemv"):  # the GEMVs reduce without atomics: the two paths agree exactly
            assert torch.equal(got, via_op)
        assert choice.perm_in_kernel or m > 1, str(choice)  # decode gathers in the GEMV
        plan = plans_of(layer.quantized_weight())[("linear", m, dtype, x.get_device(), True)]
        assert plan.perm_in_kernel == choice.perm_in_kernel
    static_x = torch.randn(1, k, generator=torch_gen).to(dtype).cuda()
    with torch.no_grad():
        layer(static_x)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = layer(static_x)
        static_x.copy_(torch.randn(1, k, generator=torch_gen).to(dtype))
        graph.replay()
        assert torch.equal(static_y, layer(static_x))
