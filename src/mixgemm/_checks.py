"""Input validation shared by every public op: clear errors that name the problem."""

from __future__ import annotations

import torch

from mixgemm.formats.weight import QuantizedWeight

ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_matmul_inputs(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None,
                        allowed_dtypes=ACT_DTYPES) -> None:
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"qweight must be a mixgemm QuantizedWeight, got {type(qw).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in allowed_dtypes:
        raise TypeError(f"x has dtype {x.dtype}; supported activation dtypes are {allowed_dtypes}")
    if x.dim() < 1 or x.shape[-1] != qw.in_features:
        raise ValueError(
            f"shape mismatch: x has shape {tuple(x.shape)} (last dim {x.shape[-1] if x.dim() else None}) but the "
            f"weight expects K={qw.in_features} input features (weight shape [N, K] = {list(qw.shape)})"
        )
    if x.device != qw.device:
        raise ValueError(f"device mismatch: x is on {x.device} but the weight is on {qw.device}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (qw.out_features,):
            got = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise ValueError(f"bias must have shape ({qw.out_features},), got {got}")
        if bias.device != x.device:
            raise ValueError(f"device mismatch: bias is on {bias.device} but x is on {x.device}")
        if not bias.is_floating_point():
            raise TypeError(f"bias must be floating point, got {bias.dtype}")
