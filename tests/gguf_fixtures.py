"""Small GGUF files for tests: random blocks of any quantized type, and a tiny Llama written with gguf.GGUFWriter.

Types gguf can quantize (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) are quantized from random normal weights; the others
(K-quants, Q2_K, IQ*...) are random bytes with sane fp16 super-block scales, or random blocks kept where they decode
to sane values (types whose scales are packed otherwise; gguf has no quantizer for them).
"""

from __future__ import annotations

import os

import numpy as np

QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
# byte offsets of the fp16 fields that scale a block, per type: random bytes there would give huge or NaN weights
_F16_FIELDS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (-2,), "Q2_K": (-4, -2), "Q3_K": (-2,), "IQ1_S": (0,),
               "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ4_NL": (0,),
               "IQ4_XS": (0,), "TQ1_0": (-2,), "TQ2_0": (-2,)}


def random_blocks(qtype_name: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [n, row bytes] of ``qtype_name`` for a weight [n, k]."""
    import gguf

    qtype = gguf.GGMLQuantizationType[qtype_name]
    if qtype_name in QUANTIZABLE:
        return gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.05, qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype_name not in _F16_FIELDS:  # scales packed otherwise (IQ1_M, MXFP4's e8m0, NVFP4's e4m3): keep sane blocks
        pool = rng.integers(0, 256, (64 * n * k // block, size), dtype=np.uint8)
        with np.errstate(all="ignore"):
            v = gguf.quants.dequantize(pool, qtype).reshape(len(pool), -1)
        sane = np.isfinite(v).all(1) & (np.abs(v).max(1) < 10) & (np.abs(v).max(1) > 1e-3)
        assert sane.sum() >= n * k // block, qtype_name
        return pool[sane][: n * k // block].reshape(n, -1)
    raw = rng.integers(0, 256, (n * k // block, size), dtype=np.uint8)
    for start in _F16_FIELDS[qtype_name]:
        d = (rng.random(len(raw)) * 2e-3 + 1e-4).astype(np.float16).view(np.uint8).reshape(-1, 2)
        raw[:, start:start + 2 if start != -2 else None] = d
    return raw.reshape(n, -1)


class TinyWriter:
    """gguf.GGUFWriter with the header fields every tiny model here shares, and random tensors of any GGUF type."""

    def __init__(self, path: str, arch: str, c: dict, ffn: int, rms_eps: float, seed: int, drop: tuple = ()):
        import gguf

        self.gguf, self.rng, self.drop = gguf, np.random.default_rng(seed), drop
        w = self.w = gguf.GGUFWriter(path, arch)
        w.add_name(f"tiny-{arch}")
        w.add_block_count(c["layers"])
        w.add_context_length(128)
        w.add_embedding_length(c["hidden"])
        w.add_feed_forward_length(ffn)
        w.add_head_count(c["heads"])
        w.add_head_count_kv(c["kv_heads"])
        w.add_layer_norm_rms_eps(rms_eps)
        w.add_rope_freq_base(10000.0)
        w.add_vocab_size(c["vocab"])

    def weight(self, name: str, shape: tuple, qtype_name: str) -> None:
        """A random weight of ``shape`` (any rank; blocks along the last dim), F32 or a quantized type."""
        if name in self.drop:
            return
        if qtype_name == "F32":
            self.w.add_tensor(name, (self.rng.standard_normal(shape) * 0.05).astype(np.float32))
            return
        blocks = random_blocks(qtype_name, int(np.prod(shape[:-1])), shape[-1], self.rng)
        self.w.add_tensor(name, blocks.reshape(*shape[:-1], -1),
                          raw_dtype=self.gguf.GGMLQuantizationType[qtype_name])

    def norm(self, name: str, n: int) -> None:
        self.w.add_tensor(name, (1 + 0.1 * self.rng.standard_normal(n)).astype(np.float32))

    def close(self) -> None:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()


def within_half_step(got, want, scales, slack: float = 1e-3, floor: float = 1e-7) -> bool:
    """Every weight of ``got`` within half a quantization step of ``want`` (tensors [N, K]), the step being
    ``scales`` [N, K / 32] per group of 32 (a type re-quantized to groups of 32), ``slack`` and ``floor`` for the
    rounding of the scale itself."""
    step = scales.double().repeat_interleave(32, dim=1)
    return bool(((got.double() - want.double()).abs() <= step / 2 * (1 + slack) + floor).all())


TINY = dict(vocab=320, hidden=256, ffn=512, heads=4, kv_heads=2, layers=1)
DEFAULT_TYPES = {"attn_q": "Q4_K", "attn_k": "Q5_K", "attn_v": "Q6_K", "attn_output": "Q8_0", "ffn_gate": "Q4_0",
                 "ffn_up": "Q4_1", "ffn_down": "Q5_0", "output": "Q5_1", "token_embd": "Q8_0"}


def write_tiny_llama(directory: str, types: dict | None = None, seed: int = 0, name: str = "tiny.gguf") -> str:
    """A one-layer Llama GGUF (hidden 256, 4 heads, 2 KV heads, untied output) whose Linear weights have the
    given GGUF types (``DEFAULT_TYPES`` overridden by ``types``); norms are F32. Returns the file name."""
    types = {**DEFAULT_TYPES, **(types or {})}
    c = TINY
    t = TinyWriter(os.path.join(directory, name), "llama", c, c["ffn"], 1e-5, seed)
    t.w.add_rope_dimension_count(c["hidden"] // c["heads"])
    head_dim = c["hidden"] // c["heads"]
    shapes = {"attn_q": (c["hidden"], c["hidden"]), "attn_k": (c["kv_heads"] * head_dim, c["hidden"]),
              "attn_v": (c["kv_heads"] * head_dim, c["hidden"]), "attn_output": (c["hidden"], c["hidden"]),
              "ffn_gate": (c["ffn"], c["hidden"]), "ffn_up": (c["ffn"], c["hidden"]),
              "ffn_down": (c["hidden"], c["ffn"])}
    t.weight("token_embd.weight", (c["vocab"], c["hidden"]), types["token_embd"])
    for i in range(c["layers"]):
        t.norm(f"blk.{i}.attn_norm.weight", c["hidden"])
        t.norm(f"blk.{i}.ffn_norm.weight", c["hidden"])
        for part, shape in shapes.items():
            t.weight(f"blk.{i}.{part}.weight", shape, types[part])
    t.norm("output_norm.weight", c["hidden"])
    t.weight("output.weight", (c["vocab"], c["hidden"]), types["output"])
    t.close()
    return name


TINY_MOE = dict(vocab=320, hidden=64, heads=4, kv_heads=2, head_dim=16, layers=2, experts=4, used=2, expert_ffn=768)
MOE_TYPES = {"attn_q": "Q8_0", "attn_k": "Q4_0", "attn_v": "Q4_1", "attn_output": "Q8_0", "ffn_gate_exps": "Q4_0",
             "ffn_up_exps": "Q4_1", "ffn_down_exps": "Q8_0", "ffn_gate_inp": "F32", "output": "Q8_0",
             "token_embd": "Q8_0"}


def write_tiny_qwen3_moe(directory: str, types: dict | None = None, seed: int = 0, name: str = "moe.gguf",
                         hidden: int = TINY_MOE["hidden"], drop: tuple = (), expert_ffn: int = 768) -> str:
    """A two-layer Qwen3-MoE GGUF (hidden 64, 4 experts of 768, 2 a token) with the given types (``MOE_TYPES``
    overridden; K-quants need ``hidden`` 256); the experts are 3-D tensors [E, out, in] of blocks along in, as
    llama.cpp writes them. ``drop``: tensor names left out; ``expert_ffn``: the experts' width (transformers reads
    none from a qwen3moe file and takes its config's default, 768). Returns the file name."""
    types = {**MOE_TYPES, **(types or {})}
    c = {**TINY_MOE, "hidden": hidden, "expert_ffn": expert_ffn}
    t = TinyWriter(os.path.join(directory, name), "qwen3moe", c, 256, 1e-6, seed, drop)
    t.w.add_expert_feed_forward_length(c["expert_ffn"])
    t.w.add_expert_count(c["experts"])
    t.w.add_expert_used_count(c["used"])
    t.w.add_key_length(c["head_dim"])
    t.w.add_value_length(c["head_dim"])
    hd, h, e, f = c["head_dim"], c["hidden"], c["experts"], c["expert_ffn"]
    t.weight("token_embd.weight", (c["vocab"], h), types["token_embd"])
    for i in range(c["layers"]):
        t.norm(f"blk.{i}.attn_norm.weight", h)
        t.norm(f"blk.{i}.ffn_norm.weight", h)
        t.norm(f"blk.{i}.attn_q_norm.weight", hd)
        t.norm(f"blk.{i}.attn_k_norm.weight", hd)
        for part, shape in {"attn_q": (c["heads"] * hd, h), "attn_k": (c["kv_heads"] * hd, h),
                            "attn_v": (c["kv_heads"] * hd, h), "attn_output": (h, c["heads"] * hd),
                            "ffn_gate_inp": (e, h), "ffn_gate_exps": (e, f, h), "ffn_up_exps": (e, f, h),
                            "ffn_down_exps": (e, h, f)}.items():
            t.weight(f"blk.{i}.{part}.weight", shape, types[part])
    t.norm("output_norm.weight", h)
    t.weight("output.weight", (c["vocab"], h), types["output"])
    t.close()
    return name
