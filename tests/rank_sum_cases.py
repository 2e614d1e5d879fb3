"""The multi-process half of tests/distributed/test_rank_sum.py: one job of 2 processes (gloo on the CPU, NCCL on two
GPUs) whose ranks save what they saw to ``dir/rank<r>.pt``.

* ``agreement_worker`` (gloo): a group whose rank 1 cannot set up the one-shot sum while rank 0 can (both faked:
  the CPU has no symmetric memory) sums through NCCL's path on both ranks, and both name rank 1's reason.
* ``gpu_worker`` (NCCL, one GPU a rank): the one-shot kernel against the float32 sum in rank order of every rank's
  input (drawn on every rank from per-rank seeds): bit for bit, every dtype, odd sizes, back-to-back calls of
  changing sizes (the staging buffer's two halves), replays of a captured CUDA graph with new inputs, a
  torch.compile'd step (mode "reduce-overhead"), NCCL's own sum at world 2, a sum too large for the kernel (NCCL's
  path), inputs unchanged and outputs equal on every rank.
"""

from __future__ import annotations

import datetime
import os
import socket
import traceback

import torch
import torch.distributed as dist

SHAPES = [(1, 8192), (16, 8192), (3, 4096), (1, 64), (7, 1000), (2, 5, 512), (64, 8192)]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def spawn(body, world: int, directory: str) -> list[dict]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_main, args=(world, port, directory, body), nprocs=world)
    return [torch.load(os.path.join(directory, f"rank{r}.pt"), weights_only=False) for r in range(world)]


def _main(rank: int, world: int, port: int, directory: str, body) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0",
                      TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    results: dict = {}
    try:
        body(rank, world, results)
    except Exception:  # noqa: BLE001 -- the test reads it
        results["error"] = traceback.format_exc()
    torch.save(results, os.path.join(directory, f"rank{rank}.pt"))
    if results.get("cuda"):
        os._exit(0)  # (destroy_process_group after CUDA graphs with NCCL may not return)
    dist.destroy_process_group()


def agreement_worker(rank: int, world: int, results: dict) -> None:
    from mixgemm.distributed import collectives
    from mixgemm.kernels import rank_sum

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(minutes=2))

    class Made:  # what RankSum would be on rank 0 (never called: the ranks refuse it together)
        key = -1

    def fake_ranksum(group, device):
        if rank == 1:
            raise RuntimeError("no peer access on this rank")
        return Made()

    rank_sum.group_reason = lambda device, world: None
    rank_sum.RankSum = fake_ranksum
    device = torch.device("cpu")
    results["made"] = collectives.one_shot_sums(dist.group.WORLD, device)
    results["why"] = collectives.why_no_one_shot(dist.group.WORLD, device)
    y = torch.full((2, 8), float(rank + 1))
    results["sum"] = collectives.sum_over_ranks(y.clone(), dist.group.WORLD, results["made"])


def _inputs(shape: tuple, dtype: torch.dtype, call: int, world: int) -> list[torch.Tensor]:
    """Every rank's input of call ``call`` (each rank draws all of them: the expected sum needs them)."""
    return [torch.randn(shape, generator=torch.Generator().manual_seed(1000 * call + r)).to(dtype)
            for r in range(world)]


def _expected(xs: list[torch.Tensor]) -> torch.Tensor:
    acc = torch.zeros(xs[0].shape, dtype=torch.float32)
    for x in xs:
        acc += x.float()
    return acc.to(xs[0].dtype)


def gpu_worker(rank: int, world: int, results: dict) -> None:
    from mixgemm.distributed.collectives import one_shot_sums, sum_over_ranks, use_one_shot_sums, why_no_one_shot
    from mixgemm.kernels.rank_sum import unsupported_reason

    use_one_shot_sums(True)
    results["cuda"] = True
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev,
                            timeout=datetime.timedelta(minutes=3))
    group = dist.group.WORLD
    one = one_shot_sums(group, dev)
    results["why"] = why_no_one_shot(group, dev)
    if one is None:
        return
    bad, call = [], 0

    def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        got = got.cpu()
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            diff = (got.double() - want.double()).abs().max().item() if got.shape == want.shape else "shape"
            bad.append(f"{name}: max |diff| {diff}")
        every = [torch.empty_like(got) for _ in range(world)]
        dist.all_gather_object(every, got)
        if not all(torch.equal(e, got) for e in every):
            bad.append(f"{name}: ranks' outputs differ")

    for _ in range(2):  # twice over: both halves of the staging buffer, sizes changing call to call
        for dtype in DTYPES:
            for shape in SHAPES:
                xs = _inputs(shape, dtype, call, world)
                y = xs[rank].to(dev)
                kept = y.clone()
                direct = unsupported_reason(y) is None
                out = one(y) if direct else sum_over_ranks(y.clone(), group, one)
                check(f"{dtype} {shape} call {call} ({'one-shot' if direct else 'NCCL'})", out, _expected(xs))
                if not torch.equal(y, kept):
                    bad.append(f"{dtype} {shape}: input modified")
                results.setdefault("paths", set()).add((dtype, shape, direct))
                call += 1

    # a captured CUDA graph, replayed with new inputs
    ys = [torch.empty(shape, dtype=torch.float16, device=dev) for shape in SHAPES[:5]]
    for y in ys:
        one(y.normal_())
    torch.cuda.synchronize()
    dist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [one(y) for y in ys]
    for replay in range(3):
        xs_all = [_inputs(y.shape, y.dtype, 9000 + 10 * replay + i, world) for i, y in enumerate(ys)]
        for y, xs in zip(ys, xs_all, strict=True):
            y.copy_(xs[rank])
        graph.replay()
        for i, (out, xs) in enumerate(zip(outs, xs_all, strict=True)):
            check(f"graph replay {replay} call {i}", out, _expected(xs))

    # compiled with CUDA graphs (the op mixgemm::rank_sum)
    def step(y):
        return sum_over_ranks(y * 2, group, one) + 1

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for i in range(4):
        xs = _inputs((1, 8192), torch.float16, 20000 + i, world)
        want = (_expected([2 * x for x in xs]).float() + 1).half()
        check(f"compiled call {i}", compiled(xs[rank].to(dev)).clone(), want)

    if world == 2:  # NCCL sums two fp16 values into one rounding too
        xs = _inputs((1, 8192), torch.float16, 30000, world)
        nccl = xs[rank].to(dev)
        dist.all_reduce(nccl, group=group)
        check("NCCL's all_reduce", one(xs[rank].to(dev)), nccl.cpu())
    torch.cuda.synchronize()
    results["bad"] = bad
