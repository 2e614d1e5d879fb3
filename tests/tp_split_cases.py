"""The multi-process half of tests/distributed/test_tp_splits.py: one gloo job of 8 CPU processes, TP 2 (ranks 0-1),
TP 4 (0-3) and TP 8 (all).

Models (float32, random weights, W4A16 per-channel): a tiny Llama (hidden 64, intermediate 128, 8 / 8 heads of 8, 1
layer) with vocabularies of 1000, 1001, 32064 (Phi-3) and 151936 (Qwen2): lm_head shards of 500 / 250 / 125 rows
(1000), uneven ones (1001: 501 / 251 / 126 rows, the last rank's tail padding), 4008 (32064 / 8), 18992 (151936 / 8);
q / k / v shards of 8 rows at TP 8 (64 / 8): none a multiple of the kernels' 16-row tile. ``prepare`` quantizes each
once and keeps the unsharded logits; each rank loads, shards (tensor_parallel_, the model's own plan; at TP 8 on its
default mesh) and runs them.
Also, per world size: an eager decode step counted for DTensor conversions and module hooks (none), and a step
compiled by dynamo (backend "eager": the functional collectives traced) against the eager one; at TP 8, the ways a
job of unequal ranks fails: every rank must raise the same error.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

import tp_cases

VOCABS = (1000, 1001, 32064, 151936)
WORLDS = (2, 4, 8)
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=8, num_key_value_heads=8, head_dim=8,
            num_hidden_layers=1)


def ids() -> torch.Tensor:
    return torch.randint(0, 1000, (2, 5), generator=torch.Generator().manual_seed(1))


def model(vocab: int, intermediate: int = 128, group: int = -1):
    import mixgemm
    from mixgemm.integrations.hf import llama_config, random_llama

    m = random_llama(llama_config(**{**TINY, "intermediate_size": intermediate}, vocab_size=vocab), seed=0)
    mixgemm.quantize_(m, mixgemm.W4A16(group_size=group))
    return m


def prepare(directory: str) -> dict:
    """{vocab: unsharded logits}; each quantized model pickled into ``directory``."""
    out = {}
    for vocab in VOCABS:
        m = model(vocab)
        with torch.no_grad():
            out[vocab] = m(ids()).logits.float()
        torch.save(m, os.path.join(directory, f"v{vocab}.pt"))
    return out


def _counted_step(m, mesh) -> dict:
    """One eager decode step (batch 2) while DTensor construction / redistribution is counted; the module hooks of
    the quantized shards; a compiled step (dynamo, backend "eager") against the eager one."""
    from torch.distributed.tensor import DTensor

    from mixgemm.integrations.hf import decode_step, static_cache
    from mixgemm.nn import QuantLinear

    calls = {"n": 0}
    originals = {name: getattr(DTensor, name) for name in ("from_local", "redistribute", "to_local")}

    def counting(fn):
        def wrapped(*args, **kwargs):
            calls["n"] += 1
            return fn(*args, **kwargs)
        return wrapped

    step = decode_step(m)
    tok = ids()[:, :1]

    def prefilled():
        cache = static_cache(m, 2, 16)
        m(ids(), past_key_values=cache, cache_position=torch.arange(5), use_cache=True)
        return cache

    with torch.no_grad():
        cache = prefilled()
        for name, fn in originals.items():
            setattr(DTensor, name, counting(fn))
        try:
            eager = step(tok, torch.tensor([5]), cache).float()
        finally:
            for name, fn in originals.items():
                setattr(DTensor, name, fn)
        torch._dynamo.reset()
        compiled = torch.compile(step, fullgraph=True, dynamic=False, backend="eager")
        again = compiled(tok, torch.tensor([5]), prefilled()).float()
    quant = [mod for mod in m.modules() if isinstance(mod, QuantLinear)]
    return {"dtensor_calls": calls["n"], "eager": eager, "compiled": again,
            "hooks": sum(len(q._forward_hooks) + len(q._forward_pre_hooks) for q in quant),
            "classes": sorted({type(q).__name__ for q in quant})}


def _errors(rank: int, world: int, mesh, directory: str) -> dict:
    """Unequal ranks: each case's error message on this rank (None: no error)."""
    from mixgemm.distributed import tensor_parallel_

    def load():
        return torch.load(os.path.join(directory, "v1000.pt"), weights_only=False)

    def other_weights():
        m = load()
        if rank == 1:
            with torch.no_grad():
                m.model.norm.weight.add_(1.0)
        return tensor_parallel_(m, mesh, src_data_rank=None)

    def other_shape():
        return tensor_parallel_(model(1000, intermediate=256) if rank == 3 else load(), mesh)

    def one_refuses():  # rank 2's layers in groups of 32: its K per rank (64 / 8) cuts a group, the others' do not
        return tensor_parallel_(model(1000, group=32) if rank == 2 else load(), mesh)

    out = {}
    for name, fn in (("other weights", other_weights), ("other shape", other_shape), ("one refuses", one_refuses)):
        try:
            fn()
            out[name] = None
        except ValueError as e:
            out[name] = str(e)
    return out


def worker(rank: int, world: int, directory: str, results: dict) -> None:
    from torch.distributed.device_mesh import DeviceMesh

    from mixgemm.distributed import tensor_parallel_

    groups = {size: dist.new_group(list(range(size))) for size in WORLDS if size < world}
    for size in WORLDS:
        if rank < size:
            mesh = DeviceMesh.from_group(groups.get(size, dist.group.WORLD), "cpu")
            res = results.setdefault(size, {})
            for vocab in VOCABS:
                m = torch.load(os.path.join(directory, f"v{vocab}.pt"), weights_only=False)
                tensor_parallel_(m, None if size == world else mesh)  # (None: the default mesh, every rank)
                with torch.no_grad():
                    res[vocab] = {"logits": m(ids()).logits.float(), "lm_head_rows": m.lm_head.out_features}
                if vocab == VOCABS[0]:
                    res["step"] = _counted_step(m, mesh)
            if size == world:
                res["errors"] = _errors(rank, world, mesh, directory)
        dist.barrier()


def run(directory: str) -> tuple[dict, list[dict]]:
    """prepare + the 8-process job: (unsharded logits by vocab, [results of rank r: {world: ...}])."""
    ref = prepare(directory)
    return ref, tp_cases.spawn_gloo(worker, max(WORLDS), directory)
