"""GPU check of the benchmarks' kernel choices (tools/bench/kernel_choice.py, tools/bench/int8.py): each forced kernel
and config the ported tools pass through mixgemm.kernel_options reaches the kernel (the NVRTC macros it is compiled
with are recorded) and gives the reference's result. Small shapes, well under a minute on an H100.

    PYTHONPATH=src python -m tools.checks.kernel_options_gpu --out DIR

Prints a table, writes DIR/kernel_options_gpu.json, exits non-zero on a failed check."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

import mixgemm
import mixgemm.reference as ref
from mixgemm.kernels.cuda import gemv_direct, nvrtc
from mixgemm.kernels.registry import NoKernel
from mixgemm.ops.int8 import a8_choice
from tools.bench.int8 import a8_runner, check, w8_cuda_options
from tools.bench.kernel_choice import entry_config, gemv_options

INF = math.inf
DEV = torch.device("cuda")
COMPILED: list[dict] = []  # the macros of every get_function call, in order


def _record(get_function):
    def wrapped(source, kernel, defines, device, *a, **kw):
        COMPILED.append(dict(defines))
        return get_function(source, kernel, defines, device, *a, **kw)

    return wrapped


def weight(n, k, bits, group, mode="sym"):
    return mixgemm.quantize_weight(torch.randn(n, k, device=DEV) * 0.02, bits=bits, group_size=group, mode=mode)


def rel(y, r) -> float:
    return float((y.double() - r).norm() / r.norm())


def gemv_case(kind, cfg, macros, m=1):
    qw = weight(4096, 4096, 4, 128, "zero_point")
    x = torch.randn(m, 4096, device=DEV, dtype=torch.float16)
    COMPILED.clear()
    with gemv_options(kind, cfg):
        y = gemv_direct.gemv(x, qw, None, -INF, INF)
    got = {key: COMPILED[-1].get(key) for key in macros}
    err = rel(y, ref.matmul(x, qw, out_dtype=torch.float64))
    return dict(ok=got == macros and err < 1e-2, macros=got, want=macros, err=err)


def gemv_a8_case():
    qw = weight(4096, 4096, 4, 128)
    x = torch.randn(4, 4096, device=DEV, dtype=torch.float16)
    cfg = {"R": 2, "KS": 1, "NW": 8, "PF": 0, "GRID": "tiles"}
    COMPILED.clear()
    run = a8_runner(x, qw, "sym", {"force": "cuda_gemv_a8", "configs": {"cuda_gemv_a8": cfg}})
    y = run()
    got = {key: COMPILED[-1].get(key) for key in ("A8_R", "A8_KS", "A8_RG", "A8_M")}
    want = {"A8_R": 2, "A8_KS": 1, "A8_RG": 8, "A8_M": 4}
    err = check(x, qw, "sym", y)
    return dict(ok=got == want and err < 1e-2, macros=got, want=want, err=err)


def gemv_a8_cannot_case():
    """M = 8, K = 28672: more shared memory than a block has; the tool falls back on NoKernel or ValueError."""
    qw = weight(256, 28672, 4, 128)
    x = torch.randn(8, 28672, device=DEV, dtype=torch.float16)
    try:
        a8_runner(x, qw, "sym", {"force": "cuda_gemv_a8"})()
    except (NoKernel, ValueError) as e:
        return dict(ok=True, raised=f"{type(e).__name__}: {str(e)[:120]}")
    return dict(ok=False, raised=None)


def w8_cuda_case():
    qw = weight(4096, 4096, 8, -1)
    m = 2048
    x = torch.randn(m, 4096, device=DEV, dtype=torch.float16)
    default = a8_choice(m, qw, x.dtype, x.device, "sym", True).kernel
    opts = w8_cuda_options(8, -1, m)
    with mixgemm.kernel_options(**opts):
        forced = a8_choice(m, qw, x.dtype, x.device, "sym", True).kernel
    err = check(x, qw, "sym", a8_runner(x, qw, "sym", opts)(), act_block=4096)
    return dict(ok=forced == "cuda_wgmma_a8" and err < 1e-2, default=default, forced=forced, err=err)


def entry_config_case(entry, kernel_fn):
    qw = weight(4096, 4096, 4, 128)
    x = torch.randn(4, 4096, device=DEV, dtype=torch.float16)
    cfg = entry_config(x, qw, entry)
    err = rel(kernel_fn(x, qw, cfg), ref.matmul(x, qw, out_dtype=torch.float64))
    return dict(ok=isinstance(cfg, dict) and err < 1e-2, config=cfg, err=err)


def conv_case():
    from mixgemm.ops.conv import conv_choice

    qc = mixgemm.QuantConfig(bits=8, group_size=-1, mode="sym")
    qw = mixgemm.quantize_conv_weight(torch.randn(64, 64, 3, 3, device=DEV) * 0.05, qc)
    x = torch.randn(1, 64, 28, 28, device=DEV, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    default = conv_choice(x, qw, 28 * 28, (1, 1), (1, 1), 1).kernel
    with mixgemm.kernel_options(disable="cuda_conv_wgmma"):
        without = conv_choice(x, qw, 28 * 28, (1, 1), (1, 1), 1).kernel
    return dict(ok=without != "cuda_conv_wgmma", default=default, without_wgmma=without)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    nvrtc.get_function = _record(nvrtc.get_function)
    from mixgemm.kernels.cuda_wgmma.gemm_wgmma import gemm_wgmma
    from mixgemm.kernels.triton_gemm.gemm import gemm

    cases = {
        "gemv simt R2 U1 KS4": lambda: gemv_case("simt", {"R": 2, "U": 1, "KS": 4},
                                                 {"GEMV_R": 2, "GEMV_U": 1, "GEMV_KS": 4, "GEMV_RG": 2}),
        "gemv mma U1 KS4 (fp16 M=1)": lambda: gemv_case("mma", {"U": 1, "KS": 4},
                                                        {"MMA_U": 1, "MMA_KS": 4, "MMA_RG": 2}),
        "gemv_a8 forced M=4 GRID tiles": gemv_a8_case,
        "gemv_a8 forced, cannot run": gemv_a8_cannot_case,
        "--w8-cuda W8 pc M=2048": w8_cuda_case,
        "entry_config triton_gemm": lambda: entry_config_case(
            "triton_gemm", lambda x, q, c: gemm(x, q, None, -INF, INF, c)),
        "entry_config cuda_wgmma": lambda: entry_config_case(
            "cuda_wgmma", lambda x, q, c: gemm_wgmma(x, q, None, -INF, INF, c, fit=True)),
        "conv no-wgmma": conv_case,
    }
    results, failed = {}, []
    for name, fn in cases.items():
        try:
            results[name] = fn()
        except Exception as e:  # noqa: BLE001 - reported as a failure
            results[name] = dict(ok=False, error=f"{type(e).__name__}: {str(e)[:200]}")
        if not results[name]["ok"]:
            failed.append(name)
    with open(os.path.join(a.out, "kernel_options_gpu.json"), "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), results=results), f, indent=1, default=str)
    width = max(len(n) for n in results)
    for name, r in results.items():
        detail = {k: v for k, v in r.items() if k != "ok"}
        print(f"{name:<{width}}  {'ok  ' if r['ok'] else 'FAIL'}  {detail}")
    print("FAILED: " + ", ".join(failed) if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
