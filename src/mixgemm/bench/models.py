"""Linear-layer shapes of a transformer from its Hugging Face config.json (`mixgemm bench --model`).

The committed list (model_shapes.json, package data) holds the published config numbers of the models the
acceptance runs use; a config.json of any other decoder (Llama-style attention + gated MLP) works the same way.
A layer is nn.Linear(K=in_features, N=out_features). Per model: q_proj, k_proj, v_proj, o_proj, gate_proj,
up_proj, down_proj and the fused projections serving engines build from them ("qkv (fused)" with N =
(heads + 2 kv_heads) * head_dim, "gate_up (fused)" with N = 2 * intermediate). Architectures that store the
fused projections themselves (Phi-3: qkv_proj, gate_up_proj) list those only; mixture-of-experts models
(num_local_experts) list the expert MLP (w1 = gate, w3 = up, w2 = down) and their fused w1+w3.
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
# expert layouts other than Mixtral's (experts of intermediate_size each): their MLP shapes come from other fields,
# so deriving dense layers from intermediate_size would silently time the wrong shapes
OTHER_MOE_FIELDS = ("moe_intermediate_size", "n_routed_experts", "num_experts")
# model_type values whose checkpoints hold the fused projections as their own modules
FUSED_NATIVE = {"phi3"}


@dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    model_type: str = ""
    num_experts: int = 0
    source: str = ""


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
    other_moe = [k for k in OTHER_MOE_FIELDS if cfg.get(k) is not None]
    if other_moe and cfg.get("num_local_experts") is None:
        raise ValueError(f"{where}: mixture-of-experts config ({', '.join(other_moe)}) is not supported: only "
                         "experts of intermediate_size each (num_local_experts, as Mixtral) are; pass the shapes "
                         "with --shapes")
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
    elif hidden % heads:
        raise ValueError(f"{where}: config has no 'head_dim' and hidden_size={hidden} is not a multiple of "
                         f"num_attention_heads={heads}")
    else:
        head_dim = hidden // heads
    experts = _positive_int(cfg, "num_local_experts", where) if cfg.get("num_local_experts") is not None else 0
    return ModelConfig(name=name, hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
                       num_key_value_heads=kv, head_dim=head_dim, model_type=str(cfg.get("model_type") or ""),
                       num_experts=experts, source=str(cfg.get("source") or ""))


def linear_layers(cfg: ModelConfig) -> list[Layer]:
    """The distinct linear layers of one decoder block (the LM head and embeddings are not benchmarked: they are
    usually left unquantized)."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    qkv, o = ("qkv_proj", q + 2 * kv), ("o_proj", q)
    attn = [("q_proj", q), ("k_proj", kv), ("v_proj", kv), ("qkv (fused)", q + 2 * kv)]
    mlp_pre = "experts." if cfg.num_experts else ""
    gate, up, down = (("w1 (gate)", "w3 (up)", "w2 (down)") if cfg.num_experts
                      else ("gate_proj", "up_proj", "down_proj"))
    mlp = [(mlp_pre + gate, i), (mlp_pre + up, i),
           (mlp_pre + ("w1+w3 (fused gate+up)" if cfg.num_experts else "gate_up (fused)"), 2 * i)]
    if cfg.model_type in FUSED_NATIVE:
        attn, mlp = [qkv], [("gate_up_proj", 2 * i)]
    layers = [Layer(cfg.name, nm, h, n) for nm, n in attn]
    layers.append(Layer(cfg.name, o[0], o[1], h))
    layers += [Layer(cfg.name, nm, h, n) for nm, n in mlp]
    layers.append(Layer(cfg.name, mlp_pre + down, i, h))
    return layers


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


def resolve(specs: list[str]) -> list[ModelConfig]:
    """Models named by specs (comma- or space-separated): 'all' (the committed list), names of the list
    (case-insensitive), and/or paths to a config.json or a folder holding one. Duplicates dropped."""
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
        else:
            raise ValueError(f"--model {item!r}: not a config.json, a folder with one, '{ALL}', or a model of the "
                             f"list ({', '.join(known)})")
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
