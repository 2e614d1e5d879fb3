"""HQQ and GPTQ on the GPU (issue 111): their time on a 7B-shaped model and the kernels on their weights.

1. Kernels: QuantLinear layers holding HQQ weights (sym / zero_point / offset) and GPTQ weights (sym, and
   zero_point with act-order, Hessians from random correlated inputs) at a few layer shapes; every call at M = 1, 16,
   256 in fp16 and bf16 (on sm_90 also after compaction) must match mixgemm.reference.matmul on the same codes
   (relative error <= 2e-3 fp16, 1e-2 bf16, the tests' bounds).
2. HQQ: a Llama-2-7B-shaped model (--model; random fp16 weights built on the GPU): the optimizer alone over every
   Linear weight, round to nearest alone for comparison, and ``quantize_(model, W4A16(method="hqq"))`` end to end
   (limit: 60 s for the whole model).
3. GPTQ: ``quantize_(model, W4A16(method="gptq"), calibration=...)`` with --samples x --seqlen random token ids
   (128 x 2048) over --gptq-layers decoder layers (default: all of them; fewer: the per-layer time is printed and
   the whole model's time extrapolated from it, explicitly), with the phases' times (limit: 15 min).

    python3 -m tools.checks.hqq_gptq_gpu --out DIR [--smoke] [--model llama2-7b|llama3-8b] [--gptq-layers N]

--smoke: tiny sizes on whatever device there is (the CPU here), end to end. Writes DIR/hqq_gptq_gpu.json and
DIR/hqq_gptq_gpu.md; exits 1 when a check fails (kernel mismatch, a time over its limit on the full sizes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import mixgemm
from mixgemm.formats.weight import QuantConfig, quantize_weight
from mixgemm.nn.linear import QuantLinear
from mixgemm.quantize.gptq import GPTQParams, gptq_quantize_weight
from mixgemm.quantize.hqq import hqq_quantize_weight
from mixgemm.reference.matmul import matmul as ref_matmul

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}
HQQ_LIMIT_S, GPTQ_LIMIT_S = 60.0, 15 * 60.0
MODELS = {  # transformers LlamaConfig fields of the published models
    "llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096),
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0),
    "smoke": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, max_position_embeddings=256),
}


@dataclass(frozen=True)
class KernelCase:
    source: str  # "hqq" / "gptq" / "gptq act-order"
    mode: str
    n: int
    k: int


def kernel_cases(shapes: list[tuple[int, int]]) -> list[KernelCase]:
    out = []
    for n, k in shapes:
        out += [KernelCase("hqq", mode, n, k) for mode in ("sym", "zero_point", "offset")]
        out += [KernelCase("gptq", "sym", n, k), KernelCase("gptq act-order", "zero_point", n, k)]
    return out


def case_layer(case: KernelCase, device, seed: int = 0) -> QuantLinear:
    """A QuantLinear (bias included) of the case's method on a random weight [n, k] (group 128 when k allows, else
    32), quantized on ``device``."""
    g = torch.Generator(device=device).manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=g, device=device)
    w = randn(case.n, case.k) * 0.02
    cfg = QuantConfig(bits=4, group_size=128 if case.k % 128 == 0 else 32, mode=case.mode)
    perm = None
    if case.source == "hqq":
        qw = hqq_quantize_weight(w, cfg)
    else:
        x = randn(2 * case.k, case.k) @ (randn(case.k, case.k) / case.k**0.5)
        res = gptq_quantize_weight(w, 2 * x.T @ x, cfg, GPTQParams(act_order="act-order" in case.source))
        qw, perm = res.weight, res.perm
    bias = randn(case.n) * 0.1
    return QuantLinear.from_quantized(qw, bias, input_perm=perm)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    den = float(b.norm())
    return float((a - b).norm()) / den if den else float((a - b).norm())


@torch.no_grad()
def check_kernels(device, shapes, ms=(1, 16, 256), dtypes=(torch.float16, torch.bfloat16)) -> list[dict]:
    """Every case x M x dtype: the layer's output against the float64 reference on its codes (and, where the
    layer compacts, once more compacted). Rows with the relative error and whether it is within TOL."""
    rows = []
    for case in kernel_cases(shapes):
        layer = case_layer(case, device)
        qw = layer.quantized_weight()
        variants = [("plain", layer)]
        if device.type == "cuda" and layer.compact_reason() is None:
            compacted = case_layer(case, device)
            compacted.compact_()
            variants.append(("compact", compacted))
        for dtype in dtypes:
            for m in ms:
                x = torch.randn(m, case.k, generator=torch.Generator(device=device).manual_seed(m), device=device
                                ).to(dtype)
                xs = x if layer.input_perm is None else x[..., layer.input_perm]
                want = ref_matmul(xs, qw, layer.bias, out_dtype=torch.float64)
                for name, mod in variants:
                    y = mod(x)
                    err = rel_err(y, want)
                    rows.append({"source": case.source, "mode": case.mode, "n": case.n, "k": case.k, "m": m,
                                 "dtype": str(dtype).removeprefix("torch."), "layout": name, "rel_err": err,
                                 "ok": bool(y.dtype == dtype and err <= TOL[dtype])})
    return rows


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(name: str, layers: int | None, device, dtype):
    """A LlamaForCausalLM of the named shape with transformers' random initialization, built on ``device``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = dict(MODELS[name])
    if layers is not None:
        fields["num_hidden_layers"] = layers
    config = LlamaConfig(**fields)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def _linear_weights(model) -> list[torch.Tensor]:
    return [m.weight.detach() for m in model.modules() if type(m) is torch.nn.Linear]


def time_hqq(name: str, device, dtype) -> dict:
    out = {}
    t = time.perf_counter()
    model = build_model(name, None, device, dtype)
    _sync(device)
    out["build_s"] = time.perf_counter() - t
    weights = _linear_weights(model)
    out["linears"] = len(weights)
    out["weight_params"] = sum(w.numel() for w in weights)
    cfg = mixgemm.W4A16(group_size=128).weight_config()
    for what, fn in (("rtn_weights_s", quantize_weight), ("hqq_weights_s", hqq_quantize_weight)):
        _sync(device)
        t = time.perf_counter()
        for w in weights:
            fn(w, cfg)
        _sync(device)
        out[what] = time.perf_counter() - t
    del weights
    t = time.perf_counter()
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=128, method="hqq"))
    _sync(device)
    out["hqq_quantize_s"] = time.perf_counter() - t
    out["replaced"] = len(report.replaced)
    out["hqq_inputs"] = report.hqq_inputs
    del model
    return out


def time_gptq(name: str, layers: int | None, samples: int, seqlen: int, batch: int, device, dtype) -> dict:
    full = MODELS[name]["num_hidden_layers"]
    layers = full if layers is None else min(layers, full)
    out = {"layers_run": layers, "layers_full": full, "samples": samples, "seqlen": seqlen}
    t = time.perf_counter()
    model = build_model(name, layers, device, dtype)
    _sync(device)
    out["build_s"] = time.perf_counter() - t
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, MODELS[name]["vocab_size"], (samples, seqlen), generator=g)
    calibration = list(ids.split(batch))
    t = time.perf_counter()
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=128, method="gptq"), calibration=calibration)
    _sync(device)
    total = time.perf_counter() - t
    out["gptq_quantize_s"] = total
    out["phases_s"] = dict(report.seconds)
    out["replaced"] = len(report.replaced)
    # the blocks' phases scale with the layer count; the capture, the lm_head's pass and the bookkeeping do not
    per_block = [s for k, s in report.seconds.items() if k in ("hessians", "gptq", "propagate")]
    blocks_s = sum(per_block)
    out["per_layer_s"] = blocks_s / layers
    out["whole_model_estimate_s"] = total + out["per_layer_s"] * (full - layers)
    out["extrapolated"] = layers < full
    del model
    return out


def markdown(res: dict) -> str:
    lines = ["# HQQ / GPTQ on the GPU", "", f"device: {res['device']}, model: {res['model']}", ""]
    bad = [r for r in res["kernels"] if not r["ok"]]
    worst = max(res["kernels"], key=lambda r: r["rel_err"] / TOL[getattr(torch, r["dtype"])])
    lines += [f"kernels: {len(res['kernels'])} calls, {len(bad)} over tolerance; worst rel err {worst['rel_err']:.2e} "
              f"({worst['source']} {worst['mode']} {worst['n']}x{worst['k']} M={worst['m']} {worst['dtype']} "
              f"{worst['layout']})", ""]
    h = res["hqq"]
    lines += ["| HQQ phase | s |", "| --- | --- |", f"| build model | {h['build_s']:.1f} |",
              f"| round to nearest, {h['linears']} weights | {h['rtn_weights_s']:.2f} |",
              f"| HQQ optimizer, {h['linears']} weights | {h['hqq_weights_s']:.2f} |",
              f"| quantize_(W4A16(method='hqq')), whole model | {h['hqq_quantize_s']:.2f} (limit {HQQ_LIMIT_S:.0f}) |",
              "", f"HQQ's input weighting: {h.get('hqq_inputs', '')}", ""]
    q = res["gptq"]
    lines += ["| GPTQ phase | s |", "| --- | --- |", f"| build model ({q['layers_run']} layers) | {q['build_s']:.1f} |"]
    lines += [f"| {k} | {v:.2f} |" for k, v in q["phases_s"].items()]
    lines += [f"| quantize_ total ({q['layers_run']} layers, {q['samples']} x {q['seqlen']} tokens) | "
              f"{q['gptq_quantize_s']:.1f} |", f"| per decoder layer | {q['per_layer_s']:.2f} |",
              f"| whole model ({q['layers_full']} layers){' extrapolated' if q['extrapolated'] else ''} | "
              f"{q['whole_model_estimate_s']:.1f} (limit {GPTQ_LIMIT_S:.0f}) |"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, any device (the CPU): the script end to end")
    ap.add_argument("--model", default="llama2-7b", choices=[m for m in MODELS if m != "smoke"])
    ap.add_argument("--gptq-layers", type=int, default=None, help="decoder layers GPTQ runs (default: all)")
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8, help="calibration sequences per forward")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.smoke:
        name, shapes, dtype = "smoke", [(96, 256), (64, 384)], torch.float32
        samples, seqlen, batch = 4, 32, 2
        dtypes = (torch.float16, torch.bfloat16) if device.type == "cuda" else (torch.bfloat16, torch.float32)
    else:
        if device.type != "cuda":
            print("no CUDA device: run with --smoke on the CPU", file=sys.stderr)
            return 2
        name, shapes, dtype = args.model, [(4096, 4096), (11008, 4096), (4096, 11008)], torch.float16
        samples, seqlen, batch = args.samples, args.seqlen, args.batch
        dtypes = (torch.float16, torch.bfloat16)
    res = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "model": name,
           "smoke": args.smoke}
    t = time.perf_counter()
    res["kernels"] = check_kernels(device, shapes, dtypes=dtypes)
    bad = [r for r in res["kernels"] if not r["ok"]]
    print(f"kernels: {len(res['kernels'])} calls checked in {time.perf_counter() - t:.1f} s, {len(bad)} failed "
          f"{bad[:3]}", flush=True)
    (out / "hqq_gptq_gpu.json").write_text(json.dumps(res, indent=1))  # each part kept as it ends
    res["hqq"] = time_hqq(name, device, dtype)
    print(f"hqq: {res['hqq']}", flush=True)
    (out / "hqq_gptq_gpu.json").write_text(json.dumps(res, indent=1))
    res["gptq"] = time_gptq(name, args.gptq_layers, samples, seqlen, batch, device, dtype)
    print(f"gptq: {res['gptq']}", flush=True)
    (out / "hqq_gptq_gpu.json").write_text(json.dumps(res, indent=1))
    md = markdown(res)
    (out / "hqq_gptq_gpu.md").write_text(md)
    print(md)
    ok = all(r["ok"] for r in res["kernels"])
    if not args.smoke:
        ok = ok and res["hqq"]["hqq_quantize_s"] <= HQQ_LIMIT_S
        ok = ok and res["gptq"]["whole_model_estimate_s"] <= GPTQ_LIMIT_S
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
