"""The multi-process half of tests/distributed/test_distributed.py.

``prepare(dir)`` (the test process) builds every model once: quantizes it, runs it unsharded (the logits the
sharded model must give) and, for the activation-quantized formats, runs its float64 twin on dequantized weights and
unquantized activations (the reference both errors are measured against); it pickles each model into ``dir``.
``run(dir)`` then starts one gloo job of 4 CPU processes (``worker``): each rank loads every model, shards it with
mixgemm.distributed, runs it, first over ranks {0, 1} (TP 2), then over all 4 (TP 4), and saves its logits and checks
to ``dir/rank<r>.pt``. Spawning once for both world sizes and quantizing once keeps the job short on 2 CPU cores.

Models (float32, random weights):
* tiny Llama: hidden 512, intermediate 1024, 8 / 4 heads, 1 layer, vocab 256: every K per rank at TP 4 holds whole
  groups of 128 (512 / 4 = 128), every N per rank is a multiple of 16 rows (k_proj: 256 / 4 = 64);
* Llama-3-70B-shaped layer stack scaled down by 8: hidden 8192 / 8 = 1024, intermediate 28672 / 8 = 3584, the same
  64 / 8 heads (of dim 128 / 8 = 16), 1 layer: the same head counts and ratios and the same group structure (group
  128, K per rank a whole number of groups at TP 2 and 4: 3584 / 4 = 7 groups; 8 is the largest factor that keeps
  that).
"""

from __future__ import annotations

import copy
import datetime
import os
import socket

import torch
import torch.distributed as dist

TINY = dict(hidden_size=512, intermediate_size=1024, num_attention_heads=8, num_key_value_heads=4,
            num_hidden_layers=1)
L70B_8 = dict(hidden_size=1024, intermediate_size=3584, num_attention_heads=64, num_key_value_heads=8,
              num_hidden_layers=1)
WORLDS = (2, 4)


def precisions():
    """name -> config, every precision and mode (tiny Llama)."""
    from mixgemm import W4A8, W4A16, W8A8, W8A16

    return {
        "W4A16 g32 sym": W4A16(group_size=32),
        "W4A16 g32 zero_point": W4A16(group_size=32, mode="zero_point"),
        "W4A16 g128 sym": W4A16(group_size=128),
        "W4A16 g128 zero_point": W4A16(group_size=128, mode="zero_point"),
        "W4A16 g128 offset bf16-scales": W4A16(group_size=128, mode="offset", scale_dtype=torch.bfloat16),
        "W4A16 per-channel sym": W4A16(group_size=-1),
        "W8A16 per-channel sym": W8A16(),
        "W8A16 g64 offset": W8A16(group_size=64, mode="offset"),
        "W8A8 per-channel sym": W8A8(),
        "W8A8 g128 zero_point act-asym": W8A8(group_size=128, mode="zero_point", act_mode="asym"),
        "W4A8 g128 sym": W4A8(group_size=128),
        "W4A8 g128 token int-scales": W4A8(group_size=128, act_block="token"),
        "W4A8 g128 zero_point token act-asym": W4A8(group_size=128, mode="zero_point", act_block="token",
                                                    act_mode="asym"),
        "W4A8 g32 offset": W4A8(group_size=32, mode="offset"),
    }


def ids(vocab: int = 256) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 6), generator=torch.Generator().manual_seed(1))


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(ids()).logits.float()


def _model(shape, bias: bool = False, seed: int = 0):
    from mixgemm.integrations.hf import llama_config, random_llama

    model = random_llama(llama_config(**shape, attention_bias=bias, mlp_bias=bias), seed=seed)
    if bias:  # transformers initializes biases to zero: give them values, or adding them once is not tested
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, torch.nn.Linear) and m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
    return model


def prepare(directory: str) -> dict:
    """Build, quantize and pickle every case's model into ``directory``; return {case: {"ref": unsharded logits,
    "ref64": float64 reference logits or None, "kind": ..., "config": ...}}."""
    import mixgemm
    from mixgemm.integrations.hf import dequantized_copy

    cases = {}

    def add(name, model, kind="quantized", config=None, reference=None):
        reference = model if reference is None else reference
        ref = logits(reference)
        ref64 = None
        if config is not None and config.activation_quantized:
            with torch.no_grad():
                ref64 = dequantized_copy(reference, torch.float64).to(torch.float64)(ids()).logits
        torch.save(model, os.path.join(directory, f"{len(cases)}.pt"))
        cases[name] = {"file": f"{len(cases)}.pt", "ref": ref, "ref64": ref64, "kind": kind, "config": config}

    tiny = _model(TINY)
    for name, cfg in precisions().items():
        model = copy.deepcopy(tiny)
        mixgemm.quantize_(model, cfg)
        add(f"tiny {name}", model, config=cfg)
    big = _model(L70B_8)
    cfg = mixgemm.W4A16(group_size=128)  # the format of the GPU check (tools/checks/tp_gpu.py)
    mixgemm.quantize_(big, cfg)
    add("70b/8 W4A16 g128 sym", big, config=cfg)
    model = _model(TINY, bias=True)
    cfg = mixgemm.W4A16(group_size=128, mode="zero_point")
    mixgemm.quantize_(model, cfg)
    add("bias W4A16 g128 zero_point", model, config=cfg)
    model = copy.deepcopy(tiny)  # a mixed plan: lm_head stays a float nn.Linear (torch's own style shards it)
    mixgemm.quantize_(model, mixgemm.W4A16(group_size=64), filter_fn=lambda m, n: n != "lm_head")
    add("mixed plan", model)
    for name, cfg in (("W4A16 g128 zero_point", mixgemm.W4A16(group_size=128, mode="zero_point")),
                      ("W4A8 g128 token int-scales", mixgemm.W4A8(group_size=128, act_block="token"))):
        quantized = copy.deepcopy(tiny)  # the model quantize_ gives before sharding: what sharding must reproduce
        mixgemm.quantize_(quantized, cfg)
        add(f"quantize after {name}", tiny, kind="after", config=cfg, reference=quantized)
    model = copy.deepcopy(tiny)
    cfg = mixgemm.W4A16(group_size=256)  # K per rank at TP 4: 512 / 4 = 128 < 256: re-grouped into groups of 128
    mixgemm.quantize_(model, cfg)
    add("regroup W4A16 g256", model, config=cfg)
    model = copy.deepcopy(tiny)
    # the same split of an activation-quantized layer, whose groups are its activation blocks: refused
    mixgemm.quantize_(model, mixgemm.W4A8(group_size=256))
    add("error group", model, kind="error")
    for arch, cfg in (("qwen3_moe", mixgemm.W4A16(group_size=32, mode="zero_point")),
                      ("mixtral", mixgemm.W4A16(group_size=32)), ("qwen3", mixgemm.W8A16()),
                      ("deepseek_v2", mixgemm.W4A16(group_size=32)),
                      *((arch, mixgemm.W4A16(group_size=32)) for arch in ATTENTION_PARAM_ARCHS
                        if arch not in FLOAT64_ARCHS)):
        model = hf_model(arch)
        mixgemm.quantize_(model, cfg)
        add(f"{arch} {cfg.name}", model, kind="other", config=cfg)
        if arch in ("qwen3_moe", "mixtral"):
            add(f"ep {arch} {cfg.name}", model, kind="ep", config=cfg)
    for arch in FLOAT64_ARCHS:
        add(f"{arch} float64", hf_model(arch).double(), kind="other")
    return cases


# MoE, Qwen3, DeepSeek-V2 and Granite-SWA plans (packed_colwise / rowwise experts, moe_tp_experts, replicated q / k
# norms and MLA kv_a_proj, attention sinks): 1 layer, 8 / 4 heads of 16 (MLA: 8 / 8), every expert's intermediate
# features (256; DeepSeek-V2's 128) a whole number of groups of 32 per rank at TP 4
HF_SHAPES = {
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=256),
    "qwen3": dict(intermediate_size=256),
    # MLA (kv_a_proj_with_mqa replicated, kv_b_proj / q_b_proj column-parallel), shared experts, one MoE layer
    "deepseek_v2": dict(intermediate_size=256, moe_intermediate_size=128, n_routed_experts=8, num_experts_per_tok=2,
                        n_shared_experts=1, first_k_dense_replace=0, kv_lora_rank=64, q_lora_rank=96,
                        qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, topk_method="greedy",
                        num_key_value_heads=8, head_dim=16),  # (MLA: a key / value per head)
    # attention sinks (Beam: an output gate's bias): a bare per-head parameter the plan splits ("colwise") under a
    # "local_params" attention module; GraniteMoE-SWA, MiMo-V2-Flash and Beam with their experts too
    "granite_swa": dict(intermediate_size=256),
    "granitemoe_swa": dict(intermediate_size=256, num_local_experts=4, num_experts_per_tok=2),
    "mimo_v2_flash": dict(intermediate_size=256, layer_types=["sliding_attention"], mlp_layer_types=["sparse"],
                          n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=128, v_head_dim=16),
    "beam": dict(intermediate_size=256),
    "hy_v4": dict(intermediate_size=256, pad_token_id=0),
}
# the architectures whose attention holds such a parameter: {arch: its name}
ATTENTION_PARAM_ARCHS = {"granite_swa": "sinks", "granitemoe_swa": "sinks", "mimo_v2_flash": "sinks",
                         "beam": "gate_bias", "hy_v4": "sinks"}
# checked in float64, not quantized: Hunyuan-V4's quantized fp32 logits at TP 2 / 4 differ from the unsharded model's by
# up to 2e-5 relative (its MLA, indexer and experts amplify rounding; the others' 3-4e-7), over the bound of an exact
# split, while in float64 the split is exact (6e-17), so that is where an error in it would show
FLOAT64_ARCHS = ("hy_v4",)


def hf_model(arch: str):
    import warnings

    from transformers import AutoConfig, AutoModelForCausalLM

    shapes = dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=4, head_dim=16, num_hidden_layers=1,
                  vocab_size=256) | HF_SHAPES[arch]
    cfg = AutoConfig.for_model(arch, **shapes)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(cfg).eval()
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            p.data.normal_(0, 0.05)
        elif name.endswith("sinks"):  # (zeros at init: a split that went wrong would not show)
            p.data.normal_(0, 1)
    return model


def _int_scale_routes(model) -> list[bool]:
    """For each per-token sym int4 QuantLinear with more than one group on this rank: does its shard still factor
    into integer group scales (the route W4A8 act_block="token" takes on the GPU)?"""
    from mixgemm.formats.int_scales import int_group_scales
    from mixgemm.nn import QuantLinear

    out = []
    for m in model.modules():
        if isinstance(m, QuantLinear) and m.act_block == "token" and m.bits == 4 and m.mode == "sym":
            qw = m.quantized_weight()
            if qw.num_groups > 1:
                out.append(int_group_scales(qw) is not None)
    return out


def _model_cases(mesh, directory: str, cases: dict, res: dict) -> None:
    import mixgemm
    from mixgemm.distributed import model_ep_plan, tensor_parallel_
    from mixgemm.nn import QuantLinear

    for name, case in cases.items():
        if case["kind"] == "error":
            continue
        model = torch.load(os.path.join(directory, case["file"]), weights_only=False)
        if case["kind"] == "ep":  # (expert parallelism: the model's EP plan; one token too: the decoding path)
            with torch.no_grad():
                one = model(ids()[:1, :1]).logits.float()
            report = tensor_parallel_(model, mesh, model_ep_plan(model))
            experts = model.model.layers[0].mlp.experts
            with torch.no_grad():
                one_ep = model(ids()[:1, :1]).logits.float()
            res[name] = {"logits": logits(model), "sharded": report.sharded, "local_experts": len(experts.down_proj),
                         "num_experts": experts.num_experts, "one_token": (one_ep, one)}
            continue
        report = tensor_parallel_(model, mesh)
        if case["kind"] == "other":  # (other architectures: the logits and what was sharded)
            res[name] = {"logits": logits(model), "sharded": report.sharded, "skipped": report.skipped}
            param = ATTENTION_PARAM_ARCHS.get(name.split(" ")[0])
            if param is not None:
                res[name]["attention_param"] = getattr(model.model.layers[0].self_attn, param).numel()
            continue
        if case["kind"] == "after":
            mixgemm.quantize_(model, case["config"])
        r = {"logits": logits(model), "sharded": sorted(report.sharded),
             "n_quant": sum(isinstance(m, QuantLinear) for m in model.modules()),
             "lm_head": type(model.lm_head).__name__, "int_scale_routes": _int_scale_routes(model)}
        layer = model.model.layers[0]
        r["o_proj_bias"] = None if layer.self_attn.o_proj.bias is None else layer.self_attn.o_proj.bias.clone()
        down = layer.mlp.down_proj
        if isinstance(down, QuantLinear):  # a shard's state dict is an ordinary QuantLinear's, of its own shape
            fresh = QuantLinear(down.in_features, down.out_features, bias=down.bias is not None, bits=down.bits,
                                group_size=down.group_size, mode=down.mode, scale_dtype=down.scales.dtype,
                                act_mode=down.act_mode, act_block=down.act_block)
            fresh.load_state_dict(down.state_dict())
            x = torch.randn(3, down.in_features, generator=torch.Generator().manual_seed(2))
            r["extra_state"] = down.state_dict()["_extra_state"].tolist()
            # QuantLinear.forward: this rank's part only (the shard's own forward adds the sum over the ranks)
            r["reload_equal"] = bool(torch.equal(fresh(x), QuantLinear.forward(down, x)))
            r["down_class"] = type(down).__name__
        res[name] = r


def _linear(k, n, g, bias=False):
    lin = torch.nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g) * 0.05)
        if bias:
            lin.bias.copy_(torch.randn(n, generator=g))
    return lin


def style_plans():
    from torch.distributed.tensor import Replicate, Shard

    from mixgemm.distributed import ColwiseParallel, RowwiseParallel

    return {
        "colwise + rowwise to a Shard(-1) DTensor": {
            "0": ColwiseParallel(), "2": RowwiseParallel(output_layouts=Shard(-1), use_local_output=False)},
        "colwise gathered + rowwise splitting its input": {
            "0": ColwiseParallel(output_layouts=Replicate()), "2": RowwiseParallel(input_layouts=Replicate())},
        "DTensor input + Replicate DTensor output": {
            "0": ColwiseParallel(), "2": RowwiseParallel(use_local_output=False)},
    }


def style_mlp():
    """QuantLinear 256 -> 512 (g64 zero_point), GELU, QuantLinear 512 -> 256 (g64 sym, with a bias)."""
    from mixgemm.nn import QuantLinear

    g = torch.Generator().manual_seed(3)
    up = QuantLinear.from_linear(_linear(256, 512, g), group_size=64, mode="zero_point")
    down = QuantLinear.from_linear(_linear(512, 256, g, bias=True), group_size=64)
    return torch.nn.Sequential(up, torch.nn.GELU(), down), torch.randn(5, 256, generator=g)


def _style_cases(mesh, res: dict) -> None:
    """mixgemm's styles through torch's parallelize_module with non-default layouts."""
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import parallelize_module

    for name, plan in style_plans().items():
        model, x = style_mlp()
        parallelize_module(model, mesh, plan)
        with torch.no_grad():
            out = model(DTensor.from_local(x, mesh, [Replicate()]) if name.startswith("DTensor") else x)
        r = {"is_dtensor": isinstance(out, DTensor)}
        if isinstance(out, DTensor):
            r["placements"] = [str(p) for p in out.placements]
            out = out.full_tensor()
        r["out"] = out
        res[f"style {name}"] = r


def _error_cases(mesh, directory: str, cases: dict, res: dict) -> None:
    """Bad plans and splits raise on every rank alike, before any communication."""
    from mixgemm.distributed import tensor_parallel_

    world = mesh.size()
    group_model = torch.load(os.path.join(directory, cases["error group"]["file"]), weights_only=False)
    heads = 2 * world + 2
    tries = {
        "heads": lambda: tensor_parallel_(_model({**TINY, "num_attention_heads": heads, "num_key_value_heads": heads,
                                                  "hidden_size": 16 * heads}), mesh),
        "style": lambda: tensor_parallel_(group_model, mesh, {"model.layers.*.self_attn.q_proj": "sequence_parallel"}),
        "group": lambda: tensor_parallel_(group_model, mesh),
    }
    for name, fn in tries.items():
        try:
            fn()
            res[f"error {name}"] = None
        except ValueError as e:
            res[f"error {name}"] = str(e)


def worker(rank: int, world: int, directory: str, results: dict, cases: dict) -> None:
    from torch.distributed.device_mesh import DeviceMesh

    pair = dist.new_group([0, 1])
    for size in WORLDS:
        if rank < size:
            mesh = DeviceMesh.from_group(pair if size == 2 else dist.group.WORLD, "cpu")
            res = results.setdefault(size, {})
            _model_cases(mesh, directory, cases, res)
            _style_cases(mesh, res)
            if size == world:
                _error_cases(mesh, directory, cases, res)
        dist.barrier()


def _rank_main(rank: int, world: int, port: int, directory: str, body, args: tuple) -> None:
    """One process of a gloo job: ``body(rank, world, directory, results, *args)`` fills ``results``, saved to
    ``directory/rank<r>.pt`` even when it raises."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(minutes=5))
    results: dict = {}
    try:
        body(rank, world, directory, results, *args)
    finally:
        torch.save(results, os.path.join(directory, f"rank{rank}.pt"))
        dist.destroy_process_group()


def spawn_gloo(body, world: int, directory: str, *args) -> list[dict]:
    """Run ``body`` (a module-level function, _rank_main) in a gloo job of ``world`` CPU processes; [rank r's
    results]."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank_main, args=(world, port, directory, body, args), nprocs=world)
    return [torch.load(os.path.join(directory, f"rank{r}.pt"), weights_only=False) for r in range(world)]


def run(directory: str) -> tuple[dict, list[dict]]:
    """prepare + the 4-process job: (cases, [results of rank r: {world size: {case: ...}}])."""
    cases = prepare(directory)
    light = {k: {"file": v["file"], "kind": v["kind"], "config": v["config"]} for k, v in cases.items()}
    return cases, spawn_gloo(worker, max(WORLDS), directory, light)
