"""`python -m mixgemm demo`: quantize one LLM layer and show what it costs and what it saves.

On any machine: quantizes a random layer (std 0.02, like a real projection) in several formats and
reports bytes, compression against fp16, weight error and output error of y = x @ W.T against the
float layer. With a CUDA GPU it also runs mixgemm's kernels, checks them against the float64
reference and times them beside fp16 cuBLAS; without one it says so and does the same with bfloat16 activations on
the CPU path (PyTorch's int4 CPU kernels) beside a bfloat16 torch linear. The timing takes several rounds (--rounds)
and prints the median and the range, of each time and of the speed-up.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mixgemm import reference
from mixgemm.formats import QuantConfig, dequantize_weight, quantize_weight
from mixgemm.ops import matmul
from mixgemm.ops.explain import explain

FORMATS = {
    "W4A16 g128 sym": QuantConfig(bits=4, group_size=128, mode="sym"),
    "W4A16 g128 zero_point": QuantConfig(bits=4, group_size=128, mode="zero_point"),
    "W4A16 g32 offset": QuantConfig(bits=4, group_size=32, mode="offset"),
    "W8A16 per-channel sym": QuantConfig(bits=8, group_size=-1, mode="sym"),
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def _time_ms(fn, device: torch.device, reps: int) -> float:
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1e3


def time_rounds(fns: dict, device: torch.device, rounds: int, reps: int = 3) -> dict[str, list[float]]:
    """{name: [ms of each round]}: every round times each function in turn (so a busy machine slows them alike)."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(_time_ms(fn, device, reps))
    return times


def spread_line(times: dict[str, list[float]], quant: str, base: str) -> str:
    """Median time of each and their range over the rounds, and the speed-up (median, range) of quant over base
    round by round."""
    def us(ts):
        return f"{statistics.median(ts) * 1e3:.1f} us ({min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f})"

    ratios = [b / q for q, b in zip(times[quant], times[base], strict=True)]
    return (f"time over {len(ratios)} rounds, median (min-max): mixgemm {us(times[quant])}, {base} "
            f"{us(times[base])}; speed-up {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x)")


def parse_shape(text: str) -> tuple[int, int]:
    k, n = (int(v) for v in text.lower().split("x"))
    return k, n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mixgemm demo", description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4096x14336", help="K x N of the layer (default: Llama-3-8B up-proj)")
    p.add_argument("-m", "--tokens", type=int, default=1, help="rows M of the activation (default 1: decode)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=5, help="timing rounds (default 5): the median and the spread")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")

    k, n = parse_shape(args.shape)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    gen = torch.Generator().manual_seed(args.seed)
    w = (torch.randn(n, k, generator=gen) * 0.02).to(device)
    x = torch.randn(args.tokens, k, generator=gen).to(device)
    y_float = x.double() @ w.double().T
    fp16_bytes = n * k * 2
    where = torch.cuda.get_device_name() if cuda else (
        "CPU (no CUDA GPU found: kernels are not run; the CPU fallback is used and timed)")
    print(f"mixgemm demo: layer K x N = {k} x {n}, M = {args.tokens}, on {where}")
    print(f"{'format':<24}{'bytes':>12}{'vs fp16':>9}{'weight rel err':>16}{'output rel err':>16}"
          f"{'max err <= s/2':>16}")
    for name, cfg in FORMATS.items():
        qw = quantize_weight(w, cfg)
        wd = dequantize_weight(qw, torch.float64)
        bound = qw.scales.double().repeat_interleave(qw.group_size, 1) / 2
        within = bool(((wd - w.double()).abs() <= bound * (1 + 1e-9)).all())
        y_q = reference.matmul(x, qw, out_dtype=torch.float64)
        print(f"{name:<24}{qw.nbytes():>12,}{fp16_bytes / qw.nbytes():>8.2f}x{_rel(wd, w):>16.2e}"
              f"{_rel(y_q, y_float):>16.2e}{str(within):>16}")

    qw = quantize_weight(w, FORMATS["W4A16 g128 sym"])
    # on a CPU bfloat16: PyTorch's int4 CPU kernels take it (float32 activations take the exact dequantizing GEMM)
    dtype = torch.float16 if cuda else torch.bfloat16
    xd = x.to(dtype)
    y = matmul(xd, qw)
    err = _rel(y, reference.matmul(xd, qw, out_dtype=torch.float64))
    kernel = explain(xd, qw).kernel
    print(f"\nmixgemm.matmul (W4A16 g128, {dtype}, kernel {kernel}) vs float64 reference: rel err {err:.2e}")
    wf = w.to(dtype)
    label = "fp16 cuBLAS" if cuda else "bfloat16 torch linear"
    times = time_rounds({"mixgemm": lambda: matmul(xd, qw), label: lambda: torch.nn.functional.linear(xd, wf)},
                        device, args.rounds)
    print(spread_line(times, "mixgemm", label))
    if not cuda:
        print("(CPU timings: PyTorch's CPU kernels, not mixgemm's GPU kernels; run `python -m mixgemm bench` on a CUDA "
              "GPU for the scoreboard)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
