"""mixgemm's RMSNorm: torch.ops.mixgemm.rms_norm / add_rms_norm, gathered through an act-order permutation or not
(kernels/cuda/rms_norm.cu on CUDA, the torch composite elsewhere), the check that a model's norm computes that formula
(mixgemm.nn.norms.rms_norm_eps), the hooks that hand a model's norms to it under torch.compile, and the inductor pass
that moves the residual add into the norm's kernel (mixgemm.ops.fuse_norm_add).

CPU: the composite equals transformers' RMSNorm gathered, bit for bit; the pass rewrites a traced graph and a
compiled tiny Llama keeps its logits; NVRTC compiles every variant. GPU: the kernel against a float64 norm of the same
h (h itself bit-equal to torch's a + b) over dtypes, rows 1..129, widths from 64 to beyond what each thread holds
before its PDL wait, unaligned and odd widths (the composite), CUDA-graph replay; inputs never modified."""

from __future__ import annotations

import pytest
import torch
from test_norm_feeds import TINY, logits, tiny_model, with_act_order  # noqa: E402
from torch import nn

import mixgemm  # noqa: F401  (registers torch.ops.mixgemm)
from mixgemm.kernels.cuda import nvrtc
from mixgemm.nn.norms import (
    EAGER_NORM_ATTR,
    RMS_EPS_ATTR,
    eager_norm_kernels,
    gather_act_order_at_norms,
    norm_kernels_at_norms,
    rms_norm_eps,
)

TINY_VOCAB = TINY["vocab_size"]

needs_nvrtc = pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="cuda-bindings / libnvrtc not installed")
TOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-5}


def _llama_norm(k: int, eps: float = 1e-5):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(k, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(k, generator=torch.Generator().manual_seed(k)) + 0.5)
    return norm


def test_composite_equals_transformers_rmsnorm_gathered():
    norm = _llama_norm(96, eps=1e-6)
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 5, 96, generator=gen), torch.randn(2, 5, 96, generator=gen)
    perm = torch.randperm(96, generator=gen)
    before = (a.clone(), b.clone())
    with torch.no_grad():
        want = norm(a + b)[..., perm]
        got = torch.ops.mixgemm.rms_norm(a + b, norm.weight, 1e-6, perm)
        h, y = torch.ops.mixgemm.add_rms_norm(a, b, norm.weight, 1e-6, perm)
    assert torch.equal(got, want) and torch.equal(y, want) and torch.equal(h, a + b)
    with torch.no_grad():
        assert torch.equal(torch.ops.mixgemm.rms_norm(a + b, norm.weight, 1e-6), norm(a + b))
        h, y = torch.ops.mixgemm.add_rms_norm(a, b, norm.weight, 1e-6, None)
    assert torch.equal(y, norm(a + b).detach()) and torch.equal(h, a + b)
    assert torch.equal(a, before[0]) and torch.equal(b, before[1])


def test_ops_reject_mismatched_inputs():
    w, perm = torch.ones(8), torch.randperm(8)
    with pytest.raises(ValueError, match="input_perm must be int64"):
        torch.ops.mixgemm.rms_norm(torch.randn(2, 8), w, 1e-6, perm.int())
    with pytest.raises(ValueError, match=r"weight must be \[8\]"):
        torch.ops.mixgemm.rms_norm(torch.randn(2, 8), torch.ones(9), 1e-6, perm)
    with pytest.raises(ValueError, match="one shape, dtype and device"):
        torch.ops.mixgemm.add_rms_norm(torch.randn(2, 8), torch.randn(1, 8), w, 1e-6, perm)


def test_rms_norm_eps_accepts_only_that_formula():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    assert rms_norm_eps(_llama_norm(64, 1e-5), 64) == 1e-5
    assert rms_norm_eps(Qwen2RMSNorm(64, eps=1e-6), 64) == 1e-6
    assert rms_norm_eps(_llama_norm(64), 32) is None  # another width
    assert rms_norm_eps(GemmaRMSNorm(64, eps=1e-6), 64) is None  # x * (1 + weight)
    assert rms_norm_eps(nn.LayerNorm(64), 64) is None  # mean subtracted, a bias
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    with torch.device("meta"):
        meta = LlamaRMSNorm(64)
    assert rms_norm_eps(meta, 64) is None  # nothing to check it on


def _traced(gathered=True, eps=1e-6):
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(a, b, w, perm):
        h = a + b
        return h * 2, torch.ops.mixgemm.rms_norm(h, w, eps, perm if gathered else None)

    gen = torch.Generator().manual_seed(1)
    args = (torch.randn(3, 64, generator=gen), torch.randn(3, 64, generator=gen), torch.rand(64, generator=gen) + 0.5,
            torch.randperm(64, generator=gen))
    return f, make_fx(f, tracing_mode="fake")(*args), args


@pytest.mark.parametrize("gathered", [True, False])
def test_pass_moves_the_residual_add_into_the_norm(gathered):
    from mixgemm.ops.fuse_norm_add import fuse_residual_adds

    f, gm, args = _traced(gathered)
    assert fuse_residual_adds(gm.graph) == 1
    gm.graph.lint()
    gm.recompile()
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.mixgemm.add_rms_norm.default in targets
    assert torch.ops.aten.add.Tensor not in targets and torch.ops.mixgemm.rms_norm.default not in targets
    for got, want in zip(gm(*args), f(*args), strict=True):
        assert torch.equal(got, want)
    assert fuse_residual_adds(gm.graph) == 0  # nothing left


def test_pass_leaves_a_broadcast_add_alone():
    from torch.fx.experimental.proxy_tensor import make_fx

    from mixgemm.ops.fuse_norm_add import fuse_residual_adds

    def f(a, b, w, perm):
        return torch.ops.mixgemm.rms_norm(a + b, w, 1e-6, perm)

    gm = make_fx(f, tracing_mode="fake")(torch.randn(3, 64), torch.randn(1, 64), torch.ones(64), torch.randperm(64))
    assert fuse_residual_adds(gm.graph) == 0


def test_install_keeps_a_pass_already_there(monkeypatch):
    from torch._inductor import config

    from mixgemm.ops import fuse_norm_add

    monkeypatch.setattr(config, "post_grad_custom_post_pass", None)
    fuse_norm_add.install()
    fuse_norm_add.install()
    assert config.post_grad_custom_post_pass is fuse_norm_add.PASS
    calls = []

    class Theirs(fuse_norm_add.CustomGraphPass):
        def __call__(self, graph):
            calls.append(graph)

        def uuid(self):
            return "theirs"

    monkeypatch.setattr(config, "post_grad_custom_post_pass", Theirs())
    fuse_norm_add.install()
    fuse_norm_add.install()
    both = config.post_grad_custom_post_pass
    _, gm, _ = _traced()
    both(gm.graph)
    assert calls == [gm.graph] and both.uuid()[0] == "theirs"
    assert not any(n.target is torch.ops.aten.add.Tensor for n in gm.graph.nodes)


def test_compiled_model_runs_the_fused_norms(monkeypatch):
    """Inductor on the CPU, an act-order Llama (on the CPU the norms of plain layers stay the compiler's; on CUDA:
    test_compiled_llama_on_the_gpu): the pass finds the residual adds of the norms that gather (every one but the
    first, whose input is the embedding) and the compiled logits equal eager's within float32 rounding."""
    import mixgemm.ops.fuse_norm_add as fna

    model = with_act_order(tiny_model("llama"))
    gather_act_order_at_norms(model)
    want = logits(model)
    norms = [n for n, m in model.named_modules() if hasattr(m, RMS_EPS_ATTR)]
    assert len(norms) == 4
    fused = []
    real = fna.fuse_residual_adds
    monkeypatch.setattr(fna, "fuse_residual_adds", lambda graph: fused.append(real(graph)) or fused[-1])
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)  # (a cached graph skips the passes)
    torch._dynamo.reset()
    try:
        got = logits(torch.compile(model, fullgraph=True))
    finally:
        torch._dynamo.reset()
    assert sum(fused) == 3, fused
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("es,bf16", [(2, 0), (2, 1), (4, 0)])
@pytest.mark.parametrize("add", [0, 1])
@pytest.mark.parametrize("gather", [0, 1])
@pytest.mark.parametrize("unit", [0, 1])
def test_nvrtc_compiles_the_kernel(arch, es, bf16, add, gather, unit):
    defs = {"RN_ES": es, "RN_BF16": bf16, "RN_ADD": add, "RN_PERM": gather, "RN_PRE": 2, "RN_UNIT": unit}
    cubin = nvrtc.compile_cubin("rms_norm.cu", tuple(sorted(defs.items())), arch)
    assert len(cubin) > 1000 and cubin[:4] == b"\x7fELF"


def _float64_norm(h: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h64 = h.double()
    return w.double() * h64 * torch.rsqrt(h64.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("k", [64, 576, 3584, 4096, 8192, 16384, 24576, 100, 4096 + 4])
def test_kernel_equals_the_norm(dtype, k, rel_err):
    gen = torch.Generator(device="cuda").manual_seed(k)
    eps = 1e-5
    w = (torch.rand(k, generator=gen, device="cuda") + 0.5).to(dtype)
    perm = torch.randperm(k, generator=gen, device="cuda")
    for m in (1, 3, 17, 129):
        a = (torch.randn(m, k, generator=gen, device="cuda") * 3).to(dtype)
        b = torch.randn(m, k, generator=gen, device="cuda").to(dtype)
        before = (a.clone(), b.clone(), w.clone())
        h, y = torch.ops.mixgemm.add_rms_norm(a, b, w, eps, perm)
        assert torch.equal(h, a + b), (dtype, k, m)
        assert rel_err(y, _float64_norm(h, w, eps)[:, perm]) < TOL[dtype], (dtype, k, m)
        y1 = torch.ops.mixgemm.rms_norm(h, w, eps, perm)
        assert torch.equal(y1, y), (dtype, k, m)
        h2, y2 = torch.ops.mixgemm.add_rms_norm(a, b, w, eps)
        assert torch.equal(h2, h) and torch.equal(y2[:, perm], y), (dtype, k, m)  # the same numbers, in order
        assert all(torch.equal(t, t0) for t, t0 in zip((a, b, w), before, strict=True))


@pytest.mark.gpu
def test_kernel_takes_strided_and_batched_rows(rel_err):
    gen = torch.Generator(device="cuda").manual_seed(0)
    k = 1024
    wide = torch.randn(2, 3, k + 64, generator=gen, device="cuda").half()
    x = wide[..., 8:8 + k]  # 16-byte aligned rows with a row stride of k + 64
    w = (torch.rand(k, generator=gen, device="cuda") + 0.5).half()
    perm = torch.randperm(k, generator=gen, device="cuda")
    y = torch.ops.mixgemm.rms_norm(x, w, 1e-6, perm)
    assert y.shape == x.shape
    assert rel_err(y, _float64_norm(x, w, 1e-6)[..., perm]) < TOL[torch.float16]
    assert torch.ops.mixgemm.rms_norm(x[:0], w, 1e-6, perm).shape == (0, 3, k)


@pytest.mark.gpu
def test_kernel_replays_in_a_cuda_graph():
    gen = torch.Generator(device="cuda").manual_seed(1)
    k = 4096
    w = (torch.rand(k, generator=gen, device="cuda") + 0.5).half()
    perm = torch.randperm(k, generator=gen, device="cuda")
    a = torch.randn(1, k, generator=gen, device="cuda").half()
    b = torch.randn(1, k, generator=gen, device="cuda").half()
    torch.ops.mixgemm.add_rms_norm(a, b, w, 1e-5, perm)  # warm-up: compile, kernel permutation
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        h, y = torch.ops.mixgemm.add_rms_norm(a, b, w, 1e-5, perm)
    a.copy_(torch.randn(1, k, generator=gen, device="cuda").half())
    graph.replay()
    want_h, want_y = torch.ops.mixgemm.add_rms_norm(a, b, w, 1e-5, perm)
    torch.cuda.synchronize()
    assert torch.equal(h, want_h) and torch.equal(y, want_y)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("act_order", [True, False])
def test_compiled_llama_on_the_gpu(dtype, act_order):
    """A tiny transformers Llama (with act-order layers or not), the norms computed by mixgemm's kernel and the
    residual adds fused by the pass: compiled logits equal eager's within the dtype's tolerance."""
    model = tiny_model("llama")
    if act_order:
        model = with_act_order(model)
    model = model.to("cuda", dtype)
    ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(5)).cuda()
    with torch.no_grad():
        want = model(ids).logits.float()
        gather_act_order_at_norms(model)
        assert len([m for m in model.modules() if hasattr(m, RMS_EPS_ATTR)]) == 4
        torch._dynamo.reset()
        try:
            got = torch.compile(model, fullgraph=True)(ids).logits.float()
        finally:
            torch._dynamo.reset()
    err = ((got - want).norm() / want.norm()).item()
    assert err < 4 * TOL[dtype], err  # (a whole model: eager and inductor round its other ops differently)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("arch,norms", [("llama", 4), ("qwen2", 4), ("gemma2", 0)])
def test_plain_models_hand_their_norms_to_the_kernel(arch, norms, device):
    """quantize_ gives the norms feeding only QuantLinears the hook (transformers' RMSNorm formula only), and every
    other RMSNorm (the final norm; Gemma-2's four a layer, 1 + weight) the kernel in eager mode only; eager on CUDA the
    logits keep within float32 rounding of the norms' own forwards; compiled on CUDA, each hooked norm is one
    mixgemm.rms_norm without a permutation (on the CPU the compiler keeps its own), nothing gathers; use_inductor_norms
    takes it all back."""
    from mixgemm.nn.norms import use_inductor_norms

    model = tiny_model(arch).to(device)
    ids = torch.randint(0, TINY_VOCAB, (2, 7), generator=torch.Generator().manual_seed(5)).to(device)

    def run(m):
        with torch.no_grad():
            return m(ids).logits

    found = [n for n, m in model.named_modules() if hasattr(m, RMS_EPS_ATTR)]
    assert len(found) == norms and all(n.endswith("layernorm") for n in found)
    # every other RMSNorm computes the kernel in eager mode only (no hook: the compiler keeps its own forward)
    taken = [n for n, m in model.named_modules() if hasattr(m, RMS_EPS_ATTR) or EAGER_NORM_ATTR in vars(m)]
    assert "model.norm" in taken and len(taken) == (9 if arch == "gemma2" else norms + 1)
    assert norm_kernels_at_norms(model) == [] and eager_norm_kernels(model) == []  # quantize_ did it already
    eager = run(model)  # on CUDA the norms' eager forward is the kernel (EagerNormForward), on the CPU their own
    own = {name: vars(model.get_submodule(name)).pop("forward") for name in taken}
    want = run(model)
    for name, forward in own.items():
        model.get_submodule(name).forward = forward
    if device == "cpu":
        assert torch.equal(eager, want)
    else:
        assert (eager - want).abs().max().item() <= 1e-5 * want.abs().max().item()

    def count(gm, example_inputs):
        calls = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        seen.append((sum(t in (torch.ops.mixgemm.rms_norm, torch.ops.mixgemm.rms_norm.default) for t in calls),
                     sum(t in (torch.ops.mixgemm.gather_columns, torch.ops.mixgemm.gather_columns.default)
                         for t in calls)))
        return gm

    for first, expect in ((True, norms if device == "cuda" else 0), (False, 0)):
        seen = []
        torch._dynamo.reset()
        try:
            got = run(torch.compile(model, backend=count, fullgraph=True))
        finally:
            torch._dynamo.reset()
        assert [sum(c) for c in zip(*seen, strict=True)] == [expect, 0], seen
        assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
        assert use_inductor_norms(model) == (taken if first else [])  # taken back after the first round
    assert not any(m._forward_hooks or "forward" in vars(m) for m in model.modules())
    assert torch.equal(run(model), want)


def test_act_order_and_plain_norms_together():
    """An act-order model: the norms of q / k / v and gate / up gather (gather_act_order_at_norms), and keep the
    kernel after use_inductor_norms (then gathering the module's output); norm_kernels_at_norms adds none."""
    from mixgemm.nn.norms import PERM_BUFFER, use_inductor_norms

    model = with_act_order(tiny_model("llama"))
    assert len(gather_act_order_at_norms(model)) == 10
    assert norm_kernels_at_norms(model) == []
    hooked = [m for m in model.modules() if PERM_BUFFER in m._buffers]
    assert len(hooked) == 4 and all(hasattr(m, RMS_EPS_ATTR) for m in hooked)
    taken = use_inductor_norms(model)  # the four hooked norms, and the final norm's eager kernel
    assert len(taken) == 5 and taken[-1] == "model.norm"
    assert all(m._forward_hooks and not hasattr(m, RMS_EPS_ATTR) for m in hooked)


def test_eager_norm_kernels_take_every_other_rms_norm():
    """eager_norm_kernels (in quantize_) gives the RMSNorms that feed no mixgemm layer alone the eager kernel: Gemma-2's
    four a layer and its final norm (1 + weight: unit_offset_rms_norm, equal to transformers' bit for bit), Qwen3's
    per-head q / k norms; a LayerNorm or a norm of another formula keeps its forward; on the CPU the logits are the
    norms' own; use_inductor_norms takes them back."""
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

    from mixgemm.nn.norms import use_inductor_norms
    from mixgemm.reference.norm import unit_offset_rms_norm

    gemma = Gemma2RMSNorm(96, eps=1e-6)
    with torch.no_grad():
        gemma.weight.copy_(torch.randn(96, generator=torch.Generator().manual_seed(3)) * 0.1)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = (torch.randn(5, 96, generator=torch.Generator().manual_seed(4)) * 3).to(dtype)
        assert torch.equal(unit_offset_rms_norm(x, gemma.weight.to(dtype), 1e-6), gemma.to(dtype)(x))
    assert rms_norm_eps(gemma, 96) is None and rms_norm_eps(gemma, 96, unit=True) == 1e-6
    expect = {"gemma2": [f"model.layers.{i}.{n}" for i in range(2) for n in (
                  "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm")] + ["model.norm"],
              "qwen3": [f"model.layers.{i}.self_attn.{n}" for i in range(2) for n in ("q_norm", "k_norm")]
              + ["model.norm"]}
    for arch, names in expect.items():
        model = tiny_model(arch)
        got = {n: vars(m)[EAGER_NORM_ATTR] for n, m in model.named_modules() if EAGER_NORM_ATTR in vars(m)}
        assert list(got) == names and all(unit == (arch == "gemma2") for _, unit in got.values()), got
        want = logits(model)
        assert [n for n in use_inductor_norms(model) if n in got] == names
        assert torch.equal(logits(model), want)
    plain = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), _llama_norm(64))
    plain[2].forward = lambda h: type(plain[2]).forward(plain[2], h)  # an instance-level forward of its own
    assert eager_norm_kernels(plain) == []


def test_eager_norm_forward_keeps_the_module_formula_elsewhere():
    """The instance-level forward the hooked norms get (EagerNormForward): on the CPU, with autograd recording, with
    keyword arguments or a weight of another dtype it is the module's own forward, bit for bit; a norm that had an
    instance-level forward of its own keeps it; copies and pickles of the model carry it."""
    import copy
    import pickle

    from mixgemm.nn.norms import EagerNormForward

    model = tiny_model("llama")
    norms = [m for m in model.modules() if hasattr(m, RMS_EPS_ATTR)]
    assert len(norms) == 4 and all(isinstance(vars(m)["forward"], EagerNormForward) for m in norms)
    norm = norms[0]
    x = torch.randn(3, norm.weight.numel(), requires_grad=True)
    assert torch.equal(norm(x), type(norm).forward(norm, x))
    assert torch.equal(norm(hidden_states=x), type(norm).forward(norm, x))
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        forwards = [vars(m)["forward"] for m in twin.modules() if hasattr(m, RMS_EPS_ATTR)]
        assert len(forwards) == 4 and all(isinstance(f, EagerNormForward) for f in forwards)
        assert all(vars(f.norm)["forward"] is f for f in forwards)  # bound to the copy, not the original
        assert torch.equal(logits(twin), logits(model))
    wrapped = tiny_model("llama")
    mine = wrapped.model.layers[0].input_layernorm
    mine.__dict__.pop(RMS_EPS_ATTR)
    mine.__dict__.pop("_mixgemm_norm_hook")
    mine._forward_hooks.clear()
    del mine.forward
    theirs = mine.forward = lambda h: type(mine).forward(mine, h)
    norm_kernels_at_norms(wrapped)
    assert vars(mine)["forward"] is theirs and hasattr(mine, RMS_EPS_ATTR)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("k", [64, 3584, 4096 + 8])
def test_eager_kernel_computes_gemmas_formula(dtype, k, rel_err):
    """A Gemma-2 RMSNorm (1 + weight, rounded once) given the eager kernel (eager_norm_kernels): rows 1, 3, 17, 129
    within the dtype's tolerance of a float64 norm of that formula, and of the module's own forward."""
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

    gen = torch.Generator(device="cuda").manual_seed(k)
    holder = nn.Sequential(Gemma2RMSNorm(k, eps=1e-6)).to("cuda", dtype)
    norm = holder[0]
    with torch.no_grad():
        norm.weight.copy_((torch.randn(k, generator=gen, device="cuda") * 0.3).to(dtype))
    assert eager_norm_kernels(holder) == ["0"] and vars(norm)[EAGER_NORM_ATTR] == (1e-6, True)
    for m in (1, 3, 17, 129):
        x = (torch.randn(m, k, generator=gen, device="cuda") * 3).to(dtype)
        with torch.no_grad():
            y = norm(x)
            own = type(norm).forward(norm, x)
        want = (1 + norm.weight.double()) * _float64_norm(x, torch.ones_like(norm.weight), 1e-6)
        assert y.dtype == dtype and rel_err(y, want) < TOL[dtype] and rel_err(own, want) < TOL[dtype], m


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_eager_norm_forward_is_the_kernel_on_the_gpu(dtype, rel_err, monkeypatch):
    """Eager on CUDA a hooked norm is one launch of mixgemm's kernel (rows 1, 3, 17, 129 and a batch), within the
    dtype's tolerance of a float64 norm, a repeated shape through the launch the norm kept (KeptNorm), also after its
    weight is written in place or swapped; an input it does not take (autograd, 0 rows) runs the module's forward."""
    import mixgemm.kernels.cuda.rms_norm as rn
    from mixgemm.nn.norms import KEPT_NORM_ATTR

    model = tiny_model("llama").to("cuda", dtype)
    norm = next(m for m in model.modules() if hasattr(m, RMS_EPS_ATTR))
    k = norm.weight.numel()
    launches = []
    for name in ("__call__", "rows"):
        real = getattr(rn.NormLaunch, name)
        monkeypatch.setattr(rn.NormLaunch, name,
                            lambda self, *a, _real=real, _name=name: launches.append(_name) or _real(self, *a))
    gen = torch.Generator(device="cuda").manual_seed(2)
    for shape in ((1, k), (3, k), (17, k), (129, k), (2, 5, k)):
        for _ in range(2):  # the second call: the kept launch
            x = (torch.randn(shape, generator=gen, device="cuda") * 3).to(dtype)
            before = x.clone()
            with torch.no_grad():
                y = norm(x)
            assert y.shape == x.shape and y.dtype == dtype and torch.equal(x, before)
            assert rel_err(y, _float64_norm(x, norm.weight, norm.variance_epsilon)) < TOL[dtype], shape
        assert norm.__dict__[KEPT_NORM_ATTR].key[0] == x.shape
    assert launches == ["rows"] * 10
    with torch.no_grad():
        norm.weight.mul_(0.5)  # in place: the kept launch no longer applies (its check), the result follows it
        assert rel_err(norm(x), _float64_norm(x, norm.weight, norm.variance_epsilon)) < TOL[dtype]
        norm.weight.data = norm.weight.data * 3  # another tensor's memory
        assert rel_err(norm(x), _float64_norm(x, norm.weight, norm.variance_epsilon)) < TOL[dtype]
        strided = torch.randn(2, 5, 2 * k, device="cuda", dtype=dtype)[..., :k]  # the kept shape, not contiguous
        assert rel_err(norm(strided), _float64_norm(strided, norm.weight, norm.variance_epsilon)) < TOL[dtype]
    assert launches == ["rows"] * 12 + ["__call__"]
    x = torch.randn(2, k, device="cuda", dtype=dtype, requires_grad=True)
    assert torch.equal(norm(x), type(norm).forward(norm, x)) and norm(x[:0]).shape == (0, k)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.two_tensor import TwoTensor

    with torch.no_grad():
        x = torch.randn(2, k, device="cuda", dtype=dtype)
        assert torch.equal(norm(TwoTensor(x, x)).a, type(norm).forward(norm, x))  # a subclass: no data pointer
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            assert norm(mode.from_tensor(x)).shape == (2, k)
    assert len(launches) == 13
