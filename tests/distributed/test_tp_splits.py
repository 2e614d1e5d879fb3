"""Tensor parallelism at any split and with unequal ranks (issue 113), on the CPU: one gloo job of 8 processes
(tests/tp_split_cases.py) at TP 2, 4 and 8, plus the checks that need no process group.

* Any vocabulary: a lm_head of 1000, 1001, 32064 or 151936 rows (and q / k / v shards of 8 rows) splits at TP 2, 4
  and 8, logits within 1e-5 of the unsharded model's (fp32; relative to the largest logit).
* A decode step on plain tensors: no DTensor is built or redistributed, the quantized shards carry no hooks, and the
  step compiled by dynamo gives the eager step's logits.
* Unequal ranks fail on every rank with one error: other weights (src_data_rank=None), another model shape, a split
  one rank refuses. Without init_process_group, tensor_parallel_ says so.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import tp_split_cases

pytestmark = pytest.mark.slow(seconds=75)  # the `job` fixture: a gloo job

EXACT = 1e-5


def _rel(a, b) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return tp_split_cases.run(str(tmp_path_factory.mktemp("tp_splits")))


@pytest.mark.parametrize("world", tp_split_cases.WORLDS)
@pytest.mark.parametrize("vocab", tp_split_cases.VOCABS)
def test_any_vocabulary_splits(job, vocab, world):
    ref, ranks = job
    got = [r[world][vocab] for r in ranks[:world]]
    assert all(torch.equal(g["logits"], got[0]["logits"]) for g in got[1:])  # the gathered logits, replicated
    assert got[0]["logits"].shape == ref[vocab].shape
    assert _rel(got[0]["logits"], ref[vocab]) <= EXACT
    assert got[0]["lm_head_rows"] == -(-vocab // world)  # this rank's rows (an uneven split's padded ones included)


@pytest.mark.parametrize("world", tp_split_cases.WORLDS)
def test_decode_step_on_plain_tensors(job, world):
    _, ranks = job
    for r in ranks[:world]:
        step = r[world]["step"]
        assert step["dtensor_calls"] == 0 and step["hooks"] == 0
        assert step["classes"] == ["ColwiseQuantLinear", "RowwiseQuantLinear"]
        assert _rel(step["compiled"], step["eager"]) <= EXACT


def test_unequal_ranks_fail_on_every_rank(job):
    _, ranks = job
    world = max(tp_split_cases.WORLDS)
    errors = [r[world]["errors"] for r in ranks]
    assert all(e == errors[0] for e in errors[1:])  # one verdict: no rank went on to wait in a collective
    e = errors[0]
    assert e["other weights"].startswith("tensor_parallel_: the ranks hold different models: on rank 1, "
                                         "model.norm.weight holds other values than rank 0's (src_data_rank=None")
    assert "on rank 3, model.layers.0.mlp.gate_proj.qweight is torch.uint8 [256, 32], rank 0's torch.uint8 " \
           "[128, 32]" in e["other shape"]
    assert e["one refuses"].startswith("tensor_parallel_ refused on rank(s) [2] of 8 (the ranks' models differ): "
                                       "model.layers.0.self_attn.o_proj: row-parallel split")


def test_without_a_process_group():
    from mixgemm.distributed import tensor_parallel_

    assert not torch.distributed.is_initialized()
    with pytest.raises(RuntimeError, match=r"torch\.distributed is not initialized: call "
                                           r"torch\.distributed\.init_process_group\(\) on every rank first"):
        tensor_parallel_(torch.nn.Linear(4, 4))


def test_import_mixgemm_reaches_distributed():
    code = ("import sys, mixgemm; assert 'mixgemm.distributed' not in sys.modules; "
            "print(mixgemm.distributed.tensor_parallel_.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "tensor_parallel_"
