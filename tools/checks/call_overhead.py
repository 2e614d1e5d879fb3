"""Per-call cost of a quantized layer against nn.Linear, as a user's eager model sees it.

For each precision, a 2048x2048 fp16 layer on CUDA is called back to back (``--calls`` times, one
synchronize at the end) at M = 0, 1, 16 and 512; the wall time per call is the larger of the host's launch
overhead and the GPU time, which is what decides eager ``model.generate()`` speed. The same is measured for
``nn.Linear`` in the same process, and for the module under ``torch.compile`` without CUDA graphs.

    PYTHONPATH=src python -m tools.checks.call_overhead --out DIR

Writes DIR/call_overhead.json and prints a table. Exits non-zero only when an output is wrong (M = 0 shape,
or a result off the dequantized F.linear), never on speed: speed is reported, not asserted.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch import nn


def _per_call_us(fn, x, calls: int) -> float:
    for _ in range(10):
        fn(x)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):  # best of 5 rounds: the host is shared with nothing else, spikes are scheduler noise
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(x)
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main() -> int:
    import mixgemm

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--size", type=int, default=2048)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = "cuda"
    torch.manual_seed(0)
    k = n = args.size
    lin = nn.Linear(k, n, bias=False, dtype=torch.float16, device=dev)
    precisions = {"W4A16": mixgemm.W4A16(group_size=128), "W8A16": mixgemm.W8A16(group_size=-1),
                  "W8A8": mixgemm.W8A8(group_size=-1), "W4A8 token": mixgemm.W4A8(act_block="token")}
    rows, failed = [], []
    with torch.no_grad():
        for m in (0, 1, 16, 512):
            x = torch.randn(m, k, dtype=torch.float16, device=dev)
            base = _per_call_us(lin, x, args.calls)
            base_c = _per_call_us(torch.compile(lin, dynamic=False), x, args.calls)
            for name, cfg in precisions.items():
                model = nn.Sequential(nn.Linear(k, n, bias=False, dtype=torch.float16, device=dev))
                model[0].weight.copy_(lin.weight)
                mixgemm.quantize_(model, cfg)
                q = model[0]
                try:
                    y = q(x)
                except Exception as e:  # noqa: BLE001 - reported as a failure, the other rows still run
                    failed.append(f"{name} M={m}: QuantLinear raised {type(e).__name__}: {e}")
                    continue
                if tuple(y.shape) != (m, n):
                    failed.append(f"{name} M={m}: output shape {tuple(y.shape)}, expected {(m, n)}")
                elif m and q.act_mode is None:
                    ref = torch.nn.functional.linear(x.float(), q.dequantize(torch.float32))
                    err = ((y.float() - ref).norm() / ref.norm()).item()
                    if not err < 2e-3:
                        failed.append(f"{name} M={m}: rel err {err:.2e} against the dequantized F.linear")
                t_eager = _per_call_us(q, x, args.calls)
                try:
                    t_matmul = _per_call_us(lambda t, q=q: mixgemm.matmul(t, q.quantized_weight()), x, args.calls)
                except Exception as e:  # noqa: BLE001 - reported as a failure, the other rows still run
                    failed.append(f"{name} M={m}: mixgemm.matmul raised {type(e).__name__}: {e}")
                    t_matmul = float("nan")
                torch._dynamo.reset()
                t_comp = _per_call_us(torch.compile(q, dynamic=False), x, args.calls)
                rows.append({"precision": name, "M": m, "nn_linear_us": base, "nn_linear_compiled_us": base_c,
                             "quantlinear_us": t_eager, "matmul_us": t_matmul, "quantlinear_compiled_us": t_comp,
                             "eager_ratio": t_eager / base, "compiled_ratio": t_comp / base_c})
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "layer": [n, k], "rows": rows,
            "failed": failed}
    (args.out / "call_overhead.json").write_text(json.dumps(info, indent=1))
    print(f"{info['gpu']}, torch {info['torch']}, {k}x{n} fp16, {args.calls} calls back to back (us per call)")
    print("| precision | M | nn.Linear | QuantLinear | ratio | mixgemm.matmul | nn.Linear compiled "
          "| QuantLinear compiled | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['precision']} | {r['M']} | {r['nn_linear_us']:.1f} | {r['quantlinear_us']:.1f} | "
              f"{r['eager_ratio']:.2f} | {r['matmul_us']:.1f} | {r['nn_linear_compiled_us']:.1f} | "
              f"{r['quantlinear_compiled_us']:.1f} | {r['compiled_ratio']:.2f} |")
    for f in failed:
        print("FAILED:", f)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
