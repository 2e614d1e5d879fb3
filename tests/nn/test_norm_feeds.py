"""mixgemm.nn.norms: act-order layers that share a norm's output take it gathered once by the
norm. On transformers' own decoder layers (several architectures) the fold finds exactly the layers reading a
norm's output and leaves the logits bit-equal; anything the analysis cannot prove (another use of the tensor,
different permutations, a layer called elsewhere or shared) is left alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mixgemm
from mixgemm.distributed.shard import COLWISE, ROWWISE, shard_quant_linear
from mixgemm.formats.weight import QuantConfig, quantize_weight
from mixgemm.nn.linear import QuantLinear
from mixgemm.nn.norms import PERM_BUFFER, gather_act_order_at_norms

# Layers that read the same tensor (GPTQ gives them one act-order permutation)
SHARED_INPUT = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "gate_proj": "mlp", "up_proj": "mlp"}
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, head_dim=16, pad_token_id=0, bos_token_id=1, eos_token_id=2)
ARCHES = {
    "llama": ("self_attn.k_proj", "self_attn.q_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"),
    "mistral": ("self_attn.k_proj", "self_attn.q_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"),
    "qwen2": ("self_attn.k_proj", "self_attn.q_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"),
    "qwen3": ("self_attn.k_proj", "self_attn.q_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"),
    "gemma2": ("self_attn.k_proj", "self_attn.q_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"),
    "phi3": ("self_attn.qkv_proj", "mlp.gate_up_proj"),
}


def tiny_model(arch: str) -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **TINY), dtype=torch.float32).eval()
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=32, mode="zero_point"),
                               filter_fn=lambda mod, name: not name.endswith("lm_head"))
    assert report.replaced and not report.skipped
    return model


def with_act_order(model: nn.Module, seed: int = 1, shared: bool = True) -> nn.Module:
    """Every QuantLinear gets an input permutation (the same stored weight); with ``shared`` the layers reading one
    tensor get the same one, as GPTQ gives them."""
    gen = torch.Generator().manual_seed(seed)
    perms = {}
    for name, layer in list(model.named_modules()):
        if not isinstance(layer, QuantLinear):
            continue
        parent, _, child = name.rpartition(".")
        key = (parent.rpartition(".")[0], SHARED_INPUT[child]) if shared and child in SHARED_INPUT else name
        perm = perms.setdefault(key, torch.randperm(layer.in_features, generator=gen))
        bias = None if layer.bias is None else layer.bias.detach()
        setattr(model.get_submodule(parent), child,
                QuantLinear.from_quantized(layer.quantized_weight(), bias, input_perm=perm.clone()))
    return model


def logits(model) -> torch.Tensor:
    ids = torch.randint(0, TINY["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_fold_on_transformers_decoder_layers(arch):
    model = with_act_order(tiny_model(arch))
    keys = set(model.state_dict())
    want = logits(model)
    changed = gather_act_order_at_norms(model)
    assert changed == [f"model.layers.{i}.{name}" for i in range(TINY["num_hidden_layers"]) for name in ARCHES[arch]]
    for name in changed:
        layer = model.get_submodule(name)
        assert layer.act_order and layer.input_gathered_by is not None
        norm = model.get_submodule(layer.input_gathered_by)
        assert torch.equal(norm._buffers[PERM_BUFFER], layer.input_perm)
    assert torch.equal(logits(model), want)  # the same numbers, gathered once by the norm
    assert set(model.state_dict()) == keys  # the permutation stays in each layer's state; nothing new is saved
    assert gather_act_order_at_norms(model) == []  # a second pass finds nothing left to do
    assert torch.equal(logits(model), want)


@pytest.mark.parametrize("arch,norm_op", [("llama", "rms_norm"), ("gemma2", "gather_columns")])
def test_under_torch_compile_the_norms_gather_and_the_layers_do_not(arch, norm_op):
    """Eager: the hook does nothing and every layer gathers x itself (no host work per norm on a host-bound loop).
    Traced by torch.compile: each norm's output comes from one gathering op and the layers it feeds take it as it
    comes; the logits are the same numbers either way. A norm computing transformers' RMSNorm (llama) is computed
    gathered by mixgemm's norm op; another formula (gemma2's 1 + weight) keeps its own output, gathered after."""
    model = with_act_order(tiny_model(arch))
    want = logits(model)
    changed = gather_act_order_at_norms(model)
    layer = model.get_submodule(changed[0])
    assert layer.gathers_input()  # eager
    graphs, others, with_perm = [], [], []
    op = getattr(torch.ops.mixgemm, norm_op)
    other = torch.ops.mixgemm.gather_columns if norm_op == "rms_norm" else torch.ops.mixgemm.rms_norm

    def count_gathers(gm, example_inputs):
        lin = torch.ops.mixgemm.linear_wxa16
        linears = (lin, lin.default, lin.no_grad)
        calls = [n for n in gm.graph.nodes if n.op == "call_function"]
        graphs.append(sum(1 for n in calls if n.target in (op, op.default)))
        others.append(sum(1 for n in calls if n.target in (other, other.default)))
        with_perm.append(sum(1 for n in calls if n.target in linears and n.args[-1] is not None))
        return gm

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=count_gathers, fullgraph=True)
    got = logits(compiled)
    if norm_op == "gather_columns":
        assert torch.equal(got, want)
    else:  # the same formula, its mean summed in another order
        assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    # two norms per decoder layer feed act-order layers; the other layers (o, down) gather in their own op call
    assert sum(graphs) == 2 * TINY["num_hidden_layers"] and sum(others) == 0, (graphs, others)
    assert sum(with_perm) == 2 * TINY["num_hidden_layers"], with_perm  # o and down: the only layers gathering
    torch._dynamo.reset()


def test_layers_with_different_permutations_keep_their_gather():
    model = with_act_order(tiny_model("llama"), shared=False)
    want = logits(model)
    assert gather_act_order_at_norms(model) == []
    assert not any(m.input_gathered_by for m in model.modules() if isinstance(m, QuantLinear))
    assert torch.equal(logits(model), want)


def _ql(k, n, gen, perm=None):
    qw = quantize_weight(torch.randn(n, k, generator=gen), QuantConfig(bits=4, group_size=32, mode="sym"))
    return QuantLinear.from_quantized(qw, input_perm=perm)


class Block(nn.Module):
    def __init__(self, k, gen, perm):
        super().__init__()
        self.a_proj, self.b_proj = _ql(k, 32, gen, perm.clone()), _ql(k, 32, gen, perm.clone())

    def forward(self, x):
        return self.a_proj(x) + self.b_proj(x)


class LeakyBlock(Block):
    def forward(self, x):
        return self.a_proj(x) + self.b_proj(x) + x.sum(-1, keepdim=True)  # x used beyond the two layers


class TwiceBlock(Block):
    def forward(self, x):
        return self.a_proj(x) + self.b_proj(x) + self.a_proj(torch.flip(x, (-1,)))  # a_proj sees another input


class Layer(nn.Module):
    def __init__(self, block, k):
        super().__init__()
        self.norm = nn.LayerNorm(k)
        self.block = block

    def forward(self, x):
        h = self.norm(x)
        return self.block(h)


class ResidualLayer(Layer):
    def forward(self, x):
        h = self.norm(x)
        return self.block(h) + h.sum(-1, keepdim=True)  # the norm's output is used twice


class NormTwiceLayer(Layer):
    def forward(self, x):
        h = self.norm(x)
        return self.block(h) + self.norm(x * 2.0).sum(-1, keepdim=True)  # the norm also runs on another input


@pytest.mark.parametrize("layer_cls, block_cls, folds", [
    (Layer, Block, True), (ResidualLayer, Block, False), (NormTwiceLayer, Block, False), (Layer, LeakyBlock, False),
    (Layer, TwiceBlock, False)])
def test_the_analysis_declines_what_it_cannot_prove(layer_cls, block_cls, folds):
    gen = torch.Generator().manual_seed(2)
    k = 64
    perm = torch.randperm(k, generator=gen)
    model = layer_cls(block_cls(k, gen, perm), k)
    with torch.no_grad():
        model.norm.weight.normal_(generator=gen)
    x = torch.randn(3, k, generator=gen)
    before_x = x.clone()
    want = model(x)
    changed = gather_act_order_at_norms(model)
    assert changed == (["block.a_proj", "block.b_proj"] if folds else [])
    torch.testing.assert_close(model(x), want, rtol=1e-6, atol=1e-6)
    assert torch.equal(x, before_x)


def test_a_layer_or_norm_shared_by_two_parents_keeps_its_gather():
    gen = torch.Generator().manual_seed(3)
    k = 64
    perm = torch.randperm(k, generator=gen)
    first = Layer(Block(k, gen, perm), k)
    second = Layer(Block(k, gen, perm), k)
    second.block.a_proj = first.block.a_proj
    model = nn.Sequential(first, second)
    assert gather_act_order_at_norms(model) == []
    third, fourth = Layer(Block(k, gen, perm), k), Layer(Block(k, gen, perm), k)
    fourth.norm = third.norm  # a norm shared by two parents: its hook would reach both
    assert gather_act_order_at_norms(nn.Sequential(third, fourth)) == []


def test_tensor_parallel_shards_keep_the_gathered_input():
    gen = torch.Generator().manual_seed(4)
    k = 64
    layer = _ql(k, 32, gen, torch.randperm(k, generator=gen))
    layer.input_gathered_by = "model.norm"
    x = torch.randn(2, k, generator=gen)
    shard = shard_quant_linear(layer, COLWISE, 1, 2, "q_proj")
    assert shard.input_gathered_by == "model.norm"
    torch.testing.assert_close(shard(x), layer(x)[:, 16:], rtol=0, atol=0)
    with pytest.raises(ValueError, match="q_proj: row-parallel split .* gathered .* by model.norm"):
        shard_quant_linear(layer, ROWWISE, 0, 2, "q_proj")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gather_columns_op_equals_index_select(device, dtype):
    """The hook's op: x[..., perm] as a new contiguous tensor (decode sizes on CUDA through the PDL gather kernel,
    larger ones and the CPU through index_select), its input untouched, its gradient the scatter back."""
    gen = torch.Generator().manual_seed(5)
    for shape in ((1, 1, 4096), (2, 3, 1000), (3, 40, 576), (0, 64)):
        k = shape[-1]
        x = torch.randn(shape, generator=gen).to(dtype).to(device)
        perm = torch.randperm(k, generator=gen).to(device)
        before = x.clone()
        got = torch.ops.mixgemm.gather_columns(x, perm)
        assert got.shape == x.shape and got.is_contiguous() and (not x.numel() or got.data_ptr() != x.data_ptr())
        assert torch.equal(got, x.index_select(-1, perm)), shape
        assert torch.equal(x, before)
    x = torch.randn(2, 64, generator=gen).to(device).requires_grad_()
    perm = torch.randperm(64, generator=gen).to(device)
    g = torch.randn(2, 64, generator=gen).to(device)
    torch.ops.mixgemm.gather_columns(x, perm).backward(g)
    assert torch.equal(x.grad[:, perm], g)
    with pytest.raises(ValueError, match="input_perm must be int64"):
        torch.ops.mixgemm.gather_columns(x.detach(), perm.int())
