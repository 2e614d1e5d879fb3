"""Per-call host time of act-order QuantLinear layers in eager mode: plain, gathering in the kernel, and fed already
gathered by a norm's forward hook (mixgemm.nn.norms), next to nn.Linear, plus a cProfile of the
slowest.

Each case: a 4096x4096 W4 g128 zero-point fp16 layer (or an RMSNorm + 3 such layers for the norm cases), M = 1,
--calls back-to-back calls without a sync (the rate an eager decode loop issues them), median of --repeats.

    PYTHONPATH=src python -m tools.profile.actorder_eager [--calls 200] [--repeats 5] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from functools import partial

import torch
from torch import nn

import mixgemm
from mixgemm.bench.protocol import synced_call_us
from mixgemm.nn.linear import QuantLinear
from mixgemm.nn.norms import gather_act_order_at_norms


class Attention(nn.Module):
    def __init__(self, q, k, v):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = q, k, v

    def forward(self, hidden_states):
        return self.q_proj(hidden_states) + self.k_proj(hidden_states) + self.v_proj(hidden_states)


class Layer(nn.Module):
    def __init__(self, attn, k):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(k, device="cuda", dtype=torch.float16)
        self.self_attn = attn

    def forward(self, hidden_states):
        hidden_states = self.input_layernorm(hidden_states)
        return self.self_attn(hidden_states=hidden_states)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    k = args.k
    torch.manual_seed(0)
    linear = nn.Linear(k, k, bias=False, device="cuda", dtype=torch.float16)
    cfg = mixgemm.W4A16(group_size=128, mode="zero_point").weight_config()
    plain = [QuantLinear.from_linear(nn.Linear(k, k, bias=False, device="cuda", dtype=torch.float16), cfg)
             for _ in range(3)]
    perm = torch.randperm(k, device="cuda")
    ordered = [QuantLinear.from_quantized(p.quantized_weight(), input_perm=perm.clone()) for p in plain]
    x = torch.randn(1, k, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        cases = {"nn.Linear": linear, "plain": plain[0], "act-order in-kernel": ordered[0]}
        layer_plain = Layer(Attention(*plain), k)
        layer_kernel = Layer(Attention(*ordered), k)
        layer_norm = Layer(Attention(*[QuantLinear.from_quantized(p.quantized_weight(), input_perm=perm.clone())
                                       for p in plain]), k)
        assert len(gather_act_order_at_norms(layer_norm)) == 3
        cases.update({"norm + 3 plain": layer_plain, "norm + 3 in-kernel": layer_kernel,
                      "norm hook + 3 gathered": layer_norm})
        for name, fn in cases.items():
            print(f"{name:26s} {synced_call_us(partial(fn, x), args.calls, args.repeats):8.1f} us/call", flush=True)
        torch.testing.assert_close(layer_norm(x), layer_kernel(x), rtol=0, atol=0)
        if args.profile:
            for name in ("act-order in-kernel", "norm hook + 3 gathered"):
                fn = cases[name]
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(args.calls):
                    fn(x)
                torch.cuda.synchronize()
                prof.disable()
                print(f"--- {name}")
                pstats.Stats(prof).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
