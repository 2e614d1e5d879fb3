"""Where the host time of an eager ``model.generate`` goes, fp16 against mixgemm.quantize_ (W4A16 g128), on a
Hugging Face model's shapes (random weights; --layers keeps fewer decoder layers, the shapes unchanged).

Eager decoding is host-bound: a quantized model decodes as fast as the fp16 one only if its Python and launch time per
step is no larger. This times ``generate`` (default cache) for each model in turns (median), then runs one generate
of each under cProfile and prints the functions whose own time differs most between the two, per decode step.

    PYTHONPATH=src python -m tools.profile.generate_host --model qwen2-7b [--layers 28] [--new-tokens 64]
        [--repeats 5] [--plain] [--own-norms] [--out DIR]

--plain adds a quantize_(compact=False) copy; --own-norms a copy whose norms run the model's own forward
(mixgemm.nn.norms.use_inductor_norms: not mixgemm's norm kernel). Writes DIR/generate_host_<model>.txt when --out
is given.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import os
import pstats

import torch

import mixgemm
from mixgemm.integrations.hf import TINY_TWINS, model_config, random_model
from tools.checks.generate_e2e import Settings, generate_once, prompt, time_generate


def own_times(model, ids, s: Settings) -> dict[str, tuple[float, int]]:
    """function -> (own seconds, calls) over one profiled generate."""
    prof = cProfile.Profile()
    prof.enable()
    generate_once(model, ids, s, static=False)
    prof.disable()
    st = pstats.Stats(prof)
    return {f"{os.path.basename(f)}:{line}({name})": (tt, nc)
            for (f, line, name), (cc, nc, tt, ct, callers) in st.stats.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2-7b", choices=sorted(TINY_TWINS))
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--plain", action="store_true", help="also a quantize_(compact=False) copy")
    ap.add_argument("--own-norms", action="store_true", help="also a copy on the model's own norms")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"],
                    help="both models' dtype (bfloat16: as the MoE models are compared)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("times CUDA decoding and needs a CUDA GPU")
    over = {} if args.layers is None else {"num_hidden_layers": args.layers}
    dtype = getattr(torch, args.dtype)
    fp16 = random_model(model_config(args.model, **over), dtype=dtype, device="cuda")
    models = {"fp16": fp16}
    variants = [("w4a16", True)] + ([("w4a16_plain", False)] if args.plain else [])
    for tag, compact in variants:
        q = copy.deepcopy(fp16)
        mixgemm.quantize_(q, mixgemm.W4A16(group_size=128), compact=compact)
        models[tag] = q
    if args.own_norms:
        from mixgemm.nn.norms import use_inductor_norms

        q = copy.deepcopy(fp16)
        mixgemm.quantize_(q, mixgemm.W4A16(group_size=128))
        use_inductor_norms(q)
        models["w4a16_own_norms"] = q
    s = Settings(device="cuda", dtype=dtype, tiny=False, new_tokens=args.new_tokens, prompt_len=32,
                 repeats=args.repeats, warmup=0, seed=0)
    ids = prompt(fp16, s)
    times = time_generate(models, ids, s, static=False)  # warmed up once, then the models in turns
    lines = [f"{args.model}, {fp16.config.num_hidden_layers} layers, {args.new_tokens} new tokens, median of "
             f"{args.repeats}:"]
    for k, t in times.items():
        lines.append(f"  {k:12s} {t['tokens_per_s']:7.1f} tok/s  {1e3 * t['s'] / args.new_tokens:6.2f} ms/token  "
                     f"x{times['fp16']['s'] / t['s']:.3f} fp16")
    prof = {k: own_times(m, ids, s) for k, m in models.items()}
    steps = args.new_tokens
    for k in models:
        if k == "fp16":
            continue
        a, b = prof["fp16"], prof[k]
        keys = set(a) | set(b)
        diff = sorted(keys, key=lambda f: -abs(b.get(f, (0, 0))[0] - a.get(f, (0, 0))[0]))
        total_a = sum(t for t, _ in a.values()) / steps
        total_b = sum(t for t, _ in b.values()) / steps
        lines.append(f"\n{k} against fp16 under cProfile: {1e6 * total_b:.0f} against {1e6 * total_a:.0f} us of own "
                     "time per step; functions by |difference| (us per step, calls per step):")
        for f in diff[: args.top]:
            ta, na = a.get(f, (0.0, 0))
            tb, nb = b.get(f, (0.0, 0))
            lines.append(f"  {1e6 * (tb - ta) / steps:+8.1f}  {1e6 * ta / steps:8.1f} ({na / steps:5.1f}) -> "
                         f"{1e6 * tb / steps:8.1f} ({nb / steps:5.1f})  {f}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"generate_host_{args.model}.txt"), "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
