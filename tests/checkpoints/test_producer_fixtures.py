"""Checkpoints written by the producers themselves (tests/fixtures/producers/, tools/fixtures/
make_producer_checkpoints.py; each directory's README names the producer, version and command), loaded through
mixgemm.from_pretrained and, after ``import mixgemm``, AutoModelForCausalLM.from_pretrained.

Weights: every QuantLinear's fp32 dequantization equals the producer's own decompression (compressed-tensors'
compressor for the layer's format) run on the stored tensors with the scales upcast to float32 (the exact products
mixgemm holds), which rounds to what transformers' ``dequantize=True`` load holds in fp16. Logits: against
transformers' dequantized load of the same files with those exact weights, to float32 rounding, and the same
greedy tokens; for W8A8 (dynamic per-token int8 activations) that twin's Linears take their input through the same
per-token int8 quantizer. GPTQ / AWQ (GPTQModel, AutoAWQ): the libraries' dequantization formulas, the twin a float
Llama holding those weights; through AutoModelForCausalLM too, whose GPTQ / AWQ loaders (they need gptqmodel,
not installed here) mixgemm's PackedFormatHfQuantizer stands in for. GGUF (llama.cpp): gguf's
dequantization of GGUFReader's tensors, the twin transformers' ``gguf_file=`` load.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

import mixgemm
from mixgemm.nn.linear import QuantLinear
from repo_paths import TESTS

ROOT = str(TESTS / "fixtures" / "producers")
CT_FIXTURES = ["llmcompressor-w8a8", "llmcompressor-w4a16-asym-g32"]
# llama.cpp's files and the GGUF types each holds (its K_M mixes put Q6_K on attn_v, ffn_down and the output)
GGUF_FIXTURES = {"llamacpp-q4-0": {"Q4_0", "Q6_K"}, "llamacpp-q4-k-m": {"Q4_K", "Q6_K"},
                 "llamacpp-q5-k-m": {"Q5_K", "Q6_K"}, "llamacpp-q8-0": {"Q8_0"}}
PACKED_FIXTURES = ["gptqmodel-gptq-sym-g32", "gptqmodel-gptq-asym-actorder-g32", "gptqmodel-awq-gemm-g32",
                   "autoawq-gemm-g32", "autoawq-gemm-g128"]
IDS = torch.tensor([[1, 17, 200, 45, 3, 99, 128, 7, 250, 31, 64, 5]])


def _producer_weights(path) -> dict[str, torch.Tensor]:
    """{layer: fp32 weight} by compressed-tensors' own decompression of each layer, fp32 scales."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors import safe_open

    with open(os.path.join(path, "config.json")) as f:
        (group,) = json.load(f)["quantization_config"]["config_groups"].values()
    scheme = QuantizationScheme.model_validate(group)
    compressor = BaseCompressor.get_value_from_registry(group["format"])
    out = {}
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        names = list(f.keys())
        for prefix in sorted({k.rsplit(".", 1)[0] for k in names if k.endswith(".weight_scale")}):
            sd = {k[len(prefix) + 1:]: f.get_tensor(k) for k in names if k.startswith(prefix + ".")}
            sd = {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}
            out[prefix] = compressor.decompress(sd, scheme)["weight"]
    return out


def _transformers_dequantized(path):
    """transformers' load with compressed-tensors' decompression, then the exact fp32 producer weights (checked to
    round to transformers' fp16 ones)."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 quantization_config=CompressedTensorsConfig(dequantize=True)).eval()
    for name, w in _producer_weights(path).items():
        lin = model.get_submodule(name)
        assert torch.equal(w.half().float(), lin.weight.data), name
        lin.weight.data = w
    return model


def _load_exact(path, producer_weights):
    """mixgemm.from_pretrained in float32, every Linear a QuantLinear (lm_head aside: the producers leave it float),
    nothing skipped, ignored or re-quantized: (model, {name: QuantLinear}, producer_weights(path) for the same
    layers)."""
    model = mixgemm.from_pretrained(path, dtype=torch.float32, progress=False)
    report = model.mixgemm_report
    assert not report.ignored and not report.skipped and not report.inexact
    qls = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert len(qls) == 7 * model.config.num_hidden_layers
    want = producer_weights(path)
    assert sorted(want) == sorted(qls)
    return model, qls, want


@pytest.mark.parametrize("name", CT_FIXTURES)
def test_compressed_tensors_fixture_weights_equal_the_producers(name):
    path = os.path.join(ROOT, name)
    _, qls, want = _load_exact(path, _producer_weights)
    for n, ql in qls.items():
        assert torch.equal(ql.dequantize(torch.float32), want[n]), n
        if name.endswith("w8a8"):
            assert (ql.act_mode, ql.act_block, ql.config.bits) == ("sym_full", "token", 8), n
        else:
            assert ql.act_mode is None and ql.config.mode == "zero_point" and ql.config.group_size == 32, n


@pytest.mark.parametrize("name", CT_FIXTURES)
def test_compressed_tensors_fixture_logits(name):
    path = os.path.join(ROOT, name)
    model = mixgemm.from_pretrained(path, dtype=torch.float32, progress=False)
    if name.endswith("w8a8"):
        twin = _transformers_own(path)
    else:
        twin = _transformers_dequantized(path)
    with torch.no_grad():
        got, want = model(IDS).logits, twin(IDS).logits
    scale = want.abs().max().item()
    if name.endswith("w8a8"):
        # every layer agrees to float32 rounding on the same input, its codes equal (test_w8a8_fixture_layers_...),
        # but a float32 rounding of one layer's output (2.5e-7 of its scale here: mixgemm's correctly rounded integer
        # GEMM against torch's fp32 matmul) moves one activation of the next layer's 768 across a code boundary, and
        # the extra code step (0.1% of that layer's output) moves more in each later quantizer: 1.7% of the logits
        # at the end (transformers' fp16 / bf16 loads differ from themselves by 2.1% / 2.9% between eager and sdpa
        # attention, the same effect)
        assert (got - want).abs().max() < 0.03 * scale
    else:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * scale)
    with torch.no_grad():
        a = model.generate(IDS, max_new_tokens=6, do_sample=False)
        b = twin.generate(IDS, max_new_tokens=6, do_sample=False)
    assert torch.equal(a, b)


def _transformers_own(path):
    """transformers' own load of a W8A8 file (after import mixgemm): compressed-tensors' forward, its dynamic per-token
    int8 quantizer on each Linear's input and its weights decompressed in float32 (the exact products)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_w8a8_fixture_layers_equal_transformers_own_on_the_same_inputs():
    """Each QuantLinear of the W8A8 fixture, given the input its layer gets in transformers' own forward, gives that
    layer's output to float32 rounding: the same activation codes (compressed-tensors' absmax / 127.5 scheme), the
    same weights."""
    path = os.path.join(ROOT, "llmcompressor-w8a8")
    twin = _transformers_own(path)
    model = mixgemm.from_pretrained(path, dtype=torch.float32, progress=False)
    seen = {}

    def keep(name):
        def hook(_, args, out):
            seen[name] = (args[0].detach().clone(), out.detach().clone())
        return hook

    for name, mod in twin.named_modules():
        if isinstance(mod, nn.Linear) and name != "lm_head":
            mod.register_forward_hook(keep(name))
    with torch.no_grad():
        twin(IDS)
    qls = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert sorted(qls) == sorted(seen)
    for name, ql in qls.items():
        x, want = seen[name]
        with torch.no_grad():
            got = ql(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * want.abs().max().item(), msg=name)


def test_int8_codes_without_their_scales_never_load_as_a_float_weight(tmp_path):
    """A W8A8 layer whose weight_scale is missing is not recognised as quantized: its int8 codes must not be put
    into a float nn.Linear (the failure before int-quantized was read: a forward raising a dtype mismatch)."""
    import shutil

    from safetensors.torch import load_file, save_file

    src = os.path.join(ROOT, "llmcompressor-w8a8")
    shutil.copy(os.path.join(src, "config.json"), tmp_path)
    sd = load_file(os.path.join(src, "model.safetensors"))
    del sd["model.layers.1.mlp.up_proj.weight_scale"]
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"'model.layers.1.mlp.up_proj.weight' is torch.int8 in the checkpoint"):
        mixgemm.from_pretrained(str(tmp_path), progress=False)


def _packed_producer_weights(path) -> dict[str, torch.Tensor]:
    """{layer: fp32 weight} of a GPTQ / AWQ checkpoint by the libraries' own dequantization formulas
    (quantformat_fixtures: GPTQ's torch path, AutoAWQ's dequantize_gemm), the scales upcast to float32."""
    from safetensors import safe_open

    from quantformat_fixtures import awq_dequant, gptq_dequant

    with open(os.path.join(path, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    out = {}
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        names = list(f.keys())
        for prefix in sorted(k[: -len(".qweight")] for k in names if k.endswith(".qweight")):
            t = {k[len(prefix) + 1:]: f.get_tensor(k) for k in names if k.startswith(prefix + ".")}
            if qc["quant_method"] == "awq":
                out[prefix] = awq_dequant(t["qweight"], t["qzeros"], t["scales"].float(), qc["group_size"])
            else:
                out[prefix] = gptq_dequant(t["qweight"], t["qzeros"], t["scales"].float(), t["g_idx"], qc["bits"],
                                           v1=qc.get("checkpoint_format", "gptq") == "gptq")
    return out


def _float_twin(path, weights):
    """transformers' Llama of the checkpoint's config with its float tensors and ``weights`` (fp32)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    sd = {k: v.float() for k, v in load_file(os.path.join(path, "model.safetensors")).items() if v.is_floating_point()}
    sd.update({f"{k}.weight": w for k, w in weights.items()})
    missing, _ = model.load_state_dict(sd, strict=False)
    assert not [k for k in missing if "rotary" not in k], missing
    return model


@pytest.mark.parametrize("name", PACKED_FIXTURES)
def test_packed_fixture_weights_logits_and_tokens(name):
    path = os.path.join(ROOT, name)
    model, qls, want = _load_exact(path, _packed_producer_weights)
    # each layer as the format reads it (before from_pretrained folds act-order permutations into gate / up)
    from mixgemm.checkpoints import formats
    from mixgemm.checkpoints.safetensors_source import SafetensorsSource
    from mixgemm.formats.weight import dequantize_weight

    with open(os.path.join(path, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    source = SafetensorsSource(path)
    for n in want:
        conv = formats.find(qc).convert_linear(source, n, qc)
        got = dequantize_weight(conv.weight, torch.float32)
        if conv.input_perm is not None:  # the layer holds its columns sorted by group
            got = torch.empty_like(got).index_copy_(1, conv.input_perm.long(), got)
        assert torch.equal(got, want[n]), n
    if name.startswith("gptqmodel-awq"):  # GPTQModel's default AWQ: zero_point false, loaded symmetric
        assert all(ql.config.mode == "sym" for ql in qls.values())
    if name.startswith("autoawq"):  # AutoAWQ: zero_point true
        assert all(ql.config.mode == "zero_point" and ql.config.group_size == qc["group_size"] for ql in qls.values())
    _assert_same_logits_and_tokens(model, _float_twin(path, want))


@pytest.mark.parametrize("name", PACKED_FIXTURES)
def test_packed_fixture_through_automodel_runs_mixgemm_layers(name):
    """After ``import mixgemm``, transformers' own AutoModelForCausalLM.from_pretrained of a GPTQ / AWQ checkpoint
    (no GPTQ / AWQ package installed) builds mixgemm's QuantLinears: each layer's weight the producer's
    dequantization, logits and greedy tokens those of the float twin."""
    from transformers import AutoModelForCausalLM

    from mixgemm.nn.linear import QuantLinear

    path = os.path.join(ROOT, name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    want = _packed_producer_weights(path)
    qls = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert sorted(qls) == sorted(want)
    ref = mixgemm.from_pretrained(path, dtype=torch.float32, progress=False)
    ref_qls = {n: m for n, m in ref.named_modules() if isinstance(m, QuantLinear)}
    for n, ql in qls.items():  # as mixgemm.from_pretrained holds them (act-order folded alike)
        assert torch.equal(ql.dequantize(torch.float32), ref_qls[n].dequantize(torch.float32)), n
    _assert_same_logits_and_tokens(model, _float_twin(path, want))


def test_gptq_and_awq_stay_transformers_where_their_loader_runs(monkeypatch):
    """transformers' own GPTQ / AWQ loaders run wherever they can (gptqmodel installed); mixgemm's takes over only
    where they would raise ImportError."""
    from transformers import AwqConfig, GPTQConfig
    from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING, AutoHfQuantizer

    from mixgemm.checkpoints import hf_quantizer

    configs = {"gptq": GPTQConfig(bits=4, group_size=32), "awq": AwqConfig(bits=4, group_size=32)}
    for method, config in configs.items():
        assert "mixgemm" not in AUTO_QUANTIZER_MAPPING[method].original.__module__  # transformers' own kept
        monkeypatch.setattr(hf_quantizer, "_theirs_usable", lambda: False)
        assert type(AutoHfQuantizer.from_config(config, pre_quantized=True)) is hf_quantizer.PackedFormatHfQuantizer

        class Theirs:  # (transformers' own needs gptqmodel and optimum to be built: a stand-in)
            def __init__(self, quantization_config, **kwargs):
                self.quantization_config = quantization_config

        monkeypatch.setattr(hf_quantizer, "_theirs_usable", lambda: True)
        assert type(hf_quantizer._chooser(Theirs)(config, pre_quantized=True)) is Theirs


def _greedy(model, ids):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=6, do_sample=False)


def _assert_same_logits_and_tokens(model, twin) -> None:
    """Logits of ``model`` and its float ``twin`` (the same fp32 weights) to float32 rounding, greedy tokens equal."""
    ids = IDS % model.config.vocab_size
    with torch.no_grad():
        got, ref = model(ids).logits, twin(ids).logits
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5 * ref.abs().max().item())
    assert torch.equal(_greedy(model, ids), _greedy(twin, ids))



@pytest.mark.parametrize("name", ["gptqmodel-gptq-sym-g32", "llmcompressor-w4a16-asym-g32"])
def test_cpu_default_dtype_is_bfloat16_and_float32_on_request(name):
    """fp16 checkpoints on the CPU: bfloat16 by default (torch's int4 / int8 kernels), float32 when asked."""
    path = os.path.join(ROOT, name)
    model = mixgemm.from_pretrained(path, progress=False)
    assert {p.dtype for p in model.parameters() if p.is_floating_point()} == {torch.bfloat16}
    ql = model.model.layers[0].mlp.down_proj
    x = torch.randn(3, ql.in_features, dtype=torch.bfloat16)
    assert mixgemm.explain(x, ql.quantized_weight()).entry.name == "cpu_torch_kernels"
    with torch.no_grad():
        assert model(IDS).logits.dtype == torch.bfloat16
    exact = mixgemm.from_pretrained(path, dtype=torch.float32, progress=False)
    assert {p.dtype for p in exact.parameters() if p.is_floating_point()} == {torch.float32}


def _gguf_producer_weights(path, config) -> dict[str, tuple[str, torch.Tensor]]:
    """{module: (GGUF type, fp32 weight)} of every quantized tensor, by gguf's dequantization of what GGUFReader
    reads, named through gguf's tensor-name table; q / k rows back in transformers' order (llama.cpp's converter
    interleaves the two rotary halves of each head: LlamaModel.permute, undone here)."""
    import gguf

    table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    by_gguf_name = {t.name: t for t in gguf.GGUFReader(path).tensors}
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    out = {}
    for hf_name in ["model.embed_tokens", "lm_head"] + [
            f"model.layers.{i}.{m}" for i in range(config.num_hidden_layers) for m in
            ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj")]:
        t = by_gguf_name[table.get_name(hf_name) + ".weight"]
        w = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy())  # [rows, cols]
        if (h := heads.get(hf_name.rsplit(".", 1)[-1])) is not None:
            rows, cols = w.shape
            w = w.reshape(h, rows // h // 2, 2, cols).transpose(1, 2).reshape(rows, cols)
        out[hf_name] = (t.tensor_type.name, w)
    return out


@pytest.mark.parametrize("name", sorted(GGUF_FIXTURES))
def test_llamacpp_fixture_weights_logits_and_tokens(name):
    """Every GGUF type of llama.cpp's files (Q6_K in 8-bit groups of 16) equals gguf's dequantization in fp32, nothing
    re-quantized; logits to float32 rounding and greedy tokens equal to transformers' own gguf_file= load (which
    holds gguf's dequantization)."""
    from transformers import AutoModelForCausalLM

    path = os.path.join(ROOT, name)
    (file,) = [f for f in os.listdir(path) if f.endswith(".gguf")]
    model = mixgemm.from_pretrained(path, gguf_file=file, dtype=torch.float32, progress=False)
    twin = AutoModelForCausalLM.from_pretrained(path, gguf_file=file, dtype=torch.float32).eval()
    want = _gguf_producer_weights(os.path.join(path, file), model.config)
    assert {qtype for qtype, _ in want.values()} == GGUF_FIXTURES[name]
    report = model.mixgemm_report
    assert not report.ignored and not report.skipped and not report.inexact
    assert torch.equal(model.model.embed_tokens.weight, want.pop("model.embed_tokens")[1])
    qls = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert sorted(qls) == sorted(want)
    for n, (qtype, w) in want.items():
        assert torch.equal(twin.get_submodule(n).weight, w), n  # transformers' load: gguf's dequantization
        assert torch.equal(qls[n].dequantize(torch.float32), w), n
        assert qls[n].config.group_size == (16 if qtype == "Q6_K" else 32), n
    _assert_same_logits_and_tokens(model, twin)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["llamacpp-q4-k-m", "llamacpp-q5-k-m"])
def test_gpu_llamacpp_k_m_fixtures(name, rel_err):
    """On the GPU: the Q6_K layers (8-bit groups of 16) run the Triton GEMM, the CUDA kernels declining them, each
    within the kernel tests' bound of the float64 reference at M = 1 / 12 in fp16 / bf16 / fp32; in float32 the
    model's logits agree with transformers' own load on the GPU and its greedy tokens are the same; loaded in fp16
    with its default compaction (the other layers keep wgmma_v1 on sm_90, the Q6_K ones their plain codes), its
    logits within fp16 rounding of that load's."""
    from transformers import AutoModelForCausalLM

    from mixgemm.reference.matmul import matmul as ref_matmul

    pytest.importorskip("gguf")  # transformers' gguf_file= load reads the file with it
    path = os.path.join(ROOT, name)
    (file,) = [f for f in os.listdir(path) if f.endswith(".gguf")]
    model = mixgemm.from_pretrained(path, gguf_file=file, dtype=torch.float32, device="cuda", progress=False,
                                    compact=False)
    twin = AutoModelForCausalLM.from_pretrained(path, gguf_file=file, dtype=torch.float32).eval().to("cuda")
    assert not model.mixgemm_report.inexact
    narrow = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear) and m.config.group_size == 16}
    assert narrow  # llama.cpp's K_M mixes: Q6_K on attn_v / ffn_down
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}
    g = torch.Generator().manual_seed(0)
    for n, ql in narrow.items():
        qw = ql.quantized_weight()
        for dtype, m in ((torch.float16, 1), (torch.bfloat16, 12), (torch.float32, 12), (torch.float16, 12)):
            x = torch.randn(m, ql.in_features, generator=g).to("cuda", dtype)
            assert mixgemm.explain(x, qw).kernel == "triton_gemm", n
            y = mixgemm.matmul(x, qw)
            assert rel_err(y, ref_matmul(x, qw, out_dtype=torch.float64)) <= tol[dtype], (n, dtype, m)
    ids = (IDS % model.config.vocab_size).to("cuda")
    with torch.no_grad():
        got, ref = model(ids).logits, twin(ids).logits
    torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-4 * ref.abs().max().item())
    assert torch.equal(_greedy(model, ids), _greedy(twin, ids))
    half = mixgemm.from_pretrained(path, gguf_file=file, dtype=torch.float16, device="cuda", progress=False)
    hopper = torch.cuda.get_device_capability()[0] == 9  # (auto-compaction's GPUs)
    for n, ql in half.named_modules():
        if isinstance(ql, QuantLinear):
            assert (ql.compact is None) == (ql.config.group_size == 16 or not hopper), n
    with torch.no_grad():
        assert rel_err(half(ids).logits, ref) < 1e-2


def test_w8a8_fixture_saved_by_mixgemm_keeps_its_activation_mode(tmp_path):
    """Re-saved in mixgemm's own format, the compressed-tensors W8A8 layers reload with compressed-tensors' activation
    scheme ("sym_full" per token) and the same logits."""
    model = mixgemm.from_pretrained(os.path.join(ROOT, "llmcompressor-w8a8"), dtype=torch.float32, progress=False)
    model.save_pretrained(tmp_path)
    back = mixgemm.from_pretrained(str(tmp_path), dtype=torch.float32, progress=False)
    qls = [m for m in back.modules() if isinstance(m, QuantLinear)]
    assert qls and all((m.act_mode, m.act_block) == ("sym_full", "token") for m in qls)
    with torch.no_grad():
        assert torch.equal(back(IDS).logits, model(IDS).logits)
