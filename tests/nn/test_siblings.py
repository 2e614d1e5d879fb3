"""mixgemm.nn.siblings: the QuantLinears that read one norm's output (q / k / v, gate / up) keep their resident
layouts as slices of one buffer and run as one launch in compiled one-row calls. On the CPU (the join switched on for
the test: JOIN_ON) the compiled model runs one joined product per group with the logits of the layers one by one,
eager calls and more rows run layer by layer, a member's replaced weight drops the join (and compacting it joins
again), copies run their layers one by one, and layers that cannot share a launch keep their own. GPU: the same
compiled with inductor, and the join holds no more memory than the layers did."""

from __future__ import annotations

import copy
import gc
import pickle

import pytest
import torch

import mixgemm
import mixgemm.nn.siblings as siblings
from mixgemm.nn.linear import SIBLINGS_ATTR, QuantLinear
from mixgemm.nn.siblings import join_siblings, separate_siblings

# N of q 256, k / v 128, gate / up 384: whole 128-row blocks of the layout
CONFIG = dict(hidden_size=256, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, vocab_size=96, pad_token_id=0, bos_token_id=1, eos_token_id=2)
GROUPS = [[f"model.layers.{i}.self_attn.{p}_proj" for p in "qkv"] for i in range(2)] + \
         [[f"model.layers.{i}.mlp.{p}_proj" for p in ("gate", "up")] for i in range(2)]


def tiny(arch: str = "qwen2", precision=None, device: str = "cpu", **over):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(arch, **{**CONFIG, **over})
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval().to(device)
    report = mixgemm.quantize_(model, precision or mixgemm.W4A16(group_size=64, mode="zero_point"),
                               filter_fn=lambda mod, name: not name.endswith("lm_head"))
    mixgemm.compact_(model)  # (on an sm_90 GPU quantize_ did)
    return model, report


@pytest.fixture
def join_on_cpu(monkeypatch):
    monkeypatch.setattr(siblings, "JOIN_ON", ("cuda", "cpu"))


def step(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def groups_of(model) -> list:
    out = []
    for mod in model.modules():
        g = mod.__dict__.get(SIBLINGS_ATTR)
        if g is not None and g not in out:
            out.append(g)
    return out


def compiled(model, ids, monkeypatch, backend="eager") -> tuple[torch.Tensor, list]:
    """Logits of torch.compile(model) (fullgraph) and, per traced call of a group, whether the joined layer ran."""
    runs = []
    real = siblings.SiblingGroup.traced_output

    def counted(self, member, x):
        y = real(self, member, x)
        runs.append(y is not None)
        return y

    monkeypatch.setattr(siblings.SiblingGroup, "traced_output", counted)
    torch._dynamo.reset()
    try:
        return step(torch.compile(model, backend=backend, fullgraph=True), ids), runs
    finally:
        torch._dynamo.reset()
        monkeypatch.setattr(siblings.SiblingGroup, "traced_output", real)


def test_groups_follow_the_norms():
    for arch in ("qwen2", "llama"):
        model, report = tiny(arch)
        assert sorted(map(sorted, report.sibling_groups)) == sorted(map(sorted, GROUPS))
        assert not any(g.joined for g in groups_of(model))  # the CPU joins nothing by default
        assert join_siblings(model) == []  # quantize_ did it already
        assert separate_siblings(model) == 10 and not groups_of(model)
        assert sorted(map(sorted, join_siblings(model))) == sorted(map(sorted, GROUPS))


def test_compiled_one_row_runs_one_product_per_group(join_on_cpu, monkeypatch):
    model, _ = tiny("qwen2")  # q / k / v with biases, zero points
    groups = groups_of(model)
    assert len(groups) == 4 and all(g.joined is not None for g in groups)
    for g in groups:
        storages = {m.quantized_weight()._layouts["wgmma_v1"].weight.untyped_storage().data_ptr() for m in g.members}
        assert len(storages) == 1  # every member's layout is a slice of one buffer
    ids = torch.tensor([[5]])
    eager = step(model, ids)  # layer by layer
    got, runs = compiled(model, ids, monkeypatch)
    assert runs == [True] * 10  # each member's columns of its group's one product
    assert torch.allclose(got, eager, rtol=1e-5, atol=1e-5)
    _, runs = compiled(model, torch.tensor([[5, 6, 7]]), monkeypatch)  # three rows: layer by layer
    assert runs == [False] * 10
    plain, _ = tiny("qwen2")
    separate_siblings(plain)
    assert mixgemm.resident_bytes(plain)["total"] == mixgemm.resident_bytes(model)["total"]
    assert torch.allclose(step(plain, ids), eager, rtol=1e-5, atol=1e-5)
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):  # copies: no group
        assert not groups_of(twin) and torch.allclose(step(twin, ids), eager, rtol=1e-5, atol=1e-5)


def test_a_replaced_weight_drops_the_join(join_on_cpu, monkeypatch):
    model, _ = tiny("llama")
    attn = model.model.layers[1].self_attn
    g = attn.q_proj.__dict__[SIBLINGS_ATTR]
    assert g.joined is not None
    ids = torch.tensor([[7]])
    state = attn.v_proj.state_dict()
    state["scales"] = state["scales"] * 1.5
    attn.v_proj.load_state_dict(state)  # plain codes in between, compacted again: joined again
    assert g.joined is not None
    got, runs = compiled(model, ids, monkeypatch)
    assert all(runs) and torch.allclose(got, step(model, ids), rtol=1e-5, atol=1e-5)
    attn.k_proj.uncompact_()  # plain codes: the group cannot join, its layers run one by one
    assert g.joined is None
    got, runs = compiled(model, ids, monkeypatch)
    assert runs == [True] * 5 + [False] * 3 + [True] * 2  # (layer 0's groups, layer 1's q / k / v, its gate / up)
    assert torch.allclose(got, step(model, ids), rtol=1e-5, atol=1e-5)
    attn.k_proj.compact_()
    assert g.joined is not None


@pytest.mark.parametrize("case", ["act_order", "w8a8", "ragged"])
def test_what_stays_layer_by_layer(case, join_on_cpu):
    if case == "w8a8":
        _, report = tiny("llama", mixgemm.W8A8())
        assert report.sibling_groups == []
    elif case == "ragged":  # k / v of 64 rows each: two layers off the 128-row blocks
        _, report = tiny("llama", num_key_value_heads=1)
        assert sorted(map(sorted, report.sibling_groups)) == sorted(map(sorted, GROUPS[2:]))  # gate / up still
    else:
        model, _ = tiny("llama")
        separate_siblings(model)
        attn = model.model.layers[0].self_attn
        perm = torch.randperm(256, generator=torch.Generator().manual_seed(0))
        for name in ("q_proj", "k_proj", "v_proj"):
            setattr(attn, name, QuantLinear.from_quantized(getattr(attn, name).quantized_weight(), input_perm=perm))
        assert sorted(map(sorted, join_siblings(model))) == sorted(map(sorted, GROUPS[1:]))


def test_autograd_runs_layer_by_layer(join_on_cpu, monkeypatch):
    """A compiled call that records a gradient to x does not take the joined layer (whose plain parameters are
    stand-ins on the GPU)."""
    model, _ = tiny("llama")
    attn = model.model.layers[0].self_attn
    runs = []
    real = siblings.SiblingGroup.traced_output
    monkeypatch.setattr(siblings.SiblingGroup, "traced_output",
                        lambda self, m, x: runs.append(real(self, m, x)) or runs[-1])
    x = torch.randn(1, 256, requires_grad=True)
    torch._dynamo.reset()
    try:
        y = torch.compile(lambda t: attn.q_proj(t) + attn.k_proj(t)[..., :1].sum(), backend="eager",
                          fullgraph=True)(x)
    finally:
        torch._dynamo.reset()
    assert runs == [None, None] and y.requires_grad


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["sym", "zero_point"])
def test_joined_on_the_gpu(dtype, mode, monkeypatch, rel_err):
    """CUDA, one layout per weight (sm_90): quantize_ joins the groups without holding more memory than the layers
    did; compiled with inductor, a one-row step runs one product per group with the logits of the layers one by one
    (eager) within the dtype's tolerance."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("one resident layout per weight is the sm_90 default")
    monkeypatch.setattr(siblings, "JOIN_ON", ())
    model, _ = tiny("qwen2", mixgemm.W4A16(group_size=64, mode=mode), device="cuda")
    model = model.to(dtype)  # (moves and compacts again: nothing joined while JOIN_ON is empty)
    groups = groups_of(model)
    assert len(groups) == 4 and not any(g.joined for g in groups)
    monkeypatch.setattr(siblings, "JOIN_ON", ("cuda",))
    gc.collect()  # (the move's former weight objects, in reference cycles, hold layouts until a collection)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    assert all(g.try_join() for g in groups)
    torch.cuda.synchronize()
    biases = sum(g.joined.bias.numel() * g.joined.bias.element_size() for g in groups if g.joined.bias is not None)
    # the joined buffers replaced the layers' own: what is new is the biases joined and each hidden layer's stand-ins
    # (one element each: at most four 512-byte blocks per group)
    assert torch.cuda.memory_allocated() - before <= biases + 4 * 512 * len(groups) + 4096
    ids = torch.tensor([[5]], device="cuda")
    eager = step(model, ids)
    got, runs = compiled(model, ids, monkeypatch, backend="inductor")
    assert runs == [True] * 10
    assert rel_err(got.float(), eager.float()) < (2e-3 if dtype == torch.float16 else 2e-2)


def test_a_sharded_group_joins_its_shards(join_on_cpu, monkeypatch):
    """Tensor-parallel sharding replaces a layer's tensors in place and changes its N (mixgemm.distributed): the group
    joins the shards again, with their columns."""
    from mixgemm.distributed.shard import COLWISE, shard_quant_linear
    from mixgemm.distributed.styles import _adopt

    for kv_heads, joins in ((4, True), (2, False)):  # k / v shards of 128 rows, or of 64 (two off the row blocks)
        model, _ = tiny("llama", num_key_value_heads=kv_heads)
        attn = model.model.layers[0].self_attn
        x = torch.randn(1, 256)
        g = attn.q_proj.__dict__[SIBLINGS_ATTR]
        for name in ("q_proj", "k_proj", "v_proj"):
            layer = getattr(attn, name)
            layer.uncompact_()
            _adopt(layer, shard_quant_linear(layer, COLWISE, 1, 2))  # rank 1 of 2: the second half of the rows
            layer.compact_()
        assert (g.joined is not None) == joins
        if joins:
            ns = [layer.out_features for layer in g.members]
            assert g.columns == [(sum(ns[:i]), sum(ns[:i + 1])) for i in range(3)] and sum(ns) == 384
        want = [getattr(attn, name)(x) for name in ("q_proj", "k_proj", "v_proj")]
        torch._dynamo.reset()
        try:
            got = torch.compile(lambda t, a=attn: (a.q_proj(t), a.k_proj(t), a.v_proj(t)), backend="eager",
                                fullgraph=True)(x)
        finally:
            torch._dynamo.reset()
        assert g._traced is None
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def test_assigned_tensors_and_partial_steps(join_on_cpu, monkeypatch):
    """A member's tensor assigned (not through load_state_dict) drops the join, so compiled calls see it; a replaced
    join's buffers go without a garbage collection; a compiled call of some members only leaves the next full step
    its joined product."""
    import weakref

    model, _ = tiny("qwen2")
    attn = model.model.layers[0].self_attn
    g = attn.v_proj.__dict__[SIBLINGS_ATTR]
    ids = torch.tensor([[3]])
    attn.v_proj.bias = torch.nn.Parameter(attn.v_proj.bias.detach() + 1.0, requires_grad=False)
    assert g.joined is None
    got, runs = compiled(model, ids, monkeypatch)
    assert runs[:3] == [False] * 3 and torch.allclose(got, step(model, ids), rtol=1e-5, atol=1e-5)
    attn.v_proj.compact_()  # (compacted already: nothing to do, and no join either)
    g.try_join()
    assert g.joined is not None
    old = weakref.ref(g.joined.quantized_weight()._layouts["wgmma_v1"].weight)
    gc.disable()
    try:
        attn.k_proj.load_state_dict(attn.k_proj.state_dict())  # joined again over the reloaded layer
        assert g.joined is not None and old() is None
    finally:
        gc.enable()
    torch._dynamo.reset()
    try:
        torch.compile(lambda t: attn.q_proj(t), backend="eager", fullgraph=True)(torch.randn(1, 256))
    finally:
        torch._dynamo.reset()
    assert g._traced is not None  # k / v were not called
    got, runs = compiled(model, ids, monkeypatch)
    assert runs == [True] * 10 and torch.allclose(got, step(model, ids), rtol=1e-5, atol=1e-5)
