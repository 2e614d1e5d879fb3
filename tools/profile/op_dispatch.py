"""What the dispatcher adds to one call of a mixgemm op, against the same Python kernel called directly and against
the same kernel registered with ``torch.library.custom_op`` (the registration the ops used before): the per-call
cost torch.compile without CUDA graphs pays per layer. Runs on the CPU (the dispatch is the same there).

    PYTHONPATH=src python -m tools.profile.op_dispatch [--device cpu|cuda]"""

from __future__ import annotations

import argparse
import math

import torch

import mixgemm
from mixgemm.ops import custom_ops
from tools.profile.eager_overhead import rate_us


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    out = torch.empty(1, device=a.device)

    def trivial(x, qweight, scales, zeros, offsets, bias, bits, group_size, mode, n, k, lo, hi, input_perm=None):
        return out.new_empty(1)  # a new tensor, like every kernel: only the dispatch is timed

    # the same schema twice: as the ops register now, and through custom_op
    custom_ops._LIB.define("dispatch_probe(Tensor x, Tensor qweight, Tensor scales, Tensor zeros, Tensor offsets, "
                           "Tensor? bias, SymInt bits, SymInt group_size, str mode, SymInt N, SymInt K, float lo, "
                           "float hi, Tensor? input_perm=None) -> Tensor")
    custom_ops._LIB.impl("dispatch_probe", trivial, "CompositeExplicitAutograd")
    torch.library.register_autograd("mixgemm::dispatch_probe", lambda ctx, g: (None,) * 14,
                                    setup_context=lambda ctx, inputs, output: None)
    # the ops' no_grad overloads: the same kernel with no autograd kernel of Python (what calls that need no gradient
    # take)
    custom_ops._LIB.define("dispatch_probe.no_grad(Tensor x, Tensor qweight, Tensor scales, Tensor zeros, "
                           "Tensor offsets, Tensor? bias, SymInt bits, SymInt group_size, str mode, SymInt N, "
                           "SymInt K, float lo, float hi, Tensor? input_perm=None) -> Tensor")
    custom_ops._LIB.impl("dispatch_probe.no_grad", trivial, "CompositeExplicitAutograd")

    @torch.library.custom_op("mixgemm_probe::custom", mutates_args=())
    def probe(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
              offsets: torch.Tensor, bias: torch.Tensor | None, bits: int, group_size: int, mode: str, N: int,
              K: int, lo: float, hi: float, input_perm: torch.Tensor | None = None) -> torch.Tensor:
        return trivial(x, qweight, scales, zeros, offsets, bias, bits, group_size, mode, N, K, lo, hi, input_perm)

    probe.register_autograd(lambda ctx, g: (None,) * 14, setup_context=lambda ctx, inputs, output: None)
    qw = mixgemm.quantize_weight(torch.randn(64, 64), bits=4, group_size=32).to(a.device)
    args = (torch.randn(1, 64, device=a.device), qw.qweight, qw.scales, torch.empty(0, device=a.device),
            torch.empty(0, device=a.device), None, 4, 32, "sym", 64, 64, -math.inf, math.inf)
    with torch.no_grad():
        rows = {"python call": rate_us(lambda: trivial(*args), 20000),
                "torch.ops.mixgemm (Library kernel + register_autograd)":
                    rate_us(lambda: torch.ops.mixgemm.dispatch_probe.default(*args), 20000),
                "torch.ops.mixgemm .no_grad overload (Library kernel, no autograd kernel)":
                    rate_us(lambda: torch.ops.mixgemm.dispatch_probe.no_grad(*args), 20000),
                "torch.library.custom_op + register_autograd":
                    rate_us(lambda: torch.ops.mixgemm_probe.custom.default(*args), 20000)}
    for name, us in rows.items():
        print(f"{name:72s} {us:7.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
