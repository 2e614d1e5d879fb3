"""The interface of a benchmark method (mixgemm.bench.methods describes it): what a method is, what its prepare
returns, the context it runs in, and the names of mixgemm's weight-only methods. Its own module so that the method
families (mixgemm.bench.methods, mixgemm.bench.read_ceiling) share it without importing each other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


class Refused(ValueError):
    """Raised by a method's prepare when its format cannot hold the layer (e.g. 4-bit codes with an odd number of
    weights per output channel): the sweep reports the cases as ``refused`` with the reason, not as errors."""


@dataclass
class Context:
    device: torch.device
    dtype: torch.dtype = torch.float16  # activation dtype of mixgemm's weight-only methods
    group_size: int = 128  # W4 group size of mixgemm's weight-only method
    notes: dict = field(default_factory=dict)  # method name -> note gathered while preparing


@dataclass
class Prepared:
    layer: Callable[[torch.Tensor], torch.Tensor]
    new_copy: Callable[[], Callable[[torch.Tensor], torch.Tensor]]
    x_map: Callable[[torch.Tensor], torch.Tensor]
    reference: Callable[[torch.Tensor], torch.Tensor]
    tol: float
    weight_bytes: Callable[[], int]
    act_bytes: int  # bytes per activation element read by the call
    out_bytes: int  # bytes per output element written
    compute: str = "fp16"  # which ceiling bounds the compute floor: "fp16", "int8" or "fp32"
    before_call: Callable[[], None] = lambda: None  # reset per-call bookkeeping (layout tracking)
    note: str = ""
    # the registry entry the layer runs on x, asked after its first call (its races run): added to the case's note
    chosen: Callable[[torch.Tensor], str] | None = None


@dataclass(frozen=True)
class Method:
    name: str
    family: str  # "mixgemm" or "peer"
    prepare: Callable[[torch.Tensor, Context], Prepared]
    unavailable: Callable[[Context], str | None] = lambda ctx: None
    applies: Callable[[int, int, int, Context], str | None] = lambda m, k, n, ctx: None
    cpu: bool = False  # runs on the CPU path too
    default: bool = True  # part of the default method set
    quick: bool = True  # part of --quick's default set (False: slow to set up, e.g. autotunes)
    kind: str = "matmul"  # "matmul" (cases K x N, M) or "conv" (cases ConvSpec, batch)
    description: str = ""


def mixgemm_weight_only_name(bits: int, group_size: int, mode: str = "sym") -> str:
    g = "per-channel" if group_size == -1 else f"g{group_size}"
    return f"mixgemm W{bits}A16 {g}" + ("" if mode == "sym" else " " + mode.replace("_", "-"))
