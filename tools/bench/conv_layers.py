"""Every distinct Conv2d layer of torchvision's and diffusers' models -> src/mixgemm/bench/conv_layers.json, the
layers `mixgemm bench --conv-models` times.

Each model is built with random weights (weights=None: nothing is downloaded) on the ``meta`` device and run once at
its default input resolution; a forward pre-hook on every nn.Conv2d records the geometry of each call (channels,
kernel, stride, padding, dilation, groups, input H x W). A meta forward gives the shapes without any compute; a model
that cannot run on meta runs once on the CPU instead. The data file keeps one record per distinct geometry, with the
models using it, the first few "model:module" names and the number of calls.

torchvision and diffusers are no dependencies of mixgemm, and this tool imports nothing of mixgemm: it runs in a venv
of its own (torchvision 0.28 is the release built for torch 2.13):

    python3 -m venv /tmp/convvenv
    /tmp/convvenv/bin/pip install /opt/wheels/torch-*.whl torchvision==0.28.0 diffusers
    /tmp/convvenv/bin/python -m tools.bench.conv_layers            # rewrites src/mixgemm/bench/conv_layers.json
    /tmp/convvenv/bin/python -m tools.bench.conv_layers --only resnet50 --out /tmp/r50.json

PyPI's torchvision wheels are built against the CUDA torch; beside the CPU torch wheel their C ops (nms, roi_align:
detection post-processing, never a convolution) do not load, and torchvision's registrations of those ops then fail at
import. :func:`import_torchvision` leaves those registrations out so that the pure-Python model definitions import;
the detection models run their backbone, FPN and heads, not the post-processing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_OUT = os.path.join("src", "mixgemm", "bench", "conv_layers.json")
USED_BY_CAP = 3  # "model:module" names kept per layer (the count keeps the rest)

# torchvision classification families of issue 109 (model-name prefix -> family); others (ViT, Swin, AlexNet...) are
# left out
CLASSIFICATION_FAMILIES = {
    "resnet": "ResNet", "resnext": "ResNeXt", "wide_resnet": "Wide-ResNet", "vgg": "VGG", "densenet": "DenseNet",
    "inception_v3": "Inception-v3", "googlenet": "GoogLeNet", "mobilenet_v2": "MobileNetV2",
    "mobilenet_v3": "MobileNetV3", "efficientnet_v2": "EfficientNetV2", "efficientnet_b": "EfficientNet",
    "regnet": "RegNet", "convnext": "ConvNeXt", "shufflenet": "ShuffleNet", "squeezenet": "SqueezeNet",
    "mnasnet": "MNASNet",
}
SEGMENTATION = {"fcn_resnet50": "FCN", "fcn_resnet101": "FCN", "deeplabv3_resnet50": "DeepLabV3",
                "deeplabv3_resnet101": "DeepLabV3", "deeplabv3_mobilenet_v3_large": "DeepLabV3"}
DETECTION = {"retinanet_resnet50_fpn": "RetinaNet", "retinanet_resnet50_fpn_v2": "RetinaNet",
             "fasterrcnn_resnet50_fpn": "FasterRCNN", "fasterrcnn_resnet50_fpn_v2": "FasterRCNN",
             "fasterrcnn_mobilenet_v3_large_fpn": "FasterRCNN",
             "fasterrcnn_mobilenet_v3_large_320_fpn": "FasterRCNN"}
SEGMENTATION_HW = (520, 520)  # torchvision's segmentation weights resize to 520
# a COCO-typical 640 x 480 image; the detector's own transform resizes it (min side 800, max 1333) and pads to 32
DETECTION_IMAGE_HW = (480, 640)
UNET_SAMPLE = 64  # UNet2DConditionModel's default config has sample_size None: SD 1.x's 64 x 64 latent (512 px)
TEXT_TOKENS = 77
# Stable Diffusion 1.x's VAE (runwayml/stable-diffusion-v1-5 vae/config.json) beside AutoencoderKL's default config
# (one 64-channel block at 32 x 32): the VAE users run
SD_VAE = {"in_channels": 3, "out_channels": 3, "latent_channels": 4, "layers_per_block": 2, "norm_num_groups": 32,
          "block_out_channels": (128, 256, 512, 512), "sample_size": 512,
          "down_block_types": ("DownEncoderBlock2D",) * 4, "up_block_types": ("UpDecoderBlock2D",) * 4}


@dataclass(frozen=True)
class ConvGeometry:
    """One convolution call: what decides its cost (weights and bias values aside)."""

    ci: int
    co: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    hw: tuple[int, int]  # input H x W


@dataclass
class LayerUse:
    models: list[str] = field(default_factory=list)
    used_by: list[str] = field(default_factory=list)
    uses: int = 0


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def conv_padding(conv) -> tuple[int, int]:
    """The padding of an nn.Conv2d as two ints ("valid": 0; "same": half the dilated kernel, symmetric only)."""
    if conv.padding == "valid":
        return (0, 0)
    if conv.padding == "same":
        out = []
        for k, d in zip(conv.kernel_size, conv.dilation, strict=True):
            total = d * (k - 1)
            if total % 2:
                raise ValueError(f"padding='same' with kernel {conv.kernel_size}, dilation {conv.dilation} pads "
                                 "asymmetrically; not a geometry the data file holds")
            out.append(total // 2)
        return (out[0], out[1])
    return _pair(conv.padding)


def geometry(conv, x) -> ConvGeometry:
    if conv.padding_mode != "zeros":
        raise ValueError(f"padding_mode={conv.padding_mode!r}: the data file holds zero-padded convolutions only")
    return ConvGeometry(conv.in_channels, conv.out_channels, _pair(conv.kernel_size), _pair(conv.stride),
                        conv_padding(conv), _pair(conv.dilation), conv.groups, (int(x.shape[-2]), int(x.shape[-1])))


class ConvRecorder:
    """Forward pre-hooks on every nn.Conv2d of the modules given to :meth:`watch`: each call's geometry, by model."""

    def __init__(self):
        self.layers: dict[ConvGeometry, LayerUse] = {}
        self.calls: dict[str, int] = {}  # model -> conv calls recorded

    def watch(self, model_name: str, module) -> list:
        """Hook every Conv2d of module; returns the hook handles (remove them when the model is done)."""
        import torch.nn as nn

        handles = []
        for name, sub in module.named_modules():
            if isinstance(sub, nn.Conv2d):
                handles.append(sub.register_forward_pre_hook(self._hook(model_name, name)))
        return handles

    def _hook(self, model_name: str, layer_name: str) -> Callable:
        def hook(conv, args):
            use = self.layers.setdefault(geometry(conv, args[0]), LayerUse())
            if model_name not in use.models:
                use.models.append(model_name)
            ref = f"{model_name}:{layer_name}"
            if len(use.used_by) < USED_BY_CAP and ref not in use.used_by:
                use.used_by.append(ref)
            use.uses += 1
            self.calls[model_name] = self.calls.get(model_name, 0) + 1

        return hook

    def run(self, model_name: str, build: Callable, forward: Callable) -> str:
        """build() -> module, forward(module) runs it once; returns where: "meta" (built and run on meta), "cpu->meta"
        (a constructor that computes with tensors, e.g. RegNet's widths, built on the CPU without weight init, then
        moved to meta) or "cpu" (run on the CPU)."""
        import torch

        for where in ("meta", "cpu->meta", "cpu"):
            calls = dict(self.calls)
            layers = {g: LayerUse(list(u.models), list(u.used_by), u.uses) for g, u in self.layers.items()}
            try:
                with torch.no_grad():
                    if where == "meta":
                        with torch.device("meta"):
                            module = build()
                    else:
                        with skip_weight_init():
                            module = build()
                    run_on = "cpu" if where == "cpu" else "meta"
                    module = module.to(run_on).eval()
                    handles = self.watch(model_name, module)
                    try:
                        with torch.device(run_on):
                            forward(module)
                    finally:
                        for h in handles:
                            h.remove()
                return where
            except (RuntimeError, NotImplementedError) as e:
                if where == "cpu":
                    raise
                print(f"{model_name}: not on {where} ({type(e).__name__}: {str(e)[:120]})", file=sys.stderr)
                self.calls, self.layers = calls, layers  # drop what the failed attempt recorded
        raise AssertionError("unreachable")

    def records(self) -> list[dict]:
        """One JSON record per distinct geometry, sorted by (kernel, Ci, Co, H, W, stride, ...)."""
        out = []
        for g, use in sorted(self.layers.items(), key=lambda kv: (kv[0].kernel, kv[0].ci, kv[0].co, kv[0].hw,
                                                                   kv[0].stride, kv[0].padding, kv[0].dilation,
                                                                   kv[0].groups)):
            out.append({"ci": g.ci, "co": g.co, "kernel": list(g.kernel), "stride": list(g.stride),
                        "padding": list(g.padding), "dilation": list(g.dilation), "groups": g.groups,
                        "hw": list(g.hw), "uses": use.uses, "models": use.models, "used_by": use.used_by})
        return out


@contextlib.contextmanager
def skip_weight_init():
    """torch.nn.init's fills as no-ops: a model built on the CPU only for its shapes skips minutes of random init."""
    import torch.nn.init as init

    names = [n for n in dir(init) if n.endswith("_") and not n.startswith("_") and callable(getattr(init, n))]
    saved = {n: getattr(init, n) for n in names}
    try:
        for n in names:
            setattr(init, n, lambda tensor, *a, **k: tensor)
        yield
    finally:
        for n, f in saved.items():
            setattr(init, n, f)


def import_torchvision():
    """torchvision, importable beside the CPU torch wheel (see the module docstring)."""
    try:
        import torchvision
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
        for mod in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[mod]
        for name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
            sys.modules[name] = types.ModuleType(name)
        import torchvision
    return torchvision


@dataclass(frozen=True)
class ModelCase:
    name: str
    family: str
    source: str  # "torchvision" or "diffusers"
    input_hw: tuple[int, int]
    build: Callable
    forward: Callable


def _classification(tv, name: str) -> ModelCase:
    import torch

    family = next(f for p, f in sorted(CLASSIFICATION_FAMILIES.items(), key=lambda kv: -len(kv[0]))
                  if name.startswith(p))
    crop = tv.models.get_model_weights(name).DEFAULT.transforms().crop_size  # metadata only: no download
    hw = (crop[0], crop[0]) if len(crop) == 1 else tuple(crop)
    extra = {"aux_logits": False, "init_weights": False} if name in ("inception_v3", "googlenet") else {}
    return ModelCase(name, family, "torchvision", hw, lambda: tv.models.get_model(name, weights=None, **extra),
                     lambda m: m(torch.empty(1, 3, *hw)))


def _segmentation(tv, name: str) -> ModelCase:
    import torch

    hw = SEGMENTATION_HW
    return ModelCase(name, SEGMENTATION[name], "torchvision", hw,
                     lambda: tv.models.get_model(name, weights=None, weights_backbone=None),
                     lambda m: m(torch.empty(1, 3, *hw)))


def _detection(tv, name: str) -> ModelCase:
    import torch

    def forward(m):
        images, _ = m.transform([torch.zeros(3, *DETECTION_IMAGE_HW)])
        feats = list(m.backbone(images.tensors).values())
        # RetinaNet: one head over the FPN levels; Faster R-CNN: the RPN head (its ROI box head is linear layers or,
        # in v2, convs over 7 x 7 ROI crops cut by roi_align, a C op; not run here)
        (m.head if hasattr(m, "head") else m.rpn.head)(feats)

    def build():
        return tv.models.get_model(name, weights=None, weights_backbone=None)

    with torch.device("meta"):
        tf = build().transform
    h, w = DETECTION_IMAGE_HW
    scale, div = tf.min_size[0] / min(h, w), tf.size_divisible
    padded = tuple(-(-round(v * scale) // div) * div for v in (h, w))  # the batch the backbone sees
    return ModelCase(name, DETECTION[name], "torchvision", padded, build, forward)


def _unet() -> ModelCase:
    import torch
    from diffusers import UNet2DConditionModel

    def forward(m):
        cfg = m.config
        m(torch.empty(1, cfg.in_channels, UNET_SAMPLE, UNET_SAMPLE), torch.tensor([10]),
          encoder_hidden_states=torch.empty(1, TEXT_TOKENS, cfg.cross_attention_dim))

    return ModelCase("unet2d_condition", "UNet2DConditionModel", "diffusers", (UNET_SAMPLE, UNET_SAMPLE),
                     lambda: UNet2DConditionModel(), forward)


def _vae(name: str, config: dict) -> ModelCase:
    import torch
    from diffusers import AutoencoderKL

    def build():
        return AutoencoderKL(**config)

    with torch.device("meta"):
        size = build().config.sample_size
    size = size if isinstance(size, int) else size[0]

    def forward(m):
        x = torch.empty(1, m.config.in_channels, size, size)
        m.decode(m.encode(x).latent_dist.mode())  # encoder and decoder, no sampling

    return ModelCase(name, "AutoencoderKL", "diffusers", (size, size), build, forward)


def model_cases(only: str | None = None) -> list[ModelCase]:
    tv = import_torchvision()
    names = [n for n in tv.models.list_models(module=tv.models)
             if any(n.startswith(p) for p in CLASSIFICATION_FAMILIES)]
    cases = [_classification(tv, n) for n in sorted(names)]
    cases += [_segmentation(tv, n) for n in SEGMENTATION]
    cases += [_detection(tv, n) for n in DETECTION]
    cases += [_unet(), _vae("autoencoder_kl", {}), _vae("autoencoder_kl_sd", SD_VAE)]
    return [c for c in cases if only is None or only in c.name]


def versions() -> dict:
    import importlib.metadata as md

    return {p: md.version(p) for p in ("torch", "torchvision", "diffusers")}


ABOUT = ("Every distinct nn.Conv2d geometry of torchvision's classification models (ResNet, ResNeXt, Wide-ResNet, VGG, "
         "DenseNet, Inception-v3, GoogLeNet, MobileNet v2 / v3, EfficientNet B0-B7 and V2, RegNet, ConvNeXt, "
         "ShuffleNet, SqueezeNet, MNASNet) at each model's default input resolution, of its segmentation models "
         f"(FCN, DeepLabV3; {SEGMENTATION_HW[0]} x {SEGMENTATION_HW[1]}) and of its detectors' backbone, FPN and "
         f"heads (RetinaNet, Faster R-CNN's RPN; a {DETECTION_IMAGE_HW[1]} x {DETECTION_IMAGE_HW[0]} image through "
         f"the detector's own resize and padding), and of diffusers' UNet2DConditionModel (default config, "
         f"{UNET_SAMPLE} x {UNET_SAMPLE} latent) and AutoencoderKL (default config, and Stable Diffusion 1.x's VAE "
         "at 512 x 512), random weights, batch 1. One record per geometry: ci, co, kernel [kh, kw], stride, padding, "
         "dilation [h, w], groups, hw (input H x W), uses (calls over all models), models (every model calling it), "
         f"used_by (the first {USED_BY_CAP} model:module names). Generated by tools/bench/conv_layers.py; read by "
         "mixgemm.bench.conv_models for `mixgemm bench --conv-models`.")


def to_json(models: dict, layers: list[dict], vers: dict) -> str:
    """The data file's text: one line per model and per layer (diff-friendly, compact)."""
    head = {"about": ABOUT, "generator": "tools/bench/conv_layers.py", "versions": vers}
    lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    lines.append(' "models": {')
    lines += [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in models.items()]
    lines[-1] = lines[-1].rstrip(",")
    lines += [" },", ' "layers": [']
    lines += [f"  {json.dumps(r)}," for r in layers]
    lines[-1] = lines[-1].rstrip(",")
    lines += [" ]", "}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=DEFAULT_OUT, help=f"the data file to write (default {DEFAULT_OUT})")
    p.add_argument("--only", default=None, help="only the models whose name contains this")
    args = p.parse_args(argv)
    rec = ConvRecorder()
    models = {}
    for case in model_cases(args.only):
        where = rec.run(case.name, case.build, case.forward)
        distinct = sum(case.name in u.models for u in rec.layers.values())
        models[case.name] = {"family": case.family, "source": case.source, "input_hw": list(case.input_hw),
                             "conv_calls": rec.calls.get(case.name, 0), "distinct": distinct, "run_on": where}
        print(f"{case.name:<40} {case.family:<22} {case.input_hw[0]}x{case.input_hw[1]:<5} "
              f"{rec.calls.get(case.name, 0):>4} conv calls, {distinct:>3} distinct ({where})", file=sys.stderr)
    layers = rec.records()
    with open(args.out, "w") as f:
        f.write(to_json(models, layers, versions()))
    print(f"wrote {args.out}: {len(layers)} distinct conv layers of {len(models)} models", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
