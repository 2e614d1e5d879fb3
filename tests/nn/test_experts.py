"""Quantized mixture-of-experts layers (mixgemm.nn.experts): transformers' fused experts modules through quantize_,
against the float64 product of the same quantized weights, and through save_pretrained / from_pretrained."""

import warnings

import pytest
import torch
from torch import nn

import mixgemm
from mixgemm.kernels.cuda import nvrtc
from mixgemm.nn.experts import (
    ExpertList,
    QuantizedExperts,
    dequantize_experts_,
    prepare_skeleton,
    routed_why_not,
)

pytestmark = pytest.mark.slow(seconds=40)

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

# tiny configs of the fused-experts architectures: plain gated (Mixtral, Qwen3-MoE), a shared expert beside the
# routed ones (Qwen2-MoE), transposed weights with biases and interleaved gate / up rows (GPT-OSS)
ARCHS = {
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(num_experts=6, moe_intermediate_size=192, num_experts_per_tok=3),
    "qwen2_moe": dict(num_experts=4, moe_intermediate_size=64, shared_expert_intermediate_size=128,
                      num_experts_per_tok=2),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16),
}


def tiny_model(arch: str, seed: int = 0, **overrides) -> nn.Module:
    cfg = AutoConfig.for_model(arch, **{**dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, vocab_size=97),
                                        **ARCHS[arch], **overrides})
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(cfg).eval()
    for name, p in model.named_parameters():  # random weights and biases (transformers zeroes GPT-OSS's biases)
        if p.dim() >= 2 or "bias" in name:
            p.data.normal_(0, 0.05)
    return model


def experts_modules(model):
    return [m for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "num_experts")]


def float64_twin(module: QuantizedExperts):
    """The experts module's product in float64 on its dequantized weights, token by token and slot by slot (the
    semantics of transformers' eager experts: x -> first projection (+ bias) -> the module's gate or activation ->
    down projection (+ bias) -> times the routing weight, summed over the token's slots)."""
    import copy

    twin = copy.deepcopy(module)
    dequantize_experts_(twin, torch.float64)
    twin = twin.double().cpu()
    first = twin.gate_up_proj if twin.has_gate else twin.up_proj
    b1 = getattr(twin, "gate_up_proj_bias" if twin.has_gate else "up_proj_bias", None)
    down, b2 = twin.down_proj, getattr(twin, "down_proj_bias", None)
    if twin.is_transposed:
        first, down = first.transpose(1, 2), down.transpose(1, 2)

    def product(x, idx, w):
        out = torch.zeros(x.shape[0], down.shape[1], dtype=torch.float64)
        for t in range(x.shape[0]):
            for s in range(idx.shape[1]):
                e = int(idx[t, s])
                if e >= first.shape[0]:
                    continue  # expert parallelism's sentinel: no local expert
                h = first[e] @ x[t] + (0 if b1 is None else b1[e])
                h = twin._apply_gate(h[None])[0] if twin.has_gate else twin.act_fn(h)
                out[t] += w[t, s] * (down[e] @ h + (0 if b2 is None else b2[e]))
        return out

    return product


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("fmt", ["w4_sym", "w4_zp", "w8"])
def test_experts_module_matches_float64(arch, fmt):
    model = tiny_model(arch)
    config = {"w4_sym": mixgemm.W4A16(group_size=32), "w4_zp": mixgemm.W4A16(group_size=64, mode="zero_point"),
              "w8": mixgemm.W8A16()}[fmt]
    report = mixgemm.quantize_(model, config)
    assert not report.skipped
    for mod in experts_modules(model):
        assert isinstance(mod, QuantizedExperts)
        assert not [n for n, p in mod.named_parameters(recurse=False)]  # no float expert weights left
        ref = float64_twin(mod)
        k = model.config.num_experts_per_tok
        e = mod.num_experts
        for t in (0, 1, 3, 17):
            gen = torch.Generator().manual_seed(t)
            x = torch.randn(t, 64, generator=gen)
            idx = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)]) if t else \
                torch.empty(0, k, dtype=torch.int64)
            w = torch.rand(t, k, generator=gen)
            x0, idx0, w0 = x.clone(), idx.clone(), w.clone()
            with torch.no_grad():
                got = mod(x, idx, w)
                want = ref(x.double(), idx, w.double())
            assert got.shape == (t, 64) and got.dtype == torch.float32
            assert torch.equal(x, x0) and torch.equal(idx, idx0) and torch.equal(w, w0)  # inputs untouched
            if t:
                err = ((got.double() - want).abs().max() / want.abs().max()).item()
                assert err < 1e-5, (arch, fmt, t, err)


def test_experts_bf16_matches_float64():
    model = tiny_model("qwen3_moe").to(torch.bfloat16)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    mod = experts_modules(model)[0]
    ref = float64_twin(mod)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(6, generator=gen)[:3] for _ in range(5)])
    w = torch.rand(5, 3, generator=gen).to(torch.bfloat16)
    with torch.no_grad():
        got = mod(x, idx, w)
        want = ref(x.double(), idx, w.double())
    assert got.dtype == torch.bfloat16
    assert ((got.double() - want).abs().max() / want.abs().max()).item() < 1e-2


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_quantized_moe_model_matches_dequantized_twin(arch):
    from mixgemm.integrations.hf import dequantized_copy

    model = tiny_model(arch)
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    experts = [n for n, m in model.named_modules() if isinstance(m, QuantizedExperts)]
    assert len(experts) == 2
    for name in experts:  # every expert's projections are reported by name
        mod = model.get_submodule(name)
        for proj in (("gate_up_proj", "down_proj")):
            assert all(f"{name}.{proj}.{e}" in report.replaced for e in range(mod.num_experts))
    twin = dequantized_copy(model, torch.float32)
    assert not [m for m in twin.modules() if isinstance(m, QuantizedExperts)]
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, twin(ids).logits, rtol=1e-4, atol=1e-5)
        assert torch.allclose(model(ids[:1, :1]).logits, twin(ids[:1, :1]).logits, rtol=1e-4, atol=1e-5)
    held = sum(mixgemm.resident_bytes(model.get_submodule(n))["total"] for n in experts)
    float_bytes = sum(p.numel() * 4 for m in experts_modules(twin) for p in m.parameters())
    assert held < float_bytes / 6  # the experts went from fp32 to int4 g32 (fp16 scales: 4.5 bits a weight)


@pytest.mark.parametrize("arch", ["mixtral", "gpt_oss"])
def test_moe_checkpoint_roundtrip(arch, tmp_path):
    model = tiny_model(arch)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32, mode="zero_point"))
    model.save_pretrained(tmp_path / "q")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "q" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    # saved under the model's own names (transformers would otherwise rename Mixtral's experts to w1 / w2 / w3)
    assert "model.layers.0.mlp.experts.gate_up_proj.3.qweight" in keys
    ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids).logits
        ours = mixgemm.from_pretrained(str(tmp_path / "q"), progress=False)
        assert torch.equal(ours(ids).logits, want)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "q")).eval()
        assert isinstance(theirs.model.layers[0].mlp.experts, QuantizedExperts)
        assert torch.equal(theirs(ids).logits, want)
    theirs.save_pretrained(tmp_path / "again")
    with safe_open(str(tmp_path / "again" / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == keys


def test_float_checkpoint_with_fused_experts_quantizes_on_load(tmp_path):
    model = tiny_model("gpt_oss")
    model.save_pretrained(tmp_path / "f")  # GPT-OSS stores its experts fused, as the model holds them
    loaded = mixgemm.from_pretrained(str(tmp_path / "f"), quantization_config=mixgemm.W4A16(group_size=32),
                                     progress=False)
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    assert sorted(loaded.mixgemm_report.quantized) == sorted(report.replaced)
    assert all(isinstance(m, QuantizedExperts) for m in experts_modules(loaded))
    ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe", "qwen2_moe"])
def test_float_checkpoint_under_original_names_quantizes_on_load(arch, tmp_path):
    """Checkpoints as published (one tensor per expert; Mixtral's block_sparse_moe / w1 w2 w3): read through
    transformers' conversion mapping, each experts module built and quantized as it is read, the same model as
    transformers' load followed by quantize_."""
    model = tiny_model(arch)
    model.save_pretrained(tmp_path / "f")  # transformers writes the original names
    from safetensors import safe_open

    stored = set(safe_open(str(next((tmp_path / "f").glob("*.safetensors"))), "pt").keys())
    assert not any(k.endswith("gate_up_proj") for k in stored)  # per expert on disk
    loaded = mixgemm.from_pretrained(str(tmp_path / "f"), quantization_config=mixgemm.W4A16(group_size=32),
                                     progress=False)
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    assert sorted(loaded.mixgemm_report.quantized) == sorted(report.replaced)
    assert loaded.mixgemm_report.ignored == []  # every stored tensor was used
    assert all(isinstance(m, QuantizedExperts) for m in experts_modules(loaded))
    ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_float_checkpoint_missing_an_expert_is_an_error(tmp_path):
    from safetensors.torch import load_file, save_file

    model = tiny_model("qwen3_moe")
    model.save_pretrained(tmp_path / "f")
    path = next((tmp_path / "f").glob("*.safetensors"))
    tensors = load_file(str(path))
    del tensors["model.layers.1.mlp.experts.5.up_proj.weight"]
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="lacks part 1 of expert 5 of 'model.layers.1.mlp.experts.gate_up_proj'"):
        mixgemm.from_pretrained(str(tmp_path / "f"), quantization_config=mixgemm.W4A16(group_size=32),
                                progress=False)
    del tensors["model.layers.1.mlp.experts.5.gate_proj.weight"]
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"holds experts \[0, 1, 2, 3\]... \(5\) of .*the model has 6"):
        mixgemm.from_pretrained(str(tmp_path / "f"), quantization_config=mixgemm.W4A16(group_size=32),
                                progress=False)


def test_float_checkpoint_experts_excluded_by_filter_stay_float(tmp_path):
    model = tiny_model("mixtral")
    model.save_pretrained(tmp_path / "f")
    loaded = mixgemm.from_pretrained(str(tmp_path / "f"), quantization_config=mixgemm.W4A16(group_size=32),
                                     filter_fn=lambda mod, name: "experts" not in name, progress=False)
    assert loaded.mixgemm_report.skipped["model.layers.0.mlp.experts"] == "excluded by filter_fn"
    experts = experts_modules(loaded)[0]
    assert not isinstance(experts, QuantizedExperts)
    assert torch.equal(experts.gate_up_proj, model.model.layers[0].mlp.experts.gate_up_proj)


def test_experts_that_cannot_be_quantized_are_reported():
    # down_proj's K = 80: a group of 64 and a partial one, which int8 activations do not take
    model = tiny_model("qwen3_moe", moe_intermediate_size=80)
    report = mixgemm.quantize_(model, mixgemm.W8A8(group_size=64))
    skipped = {n: why for n, why in report.skipped.items() if n.endswith("experts")}
    assert len(skipped) == 2 and all("down_proj: K=80 ends in a partial group" in why for why in skipped.values())
    assert not [m for m in model.modules() if isinstance(m, QuantizedExperts)]
    model = tiny_model("qwen3_moe", moe_intermediate_size=80)
    assert not mixgemm.quantize_(model, mixgemm.W4A16(group_size=64)).skipped  # weight-only: the partial group holds
    assert len([m for m in model.modules() if isinstance(m, QuantizedExperts)]) == 2

    model = tiny_model("mixtral")
    for m in experts_modules(model):
        m._is_expert_parallel = True
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    assert all("expert parallelism" in why for n, why in report.skipped.items() if n.endswith("experts"))

    model = tiny_model("mixtral")
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=32), filter_fn=lambda m, n: "experts" not in n)
    assert sum(n.endswith("experts") for n in report.excluded) == 2
    assert not [m for m in model.modules() if isinstance(m, QuantizedExperts)]


def test_unknown_fused_experts_module_is_reported():
    class OwnExperts(nn.Module):  # 3-D expert weights without transformers' experts interface
        def __init__(self):
            super().__init__()
            self.gate_up_proj = nn.Parameter(torch.randn(2, 64, 32))
            self.down_proj = nn.Parameter(torch.randn(2, 32, 32))

    model = nn.Sequential(nn.Linear(32, 32), OwnExperts())
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    assert "1" in report.skipped and "experts interface" in report.skipped["1"]


def test_checkpoint_listing_some_experts_is_refused():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = AutoConfig.for_model("mixtral", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=97, num_local_experts=4)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    names = [f"model.layers.0.mlp.experts.{p}.{e}" for p in ("gate_up_proj", "down_proj") for e in range(3)]
    with pytest.raises(ValueError, match="6 of the 8 expert projections"):
        prepare_skeleton(model, names)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_experts_on_cuda_match_float64(arch, dtype):
    model = tiny_model(arch).to("cuda", dtype)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))  # one resident layout on sm_90 (compacted)
    mod = experts_modules(model)[0]
    ref = float64_twin(mod)
    k, e = model.config.num_experts_per_tok, mod.num_experts
    for t in (0, 1, 3, 17, 129):
        gen = torch.Generator().manual_seed(t)
        x = torch.randn(t, 64, generator=gen)
        idx = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)]) if t else \
            torch.empty(0, k, dtype=torch.int64)
        w = torch.rand(t, k, generator=gen)
        with torch.no_grad():
            got = mod(x.to("cuda", dtype), idx.cuda(), w.to("cuda", dtype)).cpu()
            want = ref(x.to(dtype).double(), idx, w.to(dtype).double())
        assert got.shape == (t, 64) and got.dtype == dtype
        if t:
            err = ((got.double() - want).abs().max() / want.abs().max()).item()
            assert err < (2e-3 if dtype == torch.float16 else 1.5e-2), (arch, dtype, t, err)


def test_quantized_moe_model_pickles(tmp_path):
    model = tiny_model("mixtral")
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    torch.save(model, tmp_path / "m.pt")  # the whole module: the quantized class is made again on loading
    again = torch.load(tmp_path / "m.pt", weights_only=False)
    assert type(again.model.layers[0].mlp.experts) is type(model.model.layers[0].mlp.experts)
    ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)


def test_experts_path_rule_and_reasons():
    from mixgemm import tuning
    from mixgemm.nn.experts import path

    assert path(1, 8, 128) == "routed" and path(4, 2, 8) == "routed" and path(5, 8, 128) == "sorted"  # no costs
    costs = tuning.routed_experts(tuning.load_table("h100"))
    # many small experts (Qwen3-MoE: 128, top 8) stay routed longer than a few large ones (Mixtral: 8, top 2); both
    # prefill on the grouped GEMM
    assert [path(t, 8, 128, costs) for t in (4, 16, 28, 32, 2048)] == ["routed"] * 3 + ["grouped"] * 2
    assert [path(t, 2, 8, costs) for t in (4, 7, 8, 2048)] == ["routed"] * 2 + ["grouped"] * 2
    h200 = tuning.routed_experts(tuning.load_table("h200"))  # its own crossover, a little later
    assert [path(t, 8, 128, h200) for t in (32, 40)] == ["routed", "grouped"]
    assert [path(t, 2, 8, h200) for t in (9, 12)] == ["routed", "grouped"]
    model = tiny_model("qwen3_moe")
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    mod = experts_modules(model)[0]
    assert isinstance(mod.gate_up_proj, ExpertList) and isinstance(mod.down_proj, ExpertList)
    assert "routed GEMV runs on CUDA" in routed_why_not(mod)  # the CPU runs the sorted path


def test_expert_list_drops_its_stack_when_an_expert_is_replaced(tmp_path):
    model = tiny_model("mixtral")
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    layers = experts_modules(model)[0].down_proj
    stack = layers.stack()
    assert layers.stack() is stack and all(m._mixgemm_siblings is stack for m in layers)
    layers[1] = layers[1]  # setitem: the members may have changed
    again = layers.stack()
    assert again is not stack and again.members == list(layers)
    stack.refused = "x"
    stack.release()  # what a member's weight change calls
    assert stack.refused is None and stack.stacked is None
    mixgemm.nn.siblings.separate_siblings(model)  # (A/B tool: sibling groups only)
    assert layers[0]._mixgemm_siblings is again
    torch.save(model, tmp_path / "m.pt")  # the stack is not pickled
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    assert "_stack" not in loaded.model.layers[0].mlp.experts.down_proj.__dict__


def _decode_prompt(seed: int = 3, device="cpu") -> torch.Tensor:
    return torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(seed)).to(device)


def test_compiled_moe_decode_is_one_graph_and_equals_eager():
    """torch.compile(fullgraph=True) of a decoding step: the experts are one op (no graph break, which fullgraph
    would refuse), and the compiled steps give the eager tokens and logits (inductor on the CPU)."""
    from mixgemm.integrations.hf import compiled_step, greedy_decode

    torch._dynamo.reset()
    model = tiny_model("qwen3_moe")
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32, mode="zero_point"))
    ids = _decode_prompt()
    eager_toks, eager_logits = greedy_decode(model, ids, 6)
    comp_toks, comp_logits = greedy_decode(model, ids, 6, step_fn=compiled_step(model))
    assert torch.equal(eager_toks, comp_toks)
    for a, b in zip(eager_logits, comp_logits, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def test_compiled_experts_op_runs_its_own_module():
    """The op finds its module by key: a deep copy (here given other weights) has a key of its own, so its compiled
    call runs its weights, not the original's; a key whose module is gone is a clear error."""
    import copy

    from mixgemm.nn.experts import _BY_KEY, _KEY_ATTR

    model = tiny_model("mixtral")
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    other = copy.deepcopy(model)
    other.load_state_dict(_quantized_state("mixtral", seed=1))
    a, b = experts_modules(model)[0], experts_modules(other)[0]
    assert a.__dict__[_KEY_ATTR] != b.__dict__[_KEY_ATTR] and _BY_KEY[b.__dict__[_KEY_ATTR]] is b
    gen = torch.Generator().manual_seed(4)
    x, idx, w = torch.randn(3, 64, generator=gen), torch.randint(0, 4, (3, 2), generator=gen), torch.rand(3, 2)
    with torch.no_grad():
        for mod in (a, b):
            torch._dynamo.reset()
            got = torch.compile(mod, fullgraph=True, backend="aot_eager")(x, idx, w)
            assert torch.equal(got, mod(x, idx, w))
        assert not torch.equal(a(x, idx, w), b(x, idx, w))
        stale = max(_BY_KEY.keys()) + 1000
        with pytest.raises(RuntimeError, match="no longer exists"):
            torch.ops.mixgemm.experts(x, idx, w, stale)


def _quantized_state(arch: str, seed: int) -> dict:
    model = tiny_model(arch, seed=seed)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    return model.state_dict()


@pytest.mark.gpu
def test_experts_quantized_on_the_cpu_join_when_moved_to_the_gpu():
    model = tiny_model("mixtral").half()
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    assert report.experts_joined == []  # (the CPU runs the sorted path)
    model.to("cuda")  # each expert compacts on arrival; the last one's compaction joins its projection
    for mod in experts_modules(model):
        assert all(layers.__dict__["_stack"].stacked is not None for layers in (mod.gate_up_proj, mod.down_proj))


@pytest.mark.gpu
def test_compiled_moe_decode_with_cuda_graphs_equals_eager():
    """The decoding step under torch.compile(fullgraph=True, mode="reduce-overhead"): the routed experts inside
    CUDA graphs give the eager tokens, logits within fp16 noise."""
    from mixgemm.integrations.hf import compiled_step, greedy_decode

    torch._dynamo.reset()
    model = tiny_model("qwen3_moe").to("cuda", torch.float16)
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    # joined by quantize_, before any call: a first step inside the CUDA graphs' pool allocates nothing to keep
    assert report.experts_joined == [f"model.layers.{i}.mlp.experts" for i in range(2)]
    ids = _decode_prompt(device="cuda")
    eager_toks, eager_logits = greedy_decode(model, ids, 8)
    comp_toks, comp_logits = greedy_decode(model, ids, 8, step_fn=compiled_step(model, mode="reduce-overhead"))
    assert torch.equal(eager_toks, comp_toks)
    for a, b in zip(eager_logits, comp_logits, strict=True):
        assert float((a - b).norm() / b.norm()) <= 2e-3


def test_tile_table_reference():
    from mixgemm.kernels.cuda.grouped_gemm import table_entries, tile_table_reference

    route = torch.tensor([0, 0, 0, 2, 2, 2, 2, 2, 5, 7, 7])  # experts 1, 3, 4 empty; 7: a sentinel (E = 6)
    got = tile_table_reference(route, 6, 2, table_entries(11, 6, 2))
    assert got.shape == (12, 4) and got.dtype == torch.int32
    assert got[:6].tolist() == [[0, 0, 3, 0], [0, 2, 3, 0], [2, 3, 8, 0], [2, 5, 8, 0], [2, 7, 8, 0], [5, 8, 9, 0]]
    assert got[6:].tolist() == [[-1, 0, 0, 0]] * 6


def test_grouped_gemm_names_bad_inputs():
    from types import SimpleNamespace

    from mixgemm.kernels.cuda.grouped_gemm import grouped_gemm

    stack = SimpleNamespace(layout=SimpleNamespace(k=64, n=32, weight=torch.empty(0)), num_experts=4)
    route = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="float16 / bfloat16 x"):
        grouped_gemm(torch.randn(3, 64), route, stack)
    with pytest.raises(ValueError, match="float16 / bfloat16 x"):
        grouped_gemm(torch.randn(3, 48, dtype=torch.float16), route, stack)
    with pytest.raises(ValueError, match=r"route must be int64 \[3\]"):
        grouped_gemm(torch.randn(3, 64, dtype=torch.float16), route[:2], stack)


@pytest.mark.gpu
def test_tile_table_kernel_matches_reference():
    from mixgemm.kernels.cuda.grouped_gemm import table_entries, tile_table, tile_table_reference

    gen = torch.Generator().manual_seed(0)
    for slots, e, bm in ((1, 8, 16), (37, 8, 16), (300, 128, 32), (4096, 128, 128), (513, 300, 64)):
        route = torch.randint(0, e + 2, (slots,), generator=gen).sort().values  # ids >= e: sentinels
        route[: slots // 3] = 0  # one expert with many rows
        route = route.sort().values
        want = tile_table_reference(route, e, bm, table_entries(slots, e, bm))
        assert torch.equal(tile_table(route.cuda(), e, bm).cpu(), want), (slots, e, bm)


@pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="NVRTC (cuda-bindings + nvidia-cuda-nvrtc) not installed")
def test_tile_table_kernel_compiles():
    assert len(nvrtc.compile_cubin("expert_tiles.cu", (), "sm_90")) > 1000


_FORMATS = {"w4_sym": lambda: mixgemm.W4A16(group_size=32),
            "w4_zp": lambda: mixgemm.W4A16(group_size=32, mode="zero_point"),
            "w4_offset": lambda: mixgemm.W4A16(group_size=32, mode="offset"), "w8": mixgemm.W8A16,
            # K = 96 in groups of 64: a partial last group of 32
            "w4_g64_partial": lambda: mixgemm.W4A16(group_size=64, mode="zero_point")}


def _quantized_experts_on_cuda(arch: str, fmt: str, dtype: torch.dtype):
    """A tiny model of ``arch`` (K = 96: no multiple of 64) on the GPU, quantized in ``fmt``: its first experts module,
    that module's float64 twin, top k and the number of experts."""
    model = tiny_model(arch, hidden_size=96, **({"moe_intermediate_size": 96} if arch == "qwen3_moe" else {}))
    model = model.to("cuda", dtype)
    mixgemm.quantize_(model, _FORMATS[fmt]())
    mod = experts_modules(model)[0]
    return mod, float64_twin(mod), model.config.num_experts_per_tok, mod.num_experts


def _call_inputs(t: int, k: int, e: int):
    """Random x [t, 96], distinct top-k expert ids and routing weights for t tokens (CPU, seeded by t)."""
    gen = torch.Generator().manual_seed(t)
    x = torch.randn(t, 96, generator=gen)
    idx = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
    return x, idx, torch.rand(t, k, generator=gen)


def _assert_call_matches_float64(mod, ref, x, idx, w, dtype, label) -> None:
    """The module's call on the GPU leaves its inputs untouched and is within the dtype's tolerance of the float64
    twin's product (relative to the largest output)."""
    xd, idxd, wd = x.to("cuda", dtype), idx.cuda(), w.to("cuda", dtype)
    x0, idx0, w0 = xd.clone(), idxd.clone(), wd.clone()
    with torch.no_grad():
        got = mod(xd, idxd, wd).cpu()
    assert torch.equal(xd, x0) and torch.equal(idxd, idx0) and torch.equal(wd, w0)
    want = ref(x.to(dtype).double(), idx, w.to(dtype).double())
    assert got.shape == (x.shape[0], 96) and got.dtype == dtype
    err = ((got.double() - want).abs().max() / want.abs().max()).item()
    assert err < (2e-3 if dtype == torch.float16 else 1.5e-2), (*label, err)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss", "mixtral"])
@pytest.mark.parametrize("fmt", ["w4_sym", "w4_zp", "w4_offset", "w8", "w4_g64_partial"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_routed_decoding_on_cuda_matches_float64(arch, fmt, dtype):
    """The routed GEMV (one launch a projection, the routing read on the GPU) against the float64 product: K not a
    multiple of 64 (96), sentinel ids of no local expert, T 1..4 and T x k <= E, inputs untouched."""
    mod, ref, k, e = _quantized_experts_on_cuda(arch, fmt, dtype)
    before = torch.cuda.memory_allocated()
    for t in (1, 2, 3, 4):
        x, idx, w = _call_inputs(t, k, e)
        if t == 3:
            idx[1, 0] = e  # expert parallelism's sentinel: the slot adds nothing
        _assert_call_matches_float64(mod, ref, x, idx, w, dtype, (arch, fmt, dtype, t))
        assert routed_why_not(mod) is None, routed_why_not(mod)
    # the join moved the layouts into one buffer a projection: nothing held twice (the stacked biases aside)
    assert torch.cuda.memory_allocated() - before < 64 * 1024


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss", "mixtral"])
@pytest.mark.parametrize("fmt", ["w4_sym", "w4_zp", "w4_offset", "w8", "w4_g64_partial"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("forced", ["routed", "grouped"])
def test_calls_of_many_tokens_match_float64(arch, fmt, dtype, forced, monkeypatch):
    """Past a few tokens the slots run in expert order (and are put back), through the routed GEMV or the grouped
    tensor-core GEMM: T 5..300 with the path forced, K = 96 (no multiple of 64), sentinel ids included, against the
    float64 product; inputs untouched."""
    import mixgemm.nn.experts as experts

    monkeypatch.setattr(experts, "path", lambda *a: forced)
    mod, ref, k, e = _quantized_experts_on_cuda(arch, fmt, dtype)
    for t in (5, 17, 129, 300):
        x, idx, w = _call_inputs(t, k, e)
        idx[::7, -1] = e  # sentinels: no local expert
        _assert_call_matches_float64(mod, ref, x, idx, w, dtype, (arch, fmt, dtype, forced, t))


@pytest.mark.gpu
@pytest.mark.parametrize("bm", [16, 32, 64, 128])
def test_grouped_gemm_tiles_match_float64(bm):
    """The grouped GEMM on its own, each tile height: experts with no rows, one row, several tiles of rows and a
    partial last tile, bias per expert, sentinel rows zero, against the float64 product of each row's expert."""
    from mixgemm.kernels.cuda.grouped_gemm import grouped_gemm

    model = tiny_model("gpt_oss", hidden_size=96).to("cuda", torch.float16)  # (experts with biases)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    mod = experts_modules(model)[0]
    stack = mod.down_proj.stack().stacked
    e = mod.num_experts
    gen = torch.Generator().manual_seed(bm)
    counts = [0, 1, 2 * bm + 3, bm, 5] + [7] * (e - 5)
    route = torch.cat([torch.full((c,), i) for i, c in enumerate(counts)] + [torch.full((4,), e)])  # + sentinels
    x = torch.randn(route.shape[0], stack.layout.k, generator=gen)
    got = grouped_gemm(x.to("cuda", torch.float16), route.cuda(), stack, {"BM": bm, "NWG": 2, "STAGES": 4,
                                                                           "TMA": 1, "SPLIT": 1}).cpu()
    w = torch.stack([layer.dequantize().double().cpu() for layer in mod.down_proj])  # [E, N, K]
    b = torch.stack([layer.bias.double().cpu() for layer in mod.down_proj])
    live = route < e
    want = torch.zeros(route.shape[0], stack.layout.n, dtype=torch.float64)
    xr = x.to(torch.float16).double()
    want[live] = torch.einsum("sk,snk->sn", xr[live], w[route[live]]) + b[route[live]]
    err = ((got.double() - want).abs().max() / want.abs().max()).item()
    assert err < 2e-3, (bm, err)
    assert torch.equal(got[~live], torch.zeros_like(got[~live]))


@pytest.mark.gpu
def test_routed_decoding_survives_reload_and_replays_in_a_cuda_graph():
    model = tiny_model("qwen3_moe").to("cuda", torch.float16)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=32))
    mod = experts_modules(model)[0]
    ref = float64_twin(mod)
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(1, 64, generator=gen).half()
    idx = torch.randperm(6, generator=gen)[:3][None]
    w = torch.rand(1, 3, generator=gen).half()
    xs, idxs, ws = x.cuda(), idx.cuda(), w.cuda()
    with torch.no_grad():
        first = mod(xs, idxs, ws)
        joined = mod.down_proj.stack().stacked
        # every expert reloaded: the stacks are released, and join again as the last expert is compacted
        model.load_state_dict(model.state_dict())
        assert mod.down_proj.stack().stacked not in (None, joined)
        assert torch.allclose(mod(xs, idxs, ws), first, rtol=0, atol=1e-3)
        assert routed_why_not(mod) is None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = mod(xs, idxs, ws)
        for seed in (1, 2):
            g2 = torch.Generator().manual_seed(seed)
            idx2 = torch.randperm(6, generator=g2)[:3][None]
            x2 = torch.randn(1, 64, generator=g2).half()
            xs.copy_(x2.cuda())
            idxs.copy_(idx2.cuda())
            graph.replay()
            want = ref(x2.double(), idx2, w.double())
            err = ((out.cpu().double() - want).abs().max() / want.abs().max()).item()
            assert err < 2e-3, (seed, err)


# the published names of an expert's projections -> the writer's (whose act-order permutations are shared by the
# layers that read one input, as GPTQ's Hessian is: an expert's gate and up)
_AS_GATED_MLP = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def write_quantized_moe(arch, case_name, tmp_path, share_gate_up=True):
    """A tiny MoE model written as a quantized checkpoint under the published names (directory "q") and the float
    model of the format's own dequantization under the same names (directory "ref")."""
    import json

    from safetensors.torch import load_file, save_file

    from quantformat_checkpoints import CASES, WRITERS

    case = next(c for c in CASES if c.name == case_name)
    hidden = 128  # every K holds a group of 128
    model = tiny_model(arch, hidden_size=hidden, intermediate_size=256,
                       **({"moe_intermediate_size": 128} if arch == "qwen3_moe" else {}))
    model.save_pretrained(tmp_path / "orig")  # the published names: one tensor per expert and projection
    tensors = load_file(str(next((tmp_path / "orig").glob("*.safetensors"))))
    gen, shared, quantized, floats = torch.Generator().manual_seed(1), {}, {}, dict(tensors)
    for key, w in tensors.items():
        prefix = key[:-len(".weight")]
        if not key.endswith(".weight") or w.dim() != 2 or "embed" in key or "lm_head" in key or \
                prefix.endswith((".gate", ".router")):
            continue
        parent, _, child = prefix.rpartition(".")
        shares = ".experts." in prefix and share_gate_up
        as_mlp = f"{parent}.mlp.{_AS_GATED_MLP.get(child, child)}" if shares else prefix
        t, native, exact = WRITERS[case.fmt](as_mlp, w.float(), case.quantization_config, gen, shared)
        assert torch.equal(exact.to(native.dtype), native)
        quantized.update({f"{prefix}.{k}": v.contiguous() for k, v in t.items()})
        floats[key] = exact.float().contiguous()
    layers = {q.rsplit(".", 1)[0] for q in quantized}
    rest = {k: v.contiguous() for k, v in tensors.items() if k[:-len(".weight")] not in layers}
    config = json.loads((tmp_path / "orig" / "config.json").read_text())
    for d, tens, qc in (("q", {**rest, **quantized}, case.quantization_config), ("ref", floats, None)):
        (tmp_path / d).mkdir()
        save_file({k: v.contiguous() for k, v in tens.items()}, str(tmp_path / d / "model.safetensors"),
                  metadata={"format": "pt"})
        cfg = {**config, "torch_dtype": "float32", "dtype": "float32"}
        if qc is not None:
            cfg["quantization_config"] = qc
        (tmp_path / d / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("case_name", ["gptq-v1-sym-g128", "gptq-v2-actorder-g32", "awq-g128", "ct-int4-g128-sym"])
def test_quantized_moe_checkpoint_as_published_loads(arch, case_name, tmp_path):
    """GPTQ / AWQ / compressed-tensors MoE checkpoints store each expert's gate / up / down projections as quantized
    layers of their own under the original names: each expert's gate and up rows become its gate_up layer, and the
    model equals the float model of the format's own dequantization (written as a float checkpoint under the same
    names and loaded by transformers)."""
    write_quantized_moe(arch, case_name, tmp_path)
    loaded = mixgemm.from_pretrained(str(tmp_path / "q"), dtype=torch.float32, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ref"), dtype=torch.float32).eval()
    experts = experts_modules(loaded)
    assert experts and all(isinstance(m, QuantizedExperts) for m in experts)
    assert loaded.mixgemm_report.ignored == []
    ids = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, ref(ids).logits, rtol=1e-5, atol=1e-5)


def test_quantized_moe_checkpoint_with_unshared_act_order_is_an_error(tmp_path):
    write_quantized_moe("mixtral", "gptq-v2-actorder-g32", tmp_path, share_gate_up=False)
    with pytest.raises(ValueError, match="gate_up_proj.0': its parts in the checkpoint have different act-order"):
        mixgemm.from_pretrained(str(tmp_path / "q"), dtype=torch.float32, progress=False)


@pytest.mark.gpu
def test_gguf_moe_file_decodes_routed_on_cuda(tmp_path):
    """A GGUF MoE file (gate Q4_0 and up Q4_1 experts: the offset form) on the GPU, routed decoding against the same
    model on the CPU."""
    pytest.importorskip("gguf")
    from gguf_fixtures import write_tiny_qwen3_moe

    f = write_tiny_qwen3_moe(str(tmp_path))
    cpu = mixgemm.from_pretrained(str(tmp_path), gguf_file=f, progress=False, dtype=torch.float32)
    gpu = mixgemm.from_pretrained(str(tmp_path), gguf_file=f, device="cuda", dtype=torch.float16, progress=False)
    ids = torch.randint(0, 320, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = cpu(ids).logits[0, -1].double()
        out = gpu(ids.cuda(), use_cache=True)
        step = gpu(ids[:, -1:].cuda() * 0 + 7, past_key_values=out.past_key_values).logits[0, -1].double().cpu()
        again = cpu(torch.cat([ids, torch.full((1, 1), 7)], 1)).logits[0, -1].double()
    assert routed_why_not(gpu.model.layers[0].mlp.experts) is None
    assert ((out.logits[0, -1].double().cpu() - want).abs().max() / want.abs().max()).item() < 2e-2
    assert ((step - again).abs().max() / again.abs().max()).item() < 2e-2
