"""Linear-layer shapes of a transformer from its Hugging Face config.json (`mixgemm bench --model`).

The committed list (model_shapes.json, package data) holds the published config numbers of the models the
acceptance runs use; a config.json of any other decoder works the same way, and so does a transformers model type
(the defaults of its config class). A layer is nn.Linear(K=in_features,
N=out_features). Per model: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj and the fused projections
serving engines build from them ("qkv (fused)" with N = (heads + 2 kv_heads) * head_dim, "gate_up (fused)" with
N = 2 * intermediate). Architectures that store the fused projections themselves (Phi-3: qkv_proj, gate_up_proj)
list those only. Mixture-of-experts models list their expert MLP: Mixtral's layout (num_local_experts, experts of
intermediate_size: w1 = gate, w3 = up, w2 = down and the fused w1+w3), or the routed-expert layout of Qwen-MoE and
DeepSeek (num_experts / n_routed_experts with moe_intermediate_size: experts.gate_proj / up_proj / down_proj, the
shared expert of shared_expert_intermediate_size or n_shared_experts x moe_intermediate_size, and the dense MLP of
intermediate_size only where some layers keep one: first_k_dense_replace, mlp_only_layers, decoder_sparse_step).
Multi-head latent attention (kv_lora_rank, DeepSeek-V2 / V3) lists its low-rank projections: q_a_proj / q_b_proj
(or q_proj without q_lora_rank), kv_a_proj_with_mqa, kv_b_proj and o_proj.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from importlib import resources

CATALOG_FILE = "model_shapes.json"
ALL = "all"
REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads")
# routed-expert counts whose experts are moe_intermediate_size wide (Qwen-MoE, DeepSeek); without that width the
# expert shapes are unknown, and deriving them from intermediate_size would silently time the wrong shapes
ROUTED_EXPERT_FIELDS = ("num_experts", "n_routed_experts")
# model_type values whose checkpoints hold the fused projections as their own modules
FUSED_NATIVE = {"phi3"}


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention's widths (DeepSeek-V2 / V3 config fields); q_lora_rank 0: a plain q_proj."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    model_type: str = ""
    num_experts: int = 0  # Mixtral's layout: experts of intermediate_size
    source: str = ""
    expert_intermediate: int = 0  # routed experts of this width (moe_intermediate_size)
    shared_intermediate: int = 0  # their shared expert's width (0: none)
    dense_mlp: bool = True  # whether a dense MLP of intermediate_size is in some layer
    latent: LatentAttention | None = None


@dataclass(frozen=True)
class Layer:
    model: str
    name: str
    k: int  # in_features
    n: int  # out_features

    @property
    def shape(self) -> tuple[int, int]:
        return (self.k, self.n)


def _positive_int(cfg: dict, key: str, where: str) -> int:
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"{where}: {key!r} must be a positive integer, got {v!r}")
    return v


def from_hf_config(cfg: dict, name: str, where: str | None = None) -> ModelConfig:
    """A ModelConfig from the dict of a Hugging Face config.json (a multimodal config's text_config is used when
    the top level has no hidden_size). num_key_value_heads missing = multi-head attention; head_dim missing =
    hidden_size / num_attention_heads. where names the config in error messages."""
    where = where or name
    if not isinstance(cfg, dict):
        raise ValueError(f"{where}: a config is a JSON object, got {type(cfg).__name__}")
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "source": cfg.get("source", "")}
    routed = [k for k in ROUTED_EXPERT_FIELDS if cfg.get(k) is not None]
    if routed and cfg.get("num_local_experts") is None and cfg.get("moe_intermediate_size") is None:
        raise ValueError(f"{where}: mixture-of-experts config ({', '.join(routed)}) has no 'moe_intermediate_size' "
                         "(the experts' width); pass the shapes with --shapes")
    for key in REQUIRED:
        if cfg.get(key) is None:
            raise ValueError(f"{where}: config has no {key!r} (needed to derive the linear layers)")
    hidden = _positive_int(cfg, "hidden_size", where)
    inter = _positive_int(cfg, "intermediate_size", where)
    heads = _positive_int(cfg, "num_attention_heads", where)
    kv = _positive_int(cfg, "num_key_value_heads", where) if cfg.get("num_key_value_heads") is not None else heads
    if heads % kv:
        raise ValueError(f"{where}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}")
    if cfg.get("head_dim") is not None:
        head_dim = _positive_int(cfg, "head_dim", where)
    elif cfg.get("kv_lora_rank") is not None:  # latent attention: its head widths are its own fields (below)
        head_dim = 0
    elif hidden % heads:
        raise ValueError(f"{where}: config has no 'head_dim' and hidden_size={hidden} is not a multiple of "
                         f"num_attention_heads={heads}")
    else:
        head_dim = hidden // heads
    experts = _positive_int(cfg, "num_local_experts", where) if cfg.get("num_local_experts") is not None else 0
    expert_inter = shared = 0
    dense = True
    if routed and not experts:
        for key in routed:
            _positive_int(cfg, key, where)
        expert_inter = _positive_int(cfg, "moe_intermediate_size", where)
        if cfg.get("shared_expert_intermediate_size"):  # Qwen2-MoE: one shared expert of its own width
            shared = _positive_int(cfg, "shared_expert_intermediate_size", where)
        elif cfg.get("n_shared_experts"):  # DeepSeek: n shared experts, run as one MLP n times as wide
            shared = _positive_int(cfg, "n_shared_experts", where) * expert_inter
        dense = bool(cfg.get("first_k_dense_replace") or cfg.get("mlp_only_layers")
                     or (cfg.get("decoder_sparse_step") or 1) > 1)
    latent = None
    if cfg.get("kv_lora_rank") is not None:
        keys = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        for key in keys:
            if cfg.get(key) is None:
                raise ValueError(f"{where}: latent-attention config (kv_lora_rank) has no {key!r}")
        widths = {key: _positive_int(cfg, key, where) for key in keys}
        q_rank = _positive_int(cfg, "q_lora_rank", where) if cfg.get("q_lora_rank") is not None else 0
        latent = LatentAttention(q_lora_rank=q_rank, **widths)
    return ModelConfig(name=name, hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
                       num_key_value_heads=kv, head_dim=head_dim, model_type=str(cfg.get("model_type") or ""),
                       num_experts=experts, source=str(cfg.get("source") or ""), expert_intermediate=expert_inter,
                       shared_intermediate=shared, dense_mlp=dense, latent=latent)


def _latent_layers(cfg: ModelConfig) -> list[tuple[str, int, int]]:
    """(name, K, N) of multi-head latent attention's projections."""
    a, h, heads = cfg.latent, cfg.hidden_size, cfg.num_attention_heads
    q_width = heads * (a.qk_nope_head_dim + a.qk_rope_head_dim)
    q = ([("q_a_proj", h, a.q_lora_rank), ("q_b_proj", a.q_lora_rank, q_width)] if a.q_lora_rank
         else [("q_proj", h, q_width)])
    return q + [("kv_a_proj_with_mqa", h, a.kv_lora_rank + a.qk_rope_head_dim),
                ("kv_b_proj", a.kv_lora_rank, heads * (a.qk_nope_head_dim + a.v_head_dim)),
                ("o_proj", heads * a.v_head_dim, h)]


GATED_MLP = ("gate_proj", "up_proj", "gate_up (fused)", "down_proj")
MIXTRAL_EXPERTS = ("w1 (gate)", "w3 (up)", "w1+w3 (fused gate+up)", "w2 (down)")


def _mlp_layers(prefix: str, h: int, i: int, names: tuple[str, ...] = GATED_MLP) -> list[tuple[str, int, int]]:
    """(name, K, N) of a gated MLP of width i: gate, up, their fused projection, down."""
    gate, up, fused, down = (prefix + nm for nm in names)
    return [(gate, h, i), (up, h, i), (fused, h, 2 * i), (down, i, h)]


def linear_layers(cfg: ModelConfig) -> list[Layer]:
    """The distinct linear layers of one decoder block (the LM head and embeddings are not benchmarked: they are
    usually left unquantized)."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    fused_native = cfg.model_type in FUSED_NATIVE
    if cfg.latent is not None:
        attn = _latent_layers(cfg)
    elif fused_native:
        attn = [("qkv_proj", h, q + 2 * kv), ("o_proj", q, h)]
    else:
        attn = [("q_proj", h, q), ("k_proj", h, kv), ("v_proj", h, kv), ("qkv (fused)", h, q + 2 * kv),
                ("o_proj", q, h)]
    if fused_native:
        mlp = [("gate_up_proj", h, 2 * i), ("down_proj", i, h)]
    elif cfg.num_experts:  # Mixtral's experts, intermediate_size wide
        mlp = _mlp_layers("experts.", h, i, MIXTRAL_EXPERTS)
    elif cfg.expert_intermediate:  # routed experts (Qwen-MoE, DeepSeek): theirs, the shared one's, a dense MLP's
        mlp = _mlp_layers("experts.", h, cfg.expert_intermediate)
        if cfg.shared_intermediate:
            mlp += _mlp_layers("shared_expert.", h, cfg.shared_intermediate)
        if cfg.dense_mlp:
            mlp += _mlp_layers("", h, i)
    else:
        mlp = _mlp_layers("", h, i)
    return [Layer(cfg.name, nm, k, n) for nm, k, n in attn + mlp]


def catalog() -> dict[str, ModelConfig]:
    """The committed list (model_shapes.json), by name."""
    text = resources.files("mixgemm.bench").joinpath(CATALOG_FILE).read_text()
    models = json.loads(text)["models"]
    return {name: from_hf_config(cfg, name, f"{CATALOG_FILE} {name}") for name, cfg in models.items()}


def _config_name(path: str, cfg: dict) -> str:
    """A short name for a config file: its _name_or_path, else its folder's name."""
    tag = cfg.get("_name_or_path") if isinstance(cfg, dict) else None
    if tag:
        return os.path.basename(str(tag).rstrip("/")) or str(tag)
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return folder or os.path.basename(path)


def load_config_file(path: str) -> ModelConfig:
    """A config.json (or a folder holding one)."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except OSError as e:
        raise ValueError(f"--model {path}: cannot read it ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--model {path}: not valid JSON ({e})") from None
    return from_hf_config(cfg, _config_name(path, cfg), path)


MODEL_TYPES_HINT = "python -c 'from transformers import CONFIG_MAPPING; print(*CONFIG_MAPPING.keys())'"


def from_model_type(model_type: str) -> ModelConfig | None:
    """The layers of a transformers architecture at its config class's defaults (AutoConfig.for_model, e.g.
    'mistral', 'qwen3', 'phi3'); None when transformers knows no such model type."""
    try:
        from transformers import CONFIG_MAPPING, AutoConfig
    except ImportError:  # pragma: no cover - transformers is a test dependency
        return None
    if model_type not in CONFIG_MAPPING:
        return None
    config = AutoConfig.for_model(model_type)
    cfg = {**config.to_dict(), "source": f"transformers {type(config).__name__}() defaults"}
    return from_hf_config(cfg, model_type, f"--model {model_type} ({type(config).__name__} defaults)")


def resolve(specs: list[str]) -> list[ModelConfig]:
    """Models named by specs (comma- or space-separated): 'all' (the committed list), names of the list
    (case-insensitive), paths to a config.json or a folder holding one, and/or transformers model types (their
    config class's defaults). Duplicates dropped."""
    known = catalog()
    out: list[ModelConfig] = []
    for item in (p.strip() for s in specs for p in s.split(",")):
        if not item:
            continue
        if item.lower() == ALL:
            found = list(known.values())
        elif item.lower() in known:
            found = [known[item.lower()]]
        elif os.path.exists(item):
            found = [load_config_file(item)]
        elif (by_type := from_model_type(item)) is not None:
            found = [by_type]
        else:
            raise ValueError(f"--model {item!r}: not a config.json, a folder with one, '{ALL}', a model of the list "
                             f"(--list-models) or a transformers model type ({MODEL_TYPES_HINT} lists them)")
        out += [m for m in found if m not in out]
    return out


def group_by_shape(layers: list[Layer]) -> dict[tuple[int, int], list[Layer]]:
    """Layers by (K, N), in first-seen order: layers sharing a shape are timed once."""
    out: dict[tuple[int, int], list[Layer]] = {}
    for lay in layers:
        out.setdefault(lay.shape, []).append(lay)
    return out


def shape_label(layers: list[Layer], with_model: bool = True) -> str:
    """'llama-3-8b: q_proj, o_proj; mistral-7b: q_proj, o_proj'; 'q_proj, o_proj' with with_model=False (a run of
    one model)."""
    per: dict[str, list[str]] = {}
    for lay in layers:
        names = per.setdefault(lay.model, [])
        if lay.name not in names:
            names.append(lay.name)
    if not with_model:
        return ", ".join(n for names in per.values() for n in names)
    return "; ".join(f"{m}: {', '.join(n)}" for m, n in per.items())


def model_layers(models: list[ModelConfig]) -> dict[tuple[int, int], list[Layer]]:
    """Every linear layer of the models, grouped by (K, N)."""
    return group_by_shape([lay for m in models for lay in linear_layers(m)])


def suite_for(models: list[ModelConfig], every: bool) -> str:
    """The default results file of a --model run: model-shapes for the whole list, else model-<names>."""
    if every:
        return "model-shapes"
    slug = "-".join(re.sub(r"[^a-z0-9.]+", "-", m.name.lower()).strip("-") for m in models)
    return "model-" + (slug[:80] or "config")
