"""The one-shot sum over the ranks (mixgemm.kernels.rank_sum) and the choice between it and NCCL
(mixgemm.distributed.collectives). The jobs' bodies are in tests/rank_sum_cases.py."""

from __future__ import annotations

import pytest
import torch

import rank_sum_cases
from mixgemm.kernels import rank_sum
from mixgemm.kernels.cuda import nvrtc


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_nvrtc_compiles_the_kernel(dtype):
    if not nvrtc.nvrtc_available():
        pytest.skip("NVRTC is not installed")
    defines = rank_sum.host.defines(dtype)
    cubin = nvrtc.compile_cubin(rank_sum.host.SOURCE, tuple(sorted(defines.items())), "sm_90")
    assert cubin[:4] == b"\x7fELF"


def test_what_the_kernel_takes():
    meta = torch.device("meta")
    assert "CUDA" in rank_sum.unsupported_reason(torch.empty(1, 8192, dtype=torch.float16))
    with pytest.MonkeyPatch.context() as mp:  # the checks past the device, on meta tensors posing as CUDA ones
        mp.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
        assert rank_sum.unsupported_reason(torch.empty(1, 8192, dtype=torch.float16, device=meta)) is None
        assert rank_sum.unsupported_reason(torch.empty(64, 8192, dtype=torch.bfloat16, device=meta)) is None
        assert "over the" in rank_sum.unsupported_reason(torch.empty(64, 8192, dtype=torch.float32, device=meta))
        assert "multiple of 16" in rank_sum.unsupported_reason(torch.empty(1, 7, dtype=torch.float16, device=meta))
        assert "dtype" in rank_sum.unsupported_reason(torch.empty(1, 8, dtype=torch.float64, device=meta))
    assert "not CUDA" in rank_sum.group_reason(torch.device("cpu"), 2)
    assert "spans" in rank_sum.group_reason(torch.device("cuda", 0), 16)


def test_off_until_asked():
    from mixgemm.distributed import collectives

    assert collectives.one_shot_enabled() is False  # NCCL until measured on GPUs (collectives._enabled)
    collectives.use_one_shot_sums(True)
    try:
        assert collectives.one_shot_enabled()
    finally:
        collectives.use_one_shot_sums(False)


@pytest.mark.slow(seconds=20)
def test_ranks_agree_on_the_path(tmp_path):
    ranks = rank_sum_cases.spawn(rank_sum_cases.agreement_worker, 2, str(tmp_path))
    for r in ranks:
        assert "error" not in r, r.get("error")
        assert r["made"] is None  # rank 0 could, rank 1 could not: neither takes it
        assert r["why"].startswith("rank 1: symmetric memory could not be set up")
        assert torch.equal(r["sum"], torch.full((2, 8), 3.0))  # through the other path, on both ranks


@pytest.mark.gpu
def test_one_shot_sum_on_two_gpus(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    ranks = rank_sum_cases.spawn(rank_sum_cases.gpu_worker, 2, str(tmp_path))
    for r in ranks:
        assert "error" not in r, r.get("error")
        assert r["why"] is None
        assert r["bad"] == []
        direct = {(dtype, shape) for dtype, shape, d in r["paths"] if d}
        assert (torch.float16, (64, 8192)) in direct and (torch.float32, (64, 8192)) not in direct
