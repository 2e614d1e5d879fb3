"""The whole networks of `mixgemm bench --conv-networks`: torchvision's ResNet-50, ConvNeXt-T, EfficientNet-B0 and
MobileNetV3-L and diffusers' UNet2DConditionModel at its default config (Stable Diffusion 1.x's shapes), all with random
weights (nothing is downloaded).

torchvision and diffusers are no dependencies of mixgemm: they are imported when a network is built. torchvision's
model definitions are pure Python; its compiled ops (nms, roi_align: detection post-processing) are used by none of
these networks, so where they do not load against the installed torch (another CUDA major version, another torch
build) :func:`import_torchvision` imports the definitions without them.
"""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

UNET_LATENT = 64  # UNet2DConditionModel's sample_size is None by default: SD 1.x's 64 x 64 latent (512 px images)
TEXT_TOKENS = 77
# A UNet2DConditionModel small enough for a CPU smoke run, with every kind of block the full one has (cross-attention
# down / up blocks, the cross-attention mid block, resnets, up / down samplers)
TINY_UNET = dict(block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), layers_per_block=1, cross_attention_dim=32,
                 attention_head_dim=8, norm_num_groups=8)


@dataclass(frozen=True)
class NetworkCase:
    """A network of the benchmark: how to build it (random weights, eval mode, float32, on the default device) and its
    input at a batch size, resolution (H = W), dtype and device; ``smoke``: build() for a CPU smoke run (a smaller
    config where the real one takes minutes on a CPU)."""

    name: str
    source: str  # "torchvision" / "diffusers" / "test"
    hw: int  # the input resolution of a timed run (a UNet's latent size)
    smoke_hw: int  # ... and of a smoke run
    build: Callable[[], nn.Module]
    inputs: Callable[[nn.Module, int, int, torch.dtype, torch.device], tuple[tuple, dict]]
    smoke: Callable[[], nn.Module] | None = None

    def make(self, smoke: bool) -> nn.Module:
        net = (self.smoke or self.build)() if smoke else self.build()
        return calibrate_batch_norms(net, self.smoke_hw if smoke else self.hw)


CALIBRATION_BATCH, CALIBRATION_STEPS = 4, 2


@torch.no_grad()
def calibrate_batch_norms(net: nn.Module, hw: int) -> nn.Module:
    """``net`` in eval mode, its BatchNorms' running statistics those of random images (the average over
    CALIBRATION_STEPS batches). A random-weight network keeps BatchNorm's initial statistics (mean 0, variance 1),
    which shrink the activations layer after layer: EfficientNet-B0's logits come out near 1e-14 and MobileNetV3-L's
    near 1e-9, zero in float16, so neither the timing data nor an agreement check would be those of a trained
    network. Networks without BatchNorm are only put in eval mode."""
    norms = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if norms:
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the calibration batches
        net.train()
        gen = torch.Generator().manual_seed(0)
        device = next(net.parameters()).device  # (a default device may have built it elsewhere)
        for _ in range(CALIBRATION_STEPS):
            net(torch.randn(CALIBRATION_BATCH, 3, hw, hw, generator=gen, device="cpu").to(device))
    return net.eval()


def import_torchvision():
    """torchvision; where its compiled ops do not load against this torch (import raises RuntimeError: another CUDA
    major version, or operators missing), imported again with the ops left out, which these networks never call."""
    try:
        import torchvision
    except RuntimeError as e:
        why = str(e)[:160]
        for mod in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[mod]
        ext = types.ModuleType("torchvision.extension")
        ext._has_ops = lambda: False
        ext._load_library = lambda name: False
        ext._check_cuda_version = lambda: -1

        def _assert_has_ops():
            raise RuntimeError(f"torchvision's compiled ops did not load ({why})")

        ext._assert_has_ops = _assert_has_ops
        sys.modules["torchvision.extension"] = ext
        for name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
            sys.modules[name] = types.ModuleType(name)
        warnings.warn(f"torchvision's compiled ops did not load ({why}); its model definitions are used "
                      "without them", stacklevel=2)
        import torchvision
    return torchvision


def _image(net: nn.Module, batch: int, hw: int, dtype: torch.dtype, device: torch.device) -> tuple[tuple, dict]:
    x = torch.randn(batch, 3, hw, hw, device=device).to(dtype).contiguous(memory_format=torch.channels_last)
    return (x,), {}


def _unet_inputs(net: nn.Module, batch: int, hw: int, dtype: torch.dtype, device: torch.device) -> tuple[tuple, dict]:
    cfg = net.config
    sample = torch.randn(batch, cfg.in_channels, hw, hw, device=device).to(dtype)
    text = torch.randn(batch, TEXT_TOKENS, cfg.cross_attention_dim, device=device).to(dtype)
    t = torch.full((batch,), 500, device=device, dtype=torch.long)
    return (sample.contiguous(memory_format=torch.channels_last), t), {"encoder_hidden_states": text,
                                                                       "return_dict": False}


def _torchvision(name: str) -> Callable[[], nn.Module]:
    return lambda: import_torchvision().models.get_model(name, weights=None)


def _unet(config: dict) -> Callable[[], nn.Module]:
    def build():
        import_torchvision()  # diffusers imports torchvision when it is installed: the same tolerant import first
        from diffusers import UNet2DConditionModel

        return UNet2DConditionModel(**config)

    return build


NETWORKS: dict[str, NetworkCase] = {c.name: c for c in (
    # (the two with a batch-1 bar first: a run cut by its time budget still has them)
    NetworkCase("resnet50", "torchvision", 224, 32, _torchvision("resnet50"), _image),
    NetworkCase("unet2d_condition", "diffusers", UNET_LATENT, 16, _unet({}), _unet_inputs, smoke=_unet(TINY_UNET)),
    NetworkCase("convnext_tiny", "torchvision", 224, 32, _torchvision("convnext_tiny"), _image),
    NetworkCase("efficientnet_b0", "torchvision", 224, 32, _torchvision("efficientnet_b0"), _image),
    NetworkCase("mobilenet_v3_large", "torchvision", 224, 32, _torchvision("mobilenet_v3_large"), _image),
)}
# a CPU smoke run's networks: a classifier with depthwise convs, squeeze-excitation and Linear layers, and the UNet
SMOKE_NETWORKS = ("mobilenet_v3_large", "unet2d_condition")


def resolve(names: list[str]) -> list[NetworkCase]:
    """The networks named (comma- or space-separated; none: all of them), ValueError naming an unknown one."""
    wanted = [p.strip() for s in names for p in s.split(",") if p.strip()]
    unknown = [n for n in wanted if n not in NETWORKS]
    if unknown:
        raise ValueError(f"--conv-networks: unknown network(s) {', '.join(unknown)}; choose from {', '.join(NETWORKS)}")
    return [NETWORKS[n] for n in dict.fromkeys(wanted)] if wanted else list(NETWORKS.values())
