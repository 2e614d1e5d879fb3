"""Fresh layer shapes for `mixgemm bench --random N --seed S`: drawn models, then one layer of each.

A shape is drawn the way a new model would bring it: first the model (hidden size, head width, query and GQA
key/value heads, MLP width, sometimes mixture-of-experts), then one of its linear layers as `models.linear_layers`
derives them (fused QKV, o_proj, fused gate+up, down_proj, and less often the unfused q / k / v / gate / up and the
experts'). Layers are nn.Linear(K=in_features, N=out_features). Every K and N is a multiple of 64 in [512, 32768]:
the layer is drawn among those of its model that are (never clamped, which would make shapes no model has), and a
model with none, or only shapes drawn already, gives way to another. The same seed gives the same list; the N
shapes are distinct.

The model distribution (the published configs of Llama, Mistral, Qwen, Gemma, Phi, DeepSeek and Mixtral span it):

* hidden size h: log-uniform, 70% over 2048..12288 (the 1B-70B models), 30% over 512..16384;
* head_dim 128 (70%), 64 (20%) or 256 (10%, from h = 2048); key/value heads 1, 2, 4, 8 or 16 (8 the most common);
* query heads a multiple of the key/value heads: h / head_dim of them, h rounded to whole groups (80%), or a query
  width 0.5-2x h (Gemma, Qwen3; h then a multiple of 64 below 1024, 128 below 4096, 256 above); one model in five
  is multi-head (as many key/value heads as query heads);
* MLP width 2.6-5.4x h rounded to a multiple of 64-512; 20% of the models are mixtures of experts: 70% of them with
  routed experts 0.25-1x h wide (DeepSeek, Qwen-MoE) and a shared expert 0-4x that, 30% Mixtral's 8 or 16 experts
  3-4x h wide.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass

from mixgemm.bench.models import Layer, ModelConfig, group_by_shape, linear_layers

ALIGN = 64
MIN_DIM, MAX_DIM = 512, 32768
MAX_SEED = 2**32 - 1
# how often each layer of a drawn model is the one kept: the fused projections serving engines run, and the
# square / wide / tall layers of every block, more often than the unfused ones
LAYER_WEIGHTS = {"qkv (fused)": 4, "o_proj": 3, "gate_up (fused)": 4, "down_proj": 4, "q_proj": 1, "k_proj": 1,
                 "v_proj": 1, "gate_proj": 1, "up_proj": 1}
ATTEMPTS_PER_SHAPE = 1000  # draws allowed per shape before giving up (distinct in-bounds shapes run out)


@dataclass(frozen=True)
class Draw:
    """The result of a draw: the seed, the layers (distinct K x N) and the drawn model of each layer (same order)."""

    seed: int
    layers: list[Layer]
    models: list[ModelConfig]

    def by_shape(self) -> dict[tuple[int, int], list[Layer]]:
        return group_by_shape(self.layers)


def new_seed() -> int:
    """A seed for a run that names none: fresh at each call, from the OS."""
    return int.from_bytes(os.urandom(4), "little")


def check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be an integer in [0, {MAX_SEED}], got {seed!r}")
    return seed


def _round(v: float, step: int) -> int:
    return max(step, int(round(v / step)) * step)


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def draw_model(rng: random.Random, index: int) -> ModelConfig:
    """One model's architecture numbers (the module docstring gives the distribution)."""
    h = _log_uniform(rng, 2048, 12288) if rng.random() < 0.7 else _log_uniform(rng, MIN_DIM, 16384)
    head_dim = rng.choices((128, 64, 256), weights=(7, 2, 1 if h >= 2048 else 0))[0]
    kv = rng.choices((1, 2, 4, 8, 16), weights=(1, 2, 3, 6, 1))[0]
    if rng.random() < 0.8:  # query width = h: h is a whole number of heads, the heads a whole number of groups
        heads = kv * max(1, round(h / (head_dim * kv)))
        h = heads * head_dim
    else:  # query width 0.5-2x h (Gemma, Qwen3)
        h = _round(h, 64 if h < 1024 else 128 if h < 4096 else 256)
        heads = kv * max(1, round(h * rng.choice((0.5, 0.75, 1.25, 1.5, 2.0)) / (head_dim * kv)))
    if rng.random() < 0.2:  # multi-head attention: as many key/value heads as query heads
        kv = heads
    inter = _round(h * rng.uniform(2.6, 5.4), rng.choice((64, 128, 256, 256, 512)))
    experts = expert_inter = shared = 0
    if rng.random() < 0.2:
        if rng.random() < 0.3:  # Mixtral's layout: experts as wide as a dense MLP
            experts = rng.choice((8, 16))
            inter = _round(h * rng.uniform(3.0, 4.0), 256)
        else:  # routed experts of a narrow width (DeepSeek, Qwen-MoE), sometimes a shared expert beside them
            expert_inter = _round(h * rng.uniform(0.25, 1.0), rng.choice((64, 128)))
            shared = expert_inter * rng.choice((0, 1, 2, 4))
    name = f"draw{index:02d}-h{h}-q{heads}x{head_dim}-kv{kv}-" + (
        f"e{expert_inter}" if expert_inter else f"i{inter}" + (f"x{experts}e" if experts else ""))
    return ModelConfig(name=name, hidden_size=h, intermediate_size=inter, num_attention_heads=heads,
                       num_key_value_heads=kv, head_dim=head_dim, model_type="drawn", num_experts=experts,
                       source="mixgemm.bench.draw", expert_intermediate=expert_inter, shared_intermediate=shared,
                       dense_mlp=not expert_inter)


def in_bounds(k: int, n: int) -> bool:
    return all(d % ALIGN == 0 and MIN_DIM <= d <= MAX_DIM for d in (k, n))


def _kind(layer: Layer) -> str:
    """The layer's role without its expert prefix ('experts.gate_up (fused)' -> 'gate_up (fused)'); Mixtral's
    expert names map onto the dense ones."""
    name = layer.name.split(".", 1)[-1]
    return {"w1 (gate)": "gate_proj", "w3 (up)": "up_proj", "w1+w3 (fused gate+up)": "gate_up (fused)",
            "w2 (down)": "down_proj"}.get(name, name)


def draw_layers(count: int, seed: int) -> Draw:
    """count distinct layer shapes, each the drawn layer of a freshly drawn model; the same for the same seed."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive integer, got {count!r}")
    rng = random.Random(check_seed(seed))
    layers: list[Layer] = []
    drawn: list[ModelConfig] = []
    seen: set[tuple[int, int]] = set()
    for _ in range(count * ATTEMPTS_PER_SHAPE):
        if len(layers) == count:
            break
        model = draw_model(rng, len(layers))
        candidates = [lay for lay in linear_layers(model) if in_bounds(lay.k, lay.n) and lay.shape not in seen]
        if not candidates:
            continue
        layer = rng.choices(candidates, weights=[LAYER_WEIGHTS.get(_kind(lay), 1) for lay in candidates])[0]
        layers.append(layer)
        drawn.append(model)
        seen.add(layer.shape)
    if len(layers) < count:
        raise ValueError(f"drew only {len(layers)} distinct layer shapes of {count} asked for")
    return Draw(seed=seed, layers=layers, models=drawn)
