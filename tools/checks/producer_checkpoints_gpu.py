"""GPU check of producer-made checkpoints and of quantize-on-load (issue 112).

1. w8a8: tests/fixtures/producers/llmcompressor-w8a8 (llm-compressor's W8A8: int8 channel weights, dynamic
   per-token int8 activations) loaded with mixgemm.from_pretrained on the GPU in fp16. Every QuantLinear is
   W8A8 per token; the kernel each runs (mixgemm.explain, at M = 1 and M = 12) must be an int8-activation kernel
   (``a8`` in its name), and the CUDA kernels a forward launches (torch.profiler) are listed. Each layer's output, on
   the input it received in the model (prefill and decode), against mixgemm.reference.matmul of that input quantized
   per token and the same weight codes in float64, within the kernel tests' fp16 bound; greedy tokens against the
   dequantized twin (the same model with every QuantLinear an fp32 nn.Linear of its dequantized weight that takes
   its input through the layer's per-token int8 quantizer, "sym_full", on the CPU in float32), and its logits'
   distance reported.
2. load: a random-weight Llama-2-7B-shaped fp16 safetensors checkpoint (``--layers`` of 32, default all) written to
   ``--ckpt-dir``; then, each in a fresh subprocess, transformers' own float load (device_map="cuda", fp16) and
   mixgemm.from_pretrained(..., device="cuda", quantization_config=W4A16 g128), each twice (the page cache warm
   for both): seconds, torch.cuda.max_memory_allocated, the loaded model's bytes. Bars: mixgemm's best time
   <= 1.2x transformers' best; mixgemm's peak <= its loaded model's bytes + the largest float Linear weight.

Writes producer_checkpoints_gpu.json and .md into --out, prints a table, exits non-zero when a check fails.

    python3 -m tools.checks.producer_checkpoints_gpu --out DIR [--layers 32] [--ckpt-dir /tmp/mixgemm-7b-shape]
    python3 -m tools.checks.producer_checkpoints_gpu --out DIR --smoke    (CPU, tiny shapes: the logic only)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "src"))  # this tree's mixgemm, installed or not
W8A8_FIXTURE = os.path.join(ROOT, "tests", "fixtures", "producers", "llmcompressor-w8a8")
LLAMA2_7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=32, vocab_size=32000)
TINY = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, vocab_size=512)
TIME_RATIO_BAR = 1.2


def _dequantized_twin(model: nn.Module) -> nn.Module:
    """fp32 CPU copy of ``model`` whose QuantLinears are nn.Linear of their dequantized weights, each taking its input
    through the layer's per-token int8 quantizer (its act_mode) when the layer quantizes activations."""
    from mixgemm.formats.activation import quantize_activation
    from mixgemm.nn.linear import QuantLinear

    twin = copy.deepcopy(model).to("cpu")
    for name, ql in [(n, m) for n, m in twin.named_modules() if isinstance(m, QuantLinear)]:
        lin = nn.Linear(ql.in_features, ql.out_features, bias=ql.bias is not None)
        lin.weight.data = ql.dequantize(torch.float32)
        if ql.bias is not None:
            lin.bias.data = ql.bias.float()
        if ql.act_mode is not None:
            mode = ql.act_mode

            def hook(_, args, mode=mode):
                x = args[0]
                flat = x.reshape(-1, x.shape[-1])
                return (quantize_activation(flat, -1, mode).dequantize().to(x.dtype).reshape(x.shape),)

            lin.register_forward_pre_hook(hook)
        parent, _, attr = name.rpartition(".")
        setattr(twin.get_submodule(parent) if parent else twin, attr, lin)
    return twin.float().eval()


LAYER_TOL = {torch.float16: 2e-3, torch.float32: 1e-5}  # the kernel tests' bounds


def _layers_against_reference(model: nn.Module, qls: dict, ids: torch.Tensor) -> tuple[float, str]:
    """Every QuantLinear's output in a forward of ``ids`` (M = 12) and of its first token (M = 1) against
    mixgemm.reference.matmul of the same input quantized per token (the codes the kernels compute) and the same
    weight codes, in float64: (worst max |diff| / max |reference|, its layer and M)."""
    from mixgemm.formats.activation import quantize_activation
    from mixgemm.reference.matmul import matmul as ref_matmul

    seen = []
    hooks = [ql.register_forward_hook(lambda mod, args, out, n=n: seen.append((n, args[0].detach(), out.detach())))
             for n, ql in qls.items()]
    try:
        with torch.no_grad():
            model(ids)
            model(ids[:, :1])
    finally:
        for h in hooks:
            h.remove()
    worst, where = 0.0, ""
    for n, x, y in seen:
        ql = qls[n]
        flat = x.reshape(-1, x.shape[-1])
        xq = quantize_activation(flat, -1, ql.act_mode).dequantize().double()
        ref = ref_matmul(xq.cpu(), ql.quantized_weight().to("cpu"), None if ql.bias is None else ql.bias.cpu(),
                         out_dtype=torch.float64)
        rel = float((y.reshape(ref.shape).double().cpu() - ref).abs().max() / ref.abs().max().clamp(min=1e-30))
        if rel >= worst:
            worst, where = rel, f"{n} M={flat.shape[0]}"
    return worst, where


def check_w8a8(device: str, rows: list[dict]) -> None:
    import mixgemm
    from mixgemm.nn.linear import QuantLinear

    dtype = torch.float16 if device == "cuda" else torch.float32
    model = mixgemm.from_pretrained(W8A8_FIXTURE, device=device, dtype=dtype, progress=False)
    qls = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    kernels = {}
    for n, ql in qls.items():
        for m in (1, 12):
            x = torch.randn(m, ql.in_features, device=device, dtype=dtype)
            kernels[f"{n} M={m}"] = mixgemm.explain(x, ql.quantized_weight(), ql.act_mode, ql.act_block).entry.name
    formats = {(ql.act_mode, ql.act_block, ql.config.bits) for ql in qls.values()}
    not_a8 = {k: v for k, v in kernels.items() if "a8" not in v}
    ok_fmt = formats == {("sym_full", "token", 8)} and len(qls) == 14
    rows.append(dict(part="w8a8", what="14 QuantLinear, W8A8 per token", value=str(sorted(formats)), ok=ok_fmt))
    rows.append(dict(part="w8a8", what="explain: every layer an int8-activation kernel",
                     value=", ".join(sorted(set(kernels.values()))),
                     ok=(not not_a8) if device == "cuda" else None, detail=not_a8 or None))

    ids = torch.tensor([[1, 17, 200, 45, 3, 99, 128, 7, 250, 31, 64, 5]], device=device)
    launched = []
    with torch.no_grad():
        if device == "cuda":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                got = model(ids).logits
                torch.cuda.synchronize()
            launched = sorted({e.key for e in prof.key_averages() if e.device_type.name == "CUDA"})
        else:
            got = model(ids).logits
        twin = _dequantized_twin(model)
        want = twin(ids.cpu()).logits
        a = model.generate(ids, max_new_tokens=8, do_sample=False).cpu()
        b = twin.generate(ids.cpu(), max_new_tokens=8, do_sample=False)
    err = float((got.float().cpu() - want).abs().max() / want.abs().max())
    rows.append(dict(part="w8a8", what="CUDA kernels of one forward", value=f"{len(launched)} kinds",
                     ok=None, detail=launched))
    worst, where = _layers_against_reference(model, qls, ids)
    rows.append(dict(part="w8a8", what="each layer's output vs float64 reference on its own input and codes, "
                     "prefill (M = 12) and decode (M = 1): max abs diff / max abs output", value=f"{worst:.2e} "
                     f"({where})", ok=worst <= LAYER_TOL[dtype]))
    # informational: the twin's fp32 activations and the model's fp16 ones put a few tokens' int8 codes one code
    # apart (one step: absmax / 127.5 of a token), and the differences grow through the layers
    rows.append(dict(part="w8a8", what="logits vs fp32 dequantized twin (max abs diff / max abs logit)",
                     value=f"{err:.4f}", ok=None))
    rows.append(dict(part="w8a8", what="greedy 8 tokens equal", value=str(torch.equal(a, b)), ok=torch.equal(a, b)))


def write_checkpoint(directory: str, shape: dict, layers: int, device: str) -> dict:
    """A random fp16 Llama checkpoint (config.json + safetensors shards of a few layers each + index)."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    os.makedirs(directory, exist_ok=True)
    config = LlamaConfig(**{**shape, "num_hidden_layers": layers}, torch_dtype="float16",
                         tie_word_embeddings=False)
    config.save_pretrained(directory)
    h, i, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    kv = h * shape["num_key_value_heads"] // shape["num_attention_heads"]
    gen = torch.Generator(device).manual_seed(0)

    def rnd(*s):
        return (torch.randn(*s, device=device, generator=gen, dtype=torch.float16) * 0.02).cpu()

    weight_map, shard = {}, {}
    names = []

    def flush():
        nonlocal shard
        if shard:
            name = f"model-{len(names) + 1:05d}.safetensors"
            save_file(shard, os.path.join(directory, name), metadata={"format": "pt"})
            names.append(name)
            weight_map.update(dict.fromkeys(shard, name))
            shard = {}

    shard["model.embed_tokens.weight"] = rnd(v, h)
    for li in range(layers):
        p = f"model.layers.{li}."
        shard.update({p + "self_attn.q_proj.weight": rnd(h, h), p + "self_attn.k_proj.weight": rnd(kv, h),
                      p + "self_attn.v_proj.weight": rnd(kv, h), p + "self_attn.o_proj.weight": rnd(h, h),
                      p + "mlp.gate_proj.weight": rnd(i, h), p + "mlp.up_proj.weight": rnd(i, h),
                      p + "mlp.down_proj.weight": rnd(h, i),
                      p + "input_layernorm.weight": torch.ones(h, dtype=torch.float16),
                      p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.float16)})
        if li % 4 == 3:
            flush()
    shard["model.norm.weight"] = torch.ones(h, dtype=torch.float16)
    shard["lm_head.weight"] = rnd(v, h)
    flush()
    total = sum(os.path.getsize(os.path.join(directory, n)) for n in names)
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return dict(bytes=total, largest_linear_bytes=2 * max(v * h, i * h))


def _phase_timeline(cuda: bool) -> list[dict]:
    """Wraps from_pretrained's phases (mixgemm.checkpoints.loader's steps, each synchronized) so that the load
    records [{phase, seconds, allocated, peak}] in order: where the time and the peak memory of a load go."""
    import mixgemm.quantize_api as api
    from mixgemm.checkpoints import loader, skeleton

    timeline: list[dict] = []

    def wrap(owner, name):
        fn = getattr(owner, name)

        def timed(*a, **k):
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = fn(*a, **k)
            if cuda:
                torch.cuda.synchronize()
            timeline.append(dict(phase=name, seconds=round(time.perf_counter() - t, 3),
                                 allocated=torch.cuda.memory_allocated() if cuda else 0,
                                 peak=torch.cuda.max_memory_allocated() if cuda else 0))
            return out

        setattr(owner, name, timed)

    for owner, name in ((skeleton, "build"), (loader, "_quantize_on_load"), (loader, "_quantize_experts_on_load"),
                        (loader, "_fill_rest"), (skeleton, "finish"), (loader, "arrange_act_order"),
                        (loader, "norm_kernels_at_norms"), (api, "auto_compact_"), (loader, "join_siblings"),
                        (loader, "join_experts"), (loader._SliceCopier, "_run")):
        wrap(owner, name)
    return timeline


def load_child(which: str, ckpt: str, device: str) -> dict:
    """One load in this process: seconds, peak and final allocated GPU bytes (run in a fresh subprocess); for
    mixgemm also the timeline of its phases (_phase_timeline)."""
    from transformers import AutoModelForCausalLM

    import mixgemm

    cuda = device == "cuda"
    if cuda:
        torch.zeros(1, device=device)  # the CUDA context outside the timing
        torch.cuda.reset_peak_memory_stats()
    timeline = _phase_timeline(cuda) if which == "mixgemm" else None
    t0 = time.perf_counter()
    if which == "transformers":
        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float16, device_map=device)
    else:
        model = mixgemm.from_pretrained(ckpt, device=device, dtype=torch.float16, progress=False,
                                        quantization_config=mixgemm.W4A16(group_size=128))
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    out = dict(which=which, seconds=seconds,
               model_bytes=sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]),
               timeline=timeline)
    if cuda:
        out.update(peak=torch.cuda.max_memory_allocated(), allocated=torch.cuda.memory_allocated())
    return out


def check_load(args, device: str, rows: list[dict]) -> None:
    shape = TINY if args.smoke else LLAMA2_7B
    layers = shape["num_hidden_layers"] if args.layers is None else args.layers
    t0 = time.perf_counter()
    ck = write_checkpoint(args.ckpt_dir, shape, layers, device)
    rows.append(dict(part="load", what=f"checkpoint written ({layers} of {shape['num_hidden_layers']} layers)",
                     value=f"{ck['bytes'] / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s", ok=None))
    results = []
    for which in ("transformers", "mixgemm", "transformers", "mixgemm"):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "src"), ROOT,
                                                            os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, "-m", "tools.checks.producer_checkpoints_gpu", "--load-child", which,
                               "--ckpt-dir", args.ckpt_dir, "--device", device, "--out", args.out],
                              capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
        if proc.returncode:
            rows.append(dict(part="load", what=f"{which} load", value="failed", ok=False,
                             detail=proc.stderr[-3000:]))
            return
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(r)
        rows.append(dict(part="load", what=f"{which} load", value=f"{r['seconds']:.2f} s, peak "
                         f"{r.get('peak', 0) / 2**30:.2f} GiB, model {r['model_bytes'] / 2**30:.2f} GiB", ok=None,
                         detail=r["timeline"]))
    best = {w: min(r["seconds"] for r in results if r["which"] == w) for w in ("transformers", "mixgemm")}
    ratio = best["mixgemm"] / best["transformers"]
    rows.append(dict(part="load", what=f"mixgemm / transformers best time (bar {TIME_RATIO_BAR})",
                     value=f"{ratio:.2f}", ok=(ratio <= TIME_RATIO_BAR) if device == "cuda" else None))
    if device == "cuda":
        mg = [r for r in results if r["which"] == "mixgemm"]
        peak = max(r["peak"] for r in mg)
        bar = mg[-1]["allocated"] + ck["largest_linear_bytes"]
        rows.append(dict(part="load", what="mixgemm peak <= loaded model + largest float Linear",
                         value=f"{peak / 2**30:.2f} GiB vs {bar / 2**30:.2f} GiB", ok=peak <= bar))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers of the 7B shape written (default 32)")
    ap.add_argument("--ckpt-dir", default="/tmp/mixgemm-7b-shape")
    ap.add_argument("--parts", default="w8a8,load")
    ap.add_argument("--device", default=None)
    ap.add_argument("--load-child", choices=["transformers", "mixgemm"], default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    device = args.device or ("cpu" if args.smoke else "cuda")
    if args.load_child:
        print(json.dumps(load_child(args.load_child, args.ckpt_dir, device)))
        return 0
    os.makedirs(args.out, exist_ok=True)
    rows: list[dict] = []
    for part, fn in (("w8a8", lambda: check_w8a8(device, rows)), ("load", lambda: check_load(args, device, rows))):
        if part in args.parts.split(","):
            try:
                fn()
            except Exception as e:  # the other part still runs; the failure is a row
                import traceback

                rows.append(dict(part=part, what="raised", value=f"{type(e).__name__}: {e}"[:300], ok=False,
                                 detail=traceback.format_exc()[-3000:]))
    env = dict(torch=torch.__version__, device=torch.cuda.get_device_name() if device == "cuda" else "cpu")
    with open(os.path.join(args.out, "producer_checkpoints_gpu.json"), "w") as f:
        json.dump(dict(env=env, rows=rows), f, indent=1)
    lines = ["| part | check | value | ok |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['part']} | {r['what']} | {r['value']} | {'' if r['ok'] is None else r['ok']} |" for r in rows]
    with open(os.path.join(args.out, "producer_checkpoints_gpu.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(json.dumps(env))
    print("\n".join(lines))
    for r in rows:
        if r["part"] == "load" and r.get("detail") and isinstance(r["detail"], list):
            print(f"--- {r['what']} phases: " + "; ".join(
                f"{p['phase']} {p['seconds']} s ({p['allocated'] / 2**30:.2f} / peak {p['peak'] / 2**30:.2f} GiB)"
                for p in r["detail"]))
        if r["ok"] is False and r.get("detail"):
            print(f"--- {r['part']} {r['what']}:\n{r['detail']}")
    return 1 if any(r["ok"] is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
