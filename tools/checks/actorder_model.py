"""Act-order at model level: a GPTQ act-order model as mixgemm.from_pretrained leaves it decodes as fast as the same
model without act-order (target: within 3%), batch 1, eager ``model.generate()`` and compiled with CUDA graphs.

Per model (--models, mixgemm.integrations.hf shapes, random fp16 weights): quantize_ with W4A16 g128 zero-point,
time it ("plain"), then give every QuantLinear an input permutation as GPTQ's desc_act does (a random g_idx per
input tensor: q / k / v share one, gate / up share one, o and down each their own; the same stored codes, scales and
zeros, so the arithmetic per layer is unchanged; lm_head, which GPTQ checkpoints keep float, stays plain), in deep
copies made before any call:
* "act-order, in-kernel": every layer gathers x in its kernel (no folds);
* "act-order, folded only": down's permutation folded into gate / up's rows (mixgemm.nn.fold_perm), the
  other layers gathering in their kernels;
* "act-order, as loaded": as mixgemm.from_pretrained leaves it (mixgemm.nn.norms.arrange_act_order):
  folded, and q / k / v's and gate / up's shared permutation applied once by the norm that feeds them under
  torch.compile (in eager mode they gather in their kernels); o keeps its own gather;
* on request, "plain, inductor norms": the plain model with its norms left to inductor
  (mixgemm.nn.norms.use_inductor_norms), where every other variant's norms feeding mixgemm layers run
  mixgemm's norm kernel (kernels/cuda/rms_norm.cu) under torch.compile.

Modes: "generate" (``model.generate`` with its default cache, eager; host-bound, so the models take turns,
--repeats rounds, median) and "compiled" (mixgemm.bench.e2e.decode_tokens_per_s: the decode step under
torch.compile(fullgraph=True, mode="reduce-overhead") over a static cache), the same timing as
tools.checks.generate_e2e. Checks (exit 1): the folded models' logits for one token (M = 1: the GEMVs) equal the
in-kernel model's bit for bit (the folds change where numbers sit, not the arithmetic;
the prompt's logits, through GEMMs whose split-K tiles add with atomics, are reported), and with --strict,
as-loaded tokens/s >= (1 - --tolerance) x plain in every mode (the other variants' ratios are reported).

    PYTHONPATH=src python -m tools.checks.actorder_model --out DIR [--models llama3-8b] [--modes generate,compiled]
    PYTHONPATH=src python -m tools.checks.actorder_model --out DIR --device cpu --tiny     (the logic, tiny shapes)

Prints a table, writes DIR/actorder_model.json (rewritten after every measurement).
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import json
import pstats
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch

import mixgemm
from mixgemm.checkpoints.packed_int32 import act_order_perm
from mixgemm.nn.fold_perm import fold_mlp_input_perms
from mixgemm.nn.linear import QuantLinear
from mixgemm.nn.norms import arrange_act_order, use_inductor_norms
from tools.checks.generate_e2e import (
    TINY_NAMES,
    Settings,
    build,
    free_memory,
    generate_once,
    last_logits,
    prompt,
    run_mode,
    settings_from,
)

MODES = ("generate", "compiled")
GROUP = 128
# Layers that read the same tensor get the same GPTQ act-order permutation (the same Hessian of their inputs)
SHARED_INPUT = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "gate_proj": "mlp", "up_proj": "mlp"}
VARIANTS = ("plain", "act-order, in-kernel", "act-order, folded only", "act-order, as loaded")
# beside them on request (--variants "inductor norms"): the plain model with its norms compiled by inductor instead of
# mixgemm's norm kernel (mixgemm.nn.norms.use_inductor_norms), what both models ran before that kernel
INDUCTOR_NORMS = "plain, inductor norms"


def add_act_order(model, seed: int) -> int:
    """Give every QuantLinear of ``model`` but lm_head a GPTQ-style input permutation in place (module docstring);
    returns how many layers changed."""
    gen = torch.Generator().manual_seed(seed)
    perms: dict[tuple[str, str], torch.Tensor] = {}
    changed = 0
    for name, layer in list(model.named_modules()):
        if not isinstance(layer, QuantLinear) or name.endswith("lm_head"):
            continue  # (GPTQ checkpoints keep lm_head float: here it stays the plain quantized layer in every variant)
        parent_name, _, child = name.rpartition(".")
        key = (parent_name.rpartition(".")[0], SHARED_INPUT[child]) if child in SHARED_INPUT else (name, "")
        if key not in perms:
            k = layer.in_features
            g_idx = torch.randperm(k, generator=gen) // GROUP  # desc_act: each group's features scattered over K
            perm = act_order_perm(g_idx, GROUP, f"{name}.g_idx")  # as the GPTQ converter makes it
            if perm is None:  # (one group: --tiny) any order is an act-order permutation
                perm = torch.randperm(k, generator=gen)
            perms[key] = perm.to(layer.qweight.device)
        bias = None if layer.bias is None else layer.bias.detach()
        ordered = QuantLinear.from_quantized(layer.quantized_weight(), bias, input_perm=perms[key])
        setattr(model.get_submodule(parent_name), child, ordered)
        changed += 1
    return changed


def variants(name: str, s: Settings, log, chosen=VARIANTS) -> dict:
    """The models of the ``chosen`` VARIANTS ("plain" always): one quantize_'d model and deep copies of it made
    before any call (no kernel layout or plan is cached yet), each then turned into its variant."""
    model = build(name, s)
    report = mixgemm.quantize_(model, mixgemm.W4A16(group_size=GROUP, mode="zero_point"))
    if report.skipped:
        raise RuntimeError(f"quantize_ left layers unquantized: {report.skipped}")
    free_memory(s)
    models = {"plain": model}
    if INDUCTOR_NORMS in chosen:
        models[INDUCTOR_NORMS] = copy.deepcopy(model)
        use_inductor_norms(models[INDUCTOR_NORMS])
    for variant in VARIANTS[1:]:
        if variant in chosen:
            m = models[variant] = copy.deepcopy(model)
            add_act_order(m, s.seed + 3)  # the same permutations in every act-order copy
    folded, at_norm = [], []
    if VARIANTS[2] in models:
        folded = fold_mlp_input_perms(models[VARIANTS[2]])
    if VARIANTS[3] in models:
        folded, at_norm = arrange_act_order(models[VARIANTS[3]])
    log(f"{name}: folded {len(folded)} down projections, {len(at_norm)} layers fed gathered by their norm")
    return models


def eager_profile(model, ids, s: Settings, top: int) -> str:
    """cProfile of one eager generate call, the ``top`` functions by own time."""
    prof = cProfile.Profile()
    prof.enable()
    generate_once(model, ids, s, static=False)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def measure(res: dict, name: str, modes, s: Settings, log, profile_top: int, chosen=VARIANTS):
    models = variants(name, s, log, chosen)
    res["variants"] = {v: {} for v in (*VARIANTS, INDUCTOR_NORMS) if v in VARIANTS or v in models}
    ids = prompt(models["plain"], s)
    logits = {v: (last_logits(m, ids[:, :1]), last_logits(m, ids)) for v, m in models.items()}
    act_order = [v for v in VARIANTS[1:] if v in models]
    if len(act_order) > 1:
        a1, a = logits[act_order[0]]
        # M = 1: the GEMVs, the same arithmetic on the same numbers; the prompt (M = prompt_len): the GEMMs, whose
        # split-K tiles add partial sums with atomics in any order
        res["m1_logits_equal"] = all(bool(torch.equal(a1, logits[v][0])) for v in act_order[1:])
        res["prompt_logits_max_rel"] = max(float((a - logits[v][1]).abs().max() / a.abs().max().clamp_min(1e-30))
                                           for v in act_order[1:])
    for mode in modes:  # generate: the models in turns (generate_e2e.time_generate); compiled: one after the other
        try:
            r = run_mode(mode, models, ids, s)
        except Exception:  # one failing mode leaves the other to run
            res.setdefault("errors", {})[mode] = err = traceback.format_exc()
            log(f"{name} {mode}: ERROR\n{err}")
            free_memory(s)
            continue
        for v in models:
            res["variants"][v][mode] = r[v]
            # each round's seconds (generate) or tokens/s (compiled)
            runs = next((f" (runs {[round(t, 3) for t in r[v][key]]})" for key in ("runs_s", "runs_tokens_per_s")
                         if key in r[v]), "")
            log(f"{name} {v:22s} {mode:9s}: {r[v]['tokens_per_s']:8.1f} tok/s{runs}")
        if any("kernels" in r[v] for v in models):
            log(f"{name} {mode}: GPU kernels per decode step\n{kernel_table(r)}")
    if profile_top and "generate" in modes:
        res["eager_profile"] = {v: eager_profile(m, ids, s, profile_top) for v, m in models.items()}
        for v, text in res["eager_profile"].items():
            log(f"--- eager profile, {v}\n{text}")
    del models
    free_memory(s)


def kernel_table(r: dict, top: int = 16) -> str:
    """Each variant's GPU time per step by kernel (the ``top`` kernels of any variant), and the total."""
    names: list[str] = []
    shown = [v for v in (*VARIANTS, INDUCTOR_NORMS) if v in r]
    for v in shown:
        names += [k["name"] for k in r[v].get("kernels", [])[:top] if k["name"] not in names]
    per = {v: {k["name"]: k for k in r[v].get("kernels", [])} for v in shown}
    lines = [f"{'kernel':60s} " + " ".join(f"{v[-12:]:>20s}" for v in shown)]
    for n in names:
        cells = [per[v].get(n) for v in shown]
        lines.append(f"{n[:60]:60s} " + " ".join(
            f"{c['us_per_step']:9.1f} us x{c['calls_per_step']:5.0f}" if c else f"{'-':>20s}" for c in cells))
    lines.append(f"{'total GPU time per step':60s} " + " ".join(
        f"{r[v].get('gpu_us_per_step', float('nan')):9.1f} us{'':7s}" for v in shown))
    return "\n".join(lines)


def table(results: dict, tolerance: float) -> tuple[str, list[str]]:
    lines = ["| model | mode | plain tok/s | in-kernel | folded only | as loaded | folded only / plain | as loaded / "
             "plain | target |", "|---|---|---|---|---|---|---|---|---|"]
    misses = []

    def tps(x):
        return x["tokens_per_s"] if x else float("nan")

    norms = ["", "| model | mode | plain, inductor's norms tok/s | plain (mixgemm's norm kernel) | ratio |",
             "|---|---|---|---|---|"]
    for r in results["models"]:
        v = r.get("variants", {})
        for mode in results["settings"]["modes"]:
            p, k, g, a = (v.get(x, {}).get(mode) for x in VARIANTS)
            i = v.get(INDUCTOR_NORMS, {}).get(mode)
            if p and i:
                norms.append(f"| {r['model']} | {mode} | {tps(i):.1f} | {tps(p):.1f} | {tps(p) / tps(i):.3f} |")
            if not (p and (a or g)):
                continue
            ratio = tps(a) / p["tokens_per_s"]
            ok = ratio >= 1 - tolerance
            if a and not ok:  # (the target is as loaded's: no verdict when --variants left it out)
                misses.append(f"{r['model']} {mode}: as loaded x{ratio:.3f} of plain < {1 - tolerance:.2f}")
            verdict = ("ok" if ok else "MISS") if a else "not built"
            lines.append(f"| {r['model']} | {mode} | {p['tokens_per_s']:.1f} | {tps(k):.1f} | {tps(g):.1f} | "
                         f"{tps(a):.1f} | {tps(g) / p['tokens_per_s']:.3f} | {ratio:.3f} | "
                         f">= {1 - tolerance:.2f} {verdict} |")
    return "\n".join(lines + (norms if len(norms) > 3 else [])), misses


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="llama3-8b", help=f"comma list of {sorted(TINY_NAMES)}")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {MODES}")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="timed generate calls per mode (median)")
    ap.add_argument("--warmup", type=int, default=8, help="compiled decode steps before timing")
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="tiny configs of the same architectures (CPU test)")
    ap.add_argument("--strict", action="store_true", help="also exit 1 when as loaded misses the tolerance")
    ap.add_argument("--profile-eager", type=int, default=0, metavar="TOP",
                    help="also profile one eager generate per variant (cProfile, the TOP functions by own time)")
    ap.add_argument("--kernels", type=int, default=0, metavar="STEPS",
                    help="compiled mode: also profile STEPS more decode steps per variant and print each kernel's "
                         "GPU time per step beside the plain model's (mixgemm.bench.kernel_profile)")
    ap.add_argument("--compiled-repeats", type=int, default=1, help="compiled mode: timed loops (median)")
    short = [v.removeprefix("act-order, ") for v in VARIANTS[1:]] + [INDUCTOR_NORMS.removeprefix("plain, ")]
    ap.add_argument("--variants", default=",".join(short[:-1]),
                    help=f"comma list of the act-order variants to build beside plain: {short}")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    chosen = ("plain", *[INDUCTOR_NORMS if v.strip() == short[-1] else f"act-order, {v.strip()}"
                         for v in args.variants.split(",") if v.strip()])
    if unknown := [v for v in chosen if v not in (*VARIANTS, INDUCTOR_NORMS)]:
        ap.error(f"unknown variants {unknown}; known: {short}")
    modes = [m for m in args.modes.split(",") if m]
    models, s = settings_from(ap, args, modes, MODES, kernel_steps=args.kernels,
                              compiled_repeats=args.compiled_repeats)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    results: dict = {"settings": {**asdict(s), "dtype": str(s.dtype), "modes": modes, "models": models,
                                  "tolerance": args.tolerance},
                     "gpu": torch.cuda.get_device_name() if s.cuda else "cpu", "torch": torch.__version__,
                     "models": [], "errors": {}}

    def save():
        results["elapsed_s"] = time.perf_counter() - t_start
        (out / "actorder_model.json").write_text(json.dumps(results, indent=1, default=str))

    def log(msg):
        print(f"[{time.perf_counter() - t_start:6.1f} s] {msg}", flush=True)
        save()

    for name in models:
        results["models"].append(res := {"model": name})
        try:
            measure(res, name, modes, s, log, args.profile_eager, chosen)
        except Exception:
            results["errors"][name] = traceback.format_exc()
            log(f"{name}: ERROR\n{results['errors'][name]}")
            free_memory(s)
    text, misses = table(results, args.tolerance)
    bad = [f"{k}: {v.splitlines()[-1]}" for k, v in results["errors"].items()]
    bad += [f"{r['model']} {k}: {v.splitlines()[-1]}" for r in results["models"]
            for k, v in r.get("errors", {}).items()]
    # the folds move numbers, not arithmetic: one token through the GEMVs gives the same logits bit for bit
    bad += [f"{r['model']}: one-token logits of the folded models differ from the in-kernel one's (prompt: "
            f"{r['prompt_logits_max_rel']:.2e} relative)" for r in results["models"]
            if r.get("m1_logits_equal") is False]
    results["failures"], results["missed"] = bad, misses
    save()
    print(text)
    for line in misses:
        print(f"target missed: {line}")
    for line in bad:
        print(f"FAILED: {line}")
    return 1 if bad or (args.strict and misses) else 0


if __name__ == "__main__":
    sys.exit(main())
