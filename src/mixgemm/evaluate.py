"""``mixgemm.evaluate_perplexity``: how much a quantized causal LM lost, in the standard measure.

The text is tokenized once and scored in windows of ``max_length`` tokens that start ``stride`` tokens apart; each
window predicts only the tokens the previous one did not (the others are context), so every token after the first
is predicted once with up to ``max_length - stride`` tokens of context: transformers' "Perplexity of fixed-length
models". The perplexity is exp of the mean negative log-likelihood over the predicted tokens.
"""

from __future__ import annotations

import math

import torch


def evaluate_perplexity(model, tokenizer, text: str | torch.Tensor, max_length: int | None = None,
                        stride: int | None = None, max_tokens: int | None = None, progress: bool = False) -> float:
    """Perplexity of ``model`` (a transformers causal LM, quantized or not) on ``text`` (a string, tokenized by
    ``tokenizer``, or token ids [T] / [1, T]; then ``tokenizer`` may be None).

    max_length: tokens per window (default: the model's ``max_position_embeddings``, at most 2048). stride: tokens
    between window starts (default max_length // 2). max_tokens: score only the first max_tokens tokens. The model
    runs where its parameters are, in eval mode, without gradients; a tqdm bar with ``progress=True``.
    """
    ids = _token_ids(tokenizer, text)
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or max_tokens < 2:
            raise ValueError(f"max_tokens must be an int >= 2, got {max_tokens!r}")
        ids = ids[:max_tokens]
    if ids.numel() < 2:
        raise ValueError(f"text has {ids.numel()} tokens: perplexity needs at least 2")
    if max_length is None:
        max_length = min(int(getattr(getattr(model, "config", None), "max_position_embeddings", 2048) or 2048), 2048)
    if not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an int >= 2, got {max_length!r}")
    stride = max_length // 2 if stride is None else stride
    if not isinstance(stride, int) or not 1 <= stride <= max_length:
        raise ValueError(f"stride must be an int in [1, max_length={max_length}], got {stride!r}")
    from tqdm.auto import tqdm

    device = next(iter(model.parameters())).device
    n = ids.numel()
    nll, count, prev_end = 0.0, 0, 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for begin in tqdm(range(0, n, stride), desc="perplexity", disable=not progress):
                end = min(begin + max_length, n)
                window = ids[begin:end].to(device)[None]
                logits = model(input_ids=window, use_cache=False).logits[0, :-1].float()
                targets = window[0, 1:]
                fresh = end - prev_end  # tokens this window predicts that no earlier window did
                first = max(window.shape[1] - 1 - fresh, 0)
                loss = torch.nn.functional.cross_entropy(logits[first:], targets[first:], reduction="sum")
                nll += float(loss)
                count += targets.numel() - first
                prev_end = end
                if end == n:
                    break
    finally:
        model.train(was_training)
    return math.exp(nll / count)


def _token_ids(tokenizer, text) -> torch.Tensor:
    if isinstance(text, torch.Tensor):
        if text.is_floating_point() or text.dim() > 2 or (text.dim() == 2 and text.shape[0] != 1):
            raise ValueError(f"token ids must be an integer tensor [T] or [1, T], got {text.dtype} "
                             f"{tuple(text.shape)}")
        return text.reshape(-1).to(torch.int64)
    if not isinstance(text, str):
        raise TypeError(f"text must be a str or a tensor of token ids, got {type(text).__name__}")
    if tokenizer is None:
        raise ValueError("a tokenizer is needed to score a string")
    return tokenizer(text, return_tensors="pt").input_ids.reshape(-1)


__all__ = ["evaluate_perplexity"]
