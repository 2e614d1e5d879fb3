"""Convolution weights: [Co, Ci/groups, Kh, Kw] reordered to [Co, Kh, Kw, Ci/groups] and block-quantized.

The reordered weight is flattened to a matrix [Co, Kh * Kw * Ci_g] whose K index is
(kh * Kw + kw) * Ci_g + ci: the implicit-GEMM reduction order, with Ci innermost so that one block of
``group_size`` codes lies inside a single (kh, kw) tap (loads coalesced along Ci).
The group size must therefore divide Ci_g; per-channel (-1) makes one group of the whole K.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgemm.formats.weight import (
    NARROW_GROUP,
    PER_CHANNEL,
    QuantConfig,
    QuantizedWeight,
    dequantize_weight,
    quantize_weight,
)


def check_conv_config(config: QuantConfig, in_channels_per_group: int | None = None) -> None:
    """ValueError for a format no conv kernel takes: groups of 16 (GGUF's sub-blocks, linear weights only), and
    groups that do not divide the input channels per group (a block must lie inside one (kh, kw) tap)."""
    if config.group_size == NARROW_GROUP:
        raise ValueError(f"group_size={NARROW_GROUP} is for linear weights (GGUF's 16-weight sub-blocks); conv "
                         "weights take group_size 32, 64, 128, 256 or -1")
    ci_g = in_channels_per_group
    if ci_g is not None and config.group_size != PER_CHANNEL and ci_g % config.group_size:
        raise ValueError(
            f"group_size={config.group_size} must divide the input channels per group ({ci_g}) so that "
            "each block lies inside one (kh, kw) tap; use group_size=-1 (per-channel) otherwise"
        )


@dataclass(frozen=True)
class QuantizedConvWeight:
    """matrix: QuantizedWeight [Co, Kh * Kw * Ci_g]; kernel_size: (Kh, Kw); in_channels_per_group: Ci_g."""

    matrix: QuantizedWeight
    kernel_size: tuple[int, int]
    in_channels_per_group: int

    @property
    def out_channels(self) -> int:
        return self.matrix.shape[0]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float kernel in PyTorch's [Co, Ci_g, Kh, Kw] order."""
        kh, kw = self.kernel_size
        w = dequantize_weight(self.matrix, dtype).reshape(self.out_channels, kh, kw, self.in_channels_per_group)
        return w.permute(0, 3, 1, 2).contiguous()

    def to(self, device) -> QuantizedConvWeight:
        return QuantizedConvWeight(self.matrix.to(device), self.kernel_size, self.in_channels_per_group)


def quantize_conv_weight(weight: torch.Tensor, config: QuantConfig | None = None, **kwargs) -> QuantizedConvWeight:
    """Quantize a conv kernel [Co, Ci_g, Kh, Kw] in blocks along Ci within each tap (see module doc)."""
    if weight.dim() != 4:
        raise ValueError(f"conv weight must be 4-D [Co, Ci/groups, Kh, Kw], got shape {tuple(weight.shape)}")
    config = config if config is not None else QuantConfig(**kwargs)
    co, ci_g, kh, kw = weight.shape
    check_conv_config(config, ci_g)
    matrix = weight.permute(0, 2, 3, 1).reshape(co, kh * kw * ci_g)
    return QuantizedConvWeight(quantize_weight(matrix, config), (kh, kw), ci_g)
