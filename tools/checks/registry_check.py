"""GPU check of the kernel registry round (issue 39): QuantLinear.forward time against nn.Linear, eager against eager
and under torch.compile without CUDA graphs against nn.Linear compiled the same way, at M = 1 / 16 / 512 on a
2048x2048 layer for W4A16, W8A16, W8A8, W4A8(act_block="token") and W8A16 in groups of 16 (GGUF Q2_K's form: the
Triton GEMM); the chosen kernel of each (mixgemm.explain);
results equal to the custom op; M = 0.

    PYTHONPATH=src python -m tools.checks.registry_check --out DIR

Prints a table, writes DIR/registry_check.json, exits non-zero when a result differs from the op path or an empty
batch fails. The acceptance line (at most 1.3x nn.Linear's time, eager and compiled) is reported per row, not
enforced."""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial

import torch

import mixgemm
from mixgemm.bench.protocol import synced_call_us

SCHEMES = {"W4A16": lambda: mixgemm.W4A16(), "W8A16": lambda: mixgemm.W8A16(), "W8A8": lambda: mixgemm.W8A8(),
           "W4A8": lambda: mixgemm.W4A8(act_block="token"),
           "W8A16 g16": lambda: mixgemm.W8A16(group_size=16, mode="offset", scale_dtype=torch.float32)}
MS = (1, 16, 512)
N = K = 2048


def op_path(q, x):
    c = q.config
    if q.act_mode is None:
        return torch.ops.mixgemm.linear_wxa16(x, q.qweight, q.scales, q.zeros, q.offsets, q.bias, c.bits, c.group_size,
                                              c.mode, N, K, -float("inf"), float("inf"))
    return torch.ops.mixgemm.linear_wxa8(x, q.qweight, q.scales, q.zeros, q.offsets, q.bias, c.bits, c.group_size,
                                         c.mode, N, K, q.act_mode, -float("inf"), float("inf"), q.act_block)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    ref = torch.nn.Linear(K, N, bias=False).half().cuda()
    rows, failed = [], []
    with torch.no_grad():
        for name, make in SCHEMES.items():
            model = torch.nn.Sequential(torch.nn.Linear(K, N, bias=False)).half().cuda()
            mixgemm.quantize_(model, make())
            q = model[0]
            torch._dynamo.reset()  # a fresh compile per scheme: 4 shapes each stay under the recompile limit
            compiled = torch.compile(model, fullgraph=True, dynamic=False)  # inductor, no CUDA graphs
            # nn.Linear compiled the same way: the compiled rows' yardstick (a compiled call's own host cost)
            compiled_ref = torch.compile(ref, fullgraph=True, dynamic=False)
            for m in MS:
                x = torch.randn(m, K, device="cuda", dtype=torch.float16)
                y = model(x)
                # split-K tiles reduce with atomics, so two calls of either path may differ in the last bits:
                # compare within the fp16 tolerance
                r = op_path(q, x).float()
                if not float((y.float() - r).norm() / r.norm()) <= 1e-3:
                    failed.append(f"{name} M={m}: the eager plan path differs from the custom op")
                c = mixgemm.explain(x, q.quantized_weight(), act_mode=q.act_mode, act_block=q.act_block)
                lin, eag, comp, lin_comp = (synced_call_us(partial(f, x))
                                            for f in (ref, model, compiled, compiled_ref))
                rows.append(dict(scheme=name, M=m, kernel=c.kernel, config=c.config, linear_us=lin, eager_us=eag,
                                 linear_compiled_us=lin_comp, compiled_us=comp, eager_x=eag / lin,
                                 compiled_x=comp / lin_comp, accept=eag / lin <= 1.3 and comp / lin_comp <= 1.3))
            try:
                assert model(torch.randn(0, K, device="cuda", dtype=torch.float16)).shape == (0, N)
                assert compiled(torch.randn(2, 0, K, device="cuda", dtype=torch.float16)).shape == (2, 0, N)
            except Exception as e:  # noqa: BLE001 - reported below
                failed.append(f"{name} M=0: {type(e).__name__}: {e}")
        # the conv analogue of explain on a channels_last fp16 layer
        cw = mixgemm.quantize_conv_weight(torch.randn(64, 64, 3, 3), mixgemm.QuantConfig(bits=4, group_size=64))
        xc = torch.randn(2, 64, 14, 14, device="cuda").half().to(memory_format=torch.channels_last)
        conv_choice = str(mixgemm.explain_conv(xc, cw.to("cuda"), padding=1))
    print(f"{'scheme':7} {'M':>4} {'kernel':15} {'nn.Linear us':>12} {'eager us':>9} {'x':>5} {'compiled lin':>12} "
          f"{'compiled us':>11} {'x':>5} accept")
    for r in rows:
        print(f"{r['scheme']:7} {r['M']:>4} {r['kernel']:15} {r['linear_us']:12.1f} {r['eager_us']:9.1f} "
              f"{r['eager_x']:5.2f} {r['linear_compiled_us']:12.1f} {r['compiled_us']:11.1f} {r['compiled_x']:5.2f} "
              f"{r['accept']}")
    print(conv_choice)
    for f in failed:
        print("FAILED:", f)
    with open(os.path.join(a.out, "registry_check.json"), "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows, conv=conv_choice, failed=failed), fh, indent=1,
                  default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
