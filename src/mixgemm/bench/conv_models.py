"""The conv layers of `mixgemm bench --conv-models`: every distinct nn.Conv2d of torchvision's and diffusers' models,
read from the data file conv_layers.json (written by tools/bench/conv_layers.py; its "about" says what it holds).

A record becomes a :class:`~mixgemm.bench.conv.ConvSpec` named by its geometry alone, e.g. ``3x3/2 dw 96-96 @112x112``
or ``1x7 p0x3 128-192 @17x17``, so that a name stays the key of its results across regenerations of the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from mixgemm.bench.conv import ConvSpec

DATA_FILE = os.path.join(os.path.dirname(__file__), "conv_layers.json")
LAYER_FIELDS = ("ci", "co", "kernel", "stride", "padding", "dilation", "groups", "hw", "uses", "models", "used_by")


@dataclass(frozen=True)
class ConvLayer:
    """A record of the data file: the layer and who uses it."""

    spec: ConvSpec
    uses: int  # calls over all models
    models: tuple[str, ...]
    used_by: tuple[str, ...]  # the first few model:module names

    @property
    def label(self) -> str:
        """Who uses the layer, short: 'resnet50:layer1.0.conv2 (+2 models, 9 calls)'."""
        more = len(self.models) - 1
        extra = ([f"+{more} model{'s' * (more > 1)}"] if more else []) + ([f"{self.uses} calls"] if self.uses > 1
                                                                            else [])
        return self.used_by[0] + (f" ({', '.join(extra)})" if extra else "")

    def matches(self, needle: str) -> bool:
        """needle (case-insensitive) in the layer's name, one of its models or one of its module names."""
        n = needle.lower()
        return any(n in s.lower() for s in (self.spec.name, *self.models, *self.used_by))


def _pair_text(v: tuple[int, int]) -> str:
    return str(v[0]) if v[0] == v[1] else f"{v[0]}x{v[1]}"


def layer_name(ci: int, co: int, kernel, stride, padding, dilation, groups: int, hw) -> str:
    """The geometry as a name: kernel, /stride, padding where not half the (dilated) kernel, dilation, groups
    (dw: depthwise), channels and input size."""
    kh, kw = kernel
    default_pad = tuple(d * (k // 2) for k, d in zip(kernel, dilation, strict=True))
    parts = [f"{kh}x{kw}" + (f"/{_pair_text(stride)}" if tuple(stride) != (1, 1) else "")]
    if tuple(padding) != default_pad:
        parts.append(f"p{_pair_text(padding)}")
    if tuple(dilation) != (1, 1):
        parts.append(f"d{_pair_text(dilation)}")
    if groups > 1:
        parts.append("dw" if groups == ci == co else f"g{groups}")
    parts.append(f"{ci}-{co} @{hw[0]}x{hw[1]}")
    return " ".join(parts)


def _pair(rec: dict, key: str, where: str) -> tuple[int, int]:
    v = rec[key]
    if not (isinstance(v, list) and len(v) == 2 and all(isinstance(i, int) for i in v)):
        raise ValueError(f"{where}: {key} must be [h, w] ints, got {v!r}")
    return (v[0], v[1])


def to_layer(rec: dict, where: str) -> ConvLayer:
    """One record of the data file as a ConvLayer (ValueError naming the record and field when malformed)."""
    missing = [f for f in LAYER_FIELDS if f not in rec]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    kernel, stride, padding, dilation, hw = (_pair(rec, k, where) for k in
                                             ("kernel", "stride", "padding", "dilation", "hw"))
    ci, co, groups = rec["ci"], rec["co"], rec["groups"]
    name = layer_name(ci, co, kernel, stride, padding, dilation, groups, hw)
    spec = ConvSpec(name, ci, co, kernel, stride, hw, padding, groups, dilation)
    return ConvLayer(spec, int(rec["uses"]), tuple(rec["models"]), tuple(rec["used_by"]))


def load(path: str = DATA_FILE) -> dict:
    """The data file as JSON: {"about", "generator", "versions", "models": {name: {family, source, input_hw, ...}},
    "layers": [record, ...]}."""
    with open(path) as f:
        return json.load(f)


def conv_layers(filters: list[str] | None = None, path: str = DATA_FILE) -> list[ConvLayer]:
    """The file's layers in its order; with filters, those matching any of them: a filter that is a model's name
    (resnet50) or a family's (ResNet, case-insensitive) takes that model's or family's layers, any other text the
    layers whose name, models or module names contain it (ConvLayer.matches: "7x7", "unet", "layer4")."""
    data = load(path)
    layers = [to_layer(r, f"{os.path.basename(path)} layer {i}") for i, r in enumerate(data["layers"])]
    if not filters:
        return layers
    families: dict[str, set[str]] = {}
    for name, info in data["models"].items():
        families.setdefault(name.lower(), set()).add(name)
        families.setdefault(str(info.get("family", "")).lower(), set()).add(name)

    def take(lay: ConvLayer, needle: str) -> bool:
        named = families.get(needle.lower())
        return bool(named.intersection(lay.models)) if named else lay.matches(needle)

    return [lay for lay in layers if any(take(lay, f) for f in filters)]


def macs(spec: ConvSpec, batch: int) -> int:
    """Multiply-adds of the layer at this batch (M * K * N of its implicit GEMM)."""
    m, k, n = spec.gemm_dims(batch)
    return m * k * n
