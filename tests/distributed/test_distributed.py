"""Tensor parallelism (mixgemm.distributed) on the CPU: the split math in one process, then sharded models in a
gloo job of 2 and 4 processes (tests/tp_cases.py: one spawn for both world sizes) against the unsharded model.

Acceptance: weight-only formats give the unsharded logits to float32 rounding (1e-5 relative to the largest logit);
activation-quantized formats (W8A8 / W4A8), whose row-parallel shards quantize their own slice of each token when
the activation block spans the whole row (per-channel weights, act_block="token"), are at most 1.25x as far from the
float64 reference (dequantized weights, unquantized activations) as the unsharded model.
"""

from __future__ import annotations

import pytest
import torch

import tp_cases
from mixgemm.distributed import (
    check_split,
    shard_quant_linear,
    shard_quantized_weight,
)
from mixgemm.formats.int_scales import int_group_scales, quantize_weight_int_scales
from mixgemm.formats.weight import MODES, QuantConfig, dequantize_weight, quantize_weight
from mixgemm.nn import QuantLinear

pytestmark = pytest.mark.slow(seconds=75)  # the `tp` fixture: a 4-process gloo job

EXACT = 1e-5


def _rel(a, b) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def _weight(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.05 + torch.randn(n, 1, generator=g) * 0.01


# ---- the split itself, in one process ----------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("group", [32, 128, -1])
@pytest.mark.parametrize("world", [2, 4])
def test_shards_reassemble_the_weight_exactly(bits, mode, group, world):
    scale_dtype = torch.bfloat16 if mode == "offset" else torch.float16
    qw = quantize_weight(_weight(48 * world, 512),
                         bits=bits, group_size=group, mode=mode, scale_dtype=scale_dtype)
    full = dequantize_weight(qw, torch.float64)
    for dim in (0, 1):
        shards = [shard_quantized_weight(qw, dim, r, world) for r in range(world)]
        assert all(s.config == qw.config for s in shards)
        assert torch.equal(torch.cat([dequantize_weight(s, torch.float64) for s in shards], dim=dim), full)
        assert torch.equal(torch.cat([s.codes() for s in shards], dim=dim), qw.codes())
        n, k = qw.shape
        assert shards[0].shape == ((n // world, k) if dim == 0 else (n, k // world))


def _layer(bits, group, mode, act_mode=None, act_block="group", k=512, n=128, bias=True, seed=0):
    lin = torch.nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(_weight(n, k, seed))
        if bias:
            lin.bias.copy_(torch.randn(n, generator=torch.Generator().manual_seed(seed + 1)))
    return QuantLinear.from_linear(lin, QuantConfig(bits=bits, group_size=group, mode=mode), act_mode=act_mode,
                                   act_block=act_block)


@pytest.mark.parametrize("fmt", [(4, 32, "sym", None), (4, 128, "zero_point", None), (4, -1, "offset", None),
                                 (8, -1, "sym", None), (8, 64, "offset", None),
                                 (4, 128, "sym", "sym"), (8, 32, "zero_point", "asym")])
@pytest.mark.parametrize("world", [2, 4])
def test_layer_shards_compose_to_the_layer(fmt, world):
    """Column shards concatenate, row shards sum (the bias added once) to the layer's output. For the activation-
    quantized formats with groups, a row split keeps every (token, group) activation block whole, so it is exact
    too."""
    bits, group, mode, act = fmt
    layer = _layer(bits, group, mode, act)
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = layer(x)
        cols = [shard_quant_linear(layer, 0, r, world, "l") for r in range(world)]
        rows = [shard_quant_linear(layer, 1, r, world, "l") for r in range(world)]
        assert _rel(torch.cat([c(x) for c in cols], dim=-1), want) <= EXACT
        parts = torch.stack([s(xs) for s, xs in zip(rows, x.chunk(world, dim=-1), strict=True)])
        assert _rel(parts.sum(0), want) <= EXACT
    assert all(torch.equal(v, layer.state_dict()[k]) for k, v in before.items())  # the layer is not modified
    assert torch.equal(rows[0].bias, layer.bias) and all(not bool(r.bias.any()) for r in rows[1:])
    for s, (n, k) in ((cols[0], (128 // world, 512)), (rows[0], (128, 512 // world))):
        assert (s.out_features, s.in_features) == (n, k)
        fresh = QuantLinear(k, n, bits=bits, group_size=group, mode=mode, act_mode=act)
        fresh.load_state_dict(s.state_dict())  # the shard's own shapes and format
        assert s.state_dict()["_extra_state"][-2:].tolist() == [n, k]


@pytest.mark.parametrize("world", [2, 4])
def test_integer_group_scales_survive_the_split(world):
    qw = quantize_weight_int_scales(_weight(64, 2048, seed=3), group_size=128)
    assert int_group_scales(qw) is not None
    for dim in (0, 1):
        for r in range(world):
            s = shard_quantized_weight(qw, dim, r, world)
            f = int_group_scales(s)
            assert f is not None  # the W4A8 per-token layer keeps its integer-scales route on every rank
            assert torch.allclose(f.step[:, None] * f.mult.double(), s.scales.double(), rtol=1e-6, atol=0)


def test_bad_splits_name_the_layer_and_sizes():
    cfg = QuantConfig(bits=4, group_size=128)
    # an AWQ-style K: 11008 / 4 = 2752 = 21.5 groups of 128
    with pytest.raises(ValueError, match=r"mlp\.down_proj: row-parallel.*K=11008.*4 ranks.*K=2752.*group size 128"):
        check_split((4096, 11008), cfg, 1, 4, "mlp.down_proj")
    assert check_split((96, 512), cfg, 0, 4, "k_proj") == 24  # the layouts pad a shard's rows to their tile
    assert check_split((1000, 64), cfg, 0, 8, "lm_head") == 125
    assert check_split((1001, 64), cfg, 0, 8, "lm_head", uneven=True) == 126  # a gathered output: ceil(N / world)
    with pytest.raises(ValueError, match=r"q_proj: column-parallel.*N \(out_features\)=100 is not divisible by 3.*"
                                         r"only a gathered output"):
        check_split((100, 512), cfg, 0, 3, "q_proj")
    with pytest.raises(ValueError, match=r"o_proj: row-parallel.*K=1000.*not divisible by 3"):
        check_split((64, 1000), QuantConfig(bits=8, group_size=-1), 1, 3, "o_proj")
    for bits in (4, 8):  # per-channel: any K split is exact (int4 shards of odd K are repacked)
        assert check_split((16, 6), QuantConfig(bits=bits, group_size=-1), 1, 2, "w") == 3
    assert check_split((8, 96), cfg, 0, 1) == 8 and check_split((8, 96), cfg, 1, 1) == 96  # one rank: no split
    qw = quantize_weight(_weight(64, 256), bits=4, group_size=64)
    for rank, world in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(ValueError, match="rank"):
            shard_quantized_weight(qw, 0, rank, world)
    with pytest.raises(ValueError, match="dim must be 0"):
        shard_quantized_weight(qw, 2, 0, 2)
    with pytest.raises(TypeError, match="QuantLinear"):
        shard_quant_linear(torch.nn.Linear(8, 8), 0, 0, 2)
    layer = _layer(4, 128, "sym", bias=False, k=640)  # 5 groups of 128; 80 per rank at TP 8: no group size fits
    with pytest.raises(ValueError, match=r"layers\.3\.mlp\.down_proj: row-parallel.*K=640.*8 ranks.*K=80.*no group "
                                         r"size of 32 or more divides both"):
        shard_quant_linear(layer, 1, 0, 8, "layers.3.mlp.down_proj")
    a8 = _layer(4, 128, "sym", "sym")  # an activation-quantized layer is not re-grouped
    with pytest.raises(ValueError, match=r"o_proj: row-parallel.*K=512.*8 ranks.*K=64.*activation blocks"):
        shard_quant_linear(a8, 1, 0, 8, "o_proj")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(11008, 128, 4, 64), (512, 256, 4, 128), (11008, 128, 8, 32), (384, 128, 2, 64)])
def test_row_split_cutting_a_group_regroups_exactly(mode, shape):
    """A weight-only row split that cuts groups (AWQ's K = 11008 in groups of 128 at TP 4: 2752 per rank) re-groups
    the layer into the largest group size dividing both, each new group keeping its old group's parameters: the
    shards' partial products sum to the layer's output."""
    k, group, world, want = shape
    layer = _layer(4, group, mode, k=k, n=48)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        rows = [shard_quant_linear(layer, 1, r, world, "down_proj") for r in range(world)]
        assert all(r.group_size == want and r.in_features == k // world for r in rows)
        parts = torch.stack([s(xs) for s, xs in zip(rows, x.chunk(world, dim=-1), strict=True)])
        assert _rel(parts.sum(0), layer(x)) <= EXACT
    full = dequantize_weight(layer.quantized_weight(), torch.float64)
    assert torch.equal(torch.cat([dequantize_weight(r.quantized_weight(), torch.float64) for r in rows], 1), full)


def test_input_permutation():
    layer = _layer(4, 64, "sym", bias=False)
    local = torch.cat([torch.randperm(256, generator=torch.Generator().manual_seed(i)) + 256 * i for i in range(2)])
    layer.register_buffer("input_perm", local)
    col = shard_quant_linear(layer, 0, 1, 2)
    assert torch.equal(col.input_perm, local)  # the input is replicated: the permutation stays whole
    row = shard_quant_linear(layer, 1, 1, 2)
    assert torch.equal(row.input_perm, local[256:] - 256)  # each rank permutes inside its own slice
    layer.input_perm = torch.randperm(512, generator=torch.Generator().manual_seed(5))
    with pytest.raises(ValueError, match=r"down: row-parallel split of a layer with an input permutation"):
        shard_quant_linear(layer, 1, 0, 2, "down")


# ---- sharded models: one gloo job of 4 processes ------------------------------------------------------------------
@pytest.fixture(scope="module")
def tp(tmp_path_factory):
    cases, ranks = tp_cases.run(str(tmp_path_factory.mktemp("tp")))
    return cases, ranks


def _cases(kind):
    names = [f"tiny {n}" for n, c in tp_cases.precisions().items() if (c.act_mode is None) == (kind == "exact")]
    if kind == "exact":
        names += ["70b/8 W4A16 g128 sym", "bias W4A16 g128 zero_point", "mixed plan", "regroup W4A16 g256",
                  "quantize after W4A16 g128 zero_point"]
    else:
        names += ["quantize after W4A8 g128 token int-scales"]
    return names


@pytest.mark.parametrize("world", tp_cases.WORLDS)
@pytest.mark.parametrize("case", _cases("exact"))
def test_weight_only_logits_equal_unsharded(tp, case, world):
    _logits_equal_unsharded(tp, case, world)


def _logits_equal_unsharded(tp, case: str, world: int) -> dict:
    """Every rank's logits of ``case`` equal (the output is replicated) and within EXACT of the unsharded model's;
    returns rank 0's results."""
    cases, ranks = tp
    got = [r[world][case]["logits"] for r in ranks[:world]]
    assert _rel(got[0], cases[case]["ref"]) <= EXACT
    assert all(torch.equal(g, got[0]) for g in got[1:])
    return ranks[0][world][case]


@pytest.mark.parametrize("world", tp_cases.WORLDS)
@pytest.mark.parametrize("case", _cases("a8"))
def test_activation_quantized_error_within_1_25x(tp, case, world):
    cases, ranks = tp
    c = cases[case]
    got = [r[world][case]["logits"] for r in ranks[:world]]
    err_tp = float((got[0].double() - c["ref64"]).norm())
    err_1 = float((c["ref"].double() - c["ref64"]).norm())
    assert err_1 > 0 and err_tp <= 1.25 * err_1
    assert all(torch.equal(g, got[0]) for g in got[1:])
    cfg = c["config"]
    if cfg.group_size != -1 and cfg.act_block == "group":  # activation blocks = weight groups: none is cut
        assert _rel(got[0], c["ref"]) <= EXACT
    if "token int-scales" in case:
        routes = [x for r in ranks[:world] for x in r[world][case]["int_scale_routes"]]
        assert routes and all(routes)


@pytest.mark.parametrize("world", tp_cases.WORLDS)
@pytest.mark.parametrize("arch", list(tp_cases.HF_SHAPES))
def test_moe_and_qwen3_plans_equal_unsharded(tp, arch, world):
    """The models' own plans: MoE experts split per expert (gate / up packed, down row-parallel, the module's output
    summed), Qwen3's q / k norms and DeepSeek-V2's joint kv projection left replicated, attention sinks (Granite-SWA,
    GraniteMoE-SWA, MiMo-V2-Flash, Hunyuan-V4 in float64; Beam's gate bias: bare parameters) split with the heads; the
    logits are the unsharded model's."""
    case = next(name for name in tp[0] if name.startswith(f"{arch} "))
    r0 = _logits_equal_unsharded(tp, case, world)
    if arch == "qwen3":
        assert "replicated_with_grad_allreduce" in r0["skipped"]["model.layers.0.self_attn.q_norm"]
    elif arch in tp_cases.ATTENTION_PARAM_ARCHS:  # a per-head parameter splits with the heads; local_params: nothing
        assert r0["sharded"][f"model.layers.0.self_attn.{tp_cases.ATTENTION_PARAM_ARCHS[arch]}"] == "colwise"
        assert r0["attention_param"] == 8 // world
        assert "local_params" in r0["skipped"]["model.layers.0.self_attn"]
    else:
        if arch == "deepseek_v2":  # MLA: the joint kv projection stays whole, kv_b_proj splits by heads
            assert "mla_kv_a_proj" in r0["skipped"]["model.layers.0.self_attn.kv_a_proj_with_mqa"]
            assert r0["sharded"]["model.layers.0.self_attn.kv_b_proj"] == "colwise"
        assert r0["sharded"]["model.layers.0.mlp.experts"] == "moe_tp_experts"
        assert r0["sharded"]["model.layers.0.mlp.experts.gate_up_proj"] == "packed_colwise"
        assert r0["sharded"]["model.layers.0.mlp.experts.down_proj"] == "rowwise"


@pytest.mark.parametrize("world", tp_cases.WORLDS)
@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_expert_parallel_plan_equals_unsharded(tp, arch, world):
    """model_ep_plan: each rank keeps E / world whole experts, routes the others' slots nowhere and the ranks' outputs
    are summed: the unsharded logits."""
    case = next(name for name in tp[0] if name.startswith(f"ep {arch} "))
    r0 = _logits_equal_unsharded(tp, case, world)
    experts = tp_cases.HF_SHAPES[arch].get("num_experts", tp_cases.HF_SHAPES[arch].get("num_local_experts"))
    assert r0["local_experts"] == r0["num_experts"] == experts // world
    assert _rel(*r0["one_token"]) <= EXACT
    assert r0["sharded"]["model.layers.0.mlp.experts"] == "ep_dispatch_experts"
    assert r0["sharded"]["model.layers.0.mlp.experts.down_proj"] == "grouped_gemm"


@pytest.mark.parametrize("world", tp_cases.WORLDS)
def test_model_details(tp, world):
    cases, ranks = tp
    r0 = ranks[0][world]
    # the row-parallel bias lives on rank 0 only
    biases = [r[world]["bias W4A16 g128 zero_point"]["o_proj_bias"] for r in ranks[:world]]
    assert bool(biases[0].abs().sum() > 0) and all(not bool(b.any()) for b in biases[1:])
    # mixed plan: the float lm_head is sharded by torch's own style
    assert r0["mixed plan"]["lm_head"] == "Linear" and "lm_head" in r0["mixed plan"]["sharded"]
    assert len(r0["tiny W4A16 g128 sym"]["sharded"]) == 8  # q k v o gate up down + lm_head
    # quantize_ after sharding: every Linear is a QuantLinear shard
    for name in ("quantize after W4A16 g128 zero_point", "quantize after W4A8 g128 token int-scales"):
        assert r0[name]["n_quant"] == 8
    # a shard's state dict: the shard's own N, K, and it reloads into a fresh QuantLinear of that shape
    sd = r0["tiny W4A16 g128 offset bf16-scales"]
    assert sd["extra_state"][-2:] == [512, 1024 // world] and sd["reload_equal"]


@pytest.mark.parametrize("world", tp_cases.WORLDS)
@pytest.mark.parametrize("name", list(tp_cases.style_plans()))
def test_styles_with_other_layouts(tp, name, world):
    _, ranks = tp
    model, x = tp_cases.style_mlp()
    with torch.no_grad():
        want = model(x)
    r = ranks[0][world][f"style {name}"]
    assert _rel(r["out"], want) <= EXACT
    expect = {"colwise + rowwise to a Shard(-1) DTensor": ["S(1)"], "DTensor input + Replicate DTensor output": ["R"]}
    assert r.get("placements") == expect.get(name)


def test_bad_plans_raise_on_every_rank(tp):
    _, ranks = tp
    world = max(tp_cases.WORLDS)
    errors = [{k: v for k, v in r[world].items() if k.startswith("error")} for r in ranks]
    assert all(e == errors[0] for e in errors[1:])  # the same verdict everywhere: no rank waits in a collective
    e = errors[0]
    assert "num_attention_heads=10 is not divisible by the tensor-parallel size 4" in e["error heads"]
    assert "model.layers.0.self_attn.q_proj" in e["error style"] and "'sequence_parallel'" in e["error style"]
    assert e["error group"].startswith("model.layers.0.self_attn.o_proj: row-parallel split of [N=512, K=512] over 4 "
                                       "ranks gives K=128 per rank, not a multiple of the group size 256")


def test_model_plan_is_the_models_own():
    from mixgemm.distributed import model_tp_plan
    from mixgemm.integrations.hf import llama_config, random_llama

    plan = model_tp_plan(random_llama(llama_config()))
    assert plan["model.layers.*.self_attn.q_proj"] == "colwise" and plan["model.layers.*.mlp.down_proj"] == "rowwise"
    assert plan["lm_head"] in ("colwise_rep", "colwise_gather_output")  # transformers' name for it changed
    assert len(plan) == 8


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_older_transformers_ep_plan_is_the_same_plan(arch):
    """transformers 5.17's expert-parallel plans ("ep_router" on the router, "moe_tp_experts" on the experts module)
    give the plan of later versions' ("ep_dispatch_experts" on the experts module, the router replicated)."""
    from mixgemm.distributed import model_ep_plan
    from mixgemm.distributed.plan import ep_dispatch_form

    model = tp_cases.hf_model(arch)
    newer = model_ep_plan(model)
    model.config.base_model_ep_plan = {  # (as transformers 5.17 writes Qwen3-MoE's and Mixtral's)
        "layers.*.mlp.gate": "ep_router", "layers.*.mlp.experts.gate_up_proj": "grouped_gemm",
        "layers.*.mlp.experts.down_proj": "grouped_gemm", "layers.*.mlp.experts": "moe_tp_experts"}
    assert model_ep_plan(model) == newer
    assert newer["model.layers.*.mlp.experts"] == "ep_dispatch_experts"
    assert not any(v == "ep_router" for v in newer.values())
    plain = {"layers.*.mlp.experts": "moe_tp_experts"}  # tensor parallel: left as it is
    assert ep_dispatch_form(plain) == plain


def test_bare_parameter_entries():
    """A plan entry naming a bare parameter (Granite-SWA's "layers.*.self_attn.sinks": "colwise") splits it as
    transformers' shard_param does (colwise: dim ndim - 2, dim 0 of a vector; rowwise: the last); an indivisible split
    or a style that has no meaning for a parameter is an error naming it. Entries naming modules are not taken."""
    from mixgemm.distributed.plan import _plan_parameters

    model = torch.nn.Module()
    model.attn = torch.nn.Module()
    model.attn.sinks = torch.nn.Parameter(torch.randn(8))
    model.attn.table = torch.nn.Parameter(torch.randn(4, 6))
    model.attn.proj = torch.nn.Linear(8, 8)
    plan = {"attn.sinks": "colwise", "attn.table": "rowwise", "attn.proj": "colwise", "attn": "local_params"}
    assert _plan_parameters(model, plan, 2, set()) == {"attn.sinks": ("colwise", 0), "attn.table": ("rowwise", 1)}
    with pytest.raises(ValueError, match=r"attn\.sinks: colwise over 3 ranks splits dimension 0 of shape \(8,\)"):
        _plan_parameters(model, {"attn.sinks": "colwise"}, 3, set())
    with pytest.raises(ValueError, match=r"attn\.sinks: a bare parameter's tensor-parallel style 'packed_colwise'"):
        _plan_parameters(model, {"attn.sinks": "packed_colwise"}, 2, set())
    with pytest.raises(ValueError, match=r"attn\.table: rowwise of a parameter tied"):
        _plan_parameters(model, {"attn.table": "rowwise"}, 2, {id(model.attn.table)})
