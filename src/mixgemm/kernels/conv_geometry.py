"""A convolution's output size and memory format (shared by the conv dispatcher and the conv kernels)."""

from __future__ import annotations

import torch


def conv_output_size(h: int, w: int, kernel_size, stride, padding, dilation) -> tuple[int, int]:
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel_size, stride, padding, dilation
    return (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1


def out_format(x: torch.Tensor) -> torch.memory_format:
    """The reference's rule: channels_last in -> channels_last out (a 1-channel tensor counts as NCHW)."""
    if x.is_contiguous(memory_format=torch.channels_last) and x.shape[1] > 1:
        return torch.channels_last
    return torch.contiguous_format
