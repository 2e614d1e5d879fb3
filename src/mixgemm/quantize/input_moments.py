"""Each Linear's input statistics for HQQ's weighting, without calibration data: random tokens through the model.

A layer's output error is (W - W_r) x; over inputs whose channels are roughly uncorrelated its mean square is
sum_k E[x_k^2] (w_k - w_r,k)^2 per output row. Weighting each input channel's error by E[x_k^2] makes HQQ spend the
group's range on the channels the layer actually reads loudly (the channels after a norm with a large gain, the
outlier channels of a transformer's residual stream), which a weight-only objective cannot see.

Without data the moments come from uniformly random token ids run through the float model: the channels that carry
large activations in a transformer are mostly a property of its weights (norm gains, the residual stream's outlier
dimensions), not of the text, so random tokens find them. Each context length of RANDOM_LENGTHS contributes the same
weight (a sentence-embedding model reads short inputs, a causal LM long ones, and attention's statistics move with
the length), with RANDOM_TOKENS_PER_LENGTH tokens each, from a fixed seed: the same model gets the same codes.
Calibration batches, when given, take the place of the random tokens.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable

import torch
from torch import nn

from mixgemm.quantize.sequential import run_model

# context lengths of the random batches (each capped at the model's max_position_embeddings) and tokens per length
RANDOM_LENGTHS = (16, 64, 256, 1024)
RANDOM_TOKENS_PER_LENGTH = 2048
RANDOM_SEED = 0


def random_token_batches(model: nn.Module) -> tuple[list[list[dict]], str | None]:
    """Batches of uniformly random token ids for ``model``, one list per context length of RANDOM_LENGTHS (capped at
    the model's max_position_embeddings), on the model's device; ([], why not) where the model is no token model (no
    ``config.vocab_size`` or a forward without ``input_ids``)."""
    cfg = getattr(model, "config", None)
    vocab = getattr(cfg, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1:
        return [], "the model has no config.vocab_size to draw random tokens from"
    try:
        takes_ids = "input_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        takes_ids = False
    if not takes_ids:
        return [], "the model's forward takes no input_ids"
    device = next(iter(model.parameters()), torch.empty(0)).device
    longest = getattr(cfg, "max_position_embeddings", None)
    gen = torch.Generator().manual_seed(RANDOM_SEED)
    out = []
    capped = isinstance(longest, int) and longest > 0
    for t in sorted({min(length, longest) if capped else length for length in RANDOM_LENGTHS}):
        ids = torch.randint(0, vocab, (max(1, RANDOM_TOKENS_PER_LENGTH // t), t), generator=gen)
        out.append([{"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids, device=device)}])
    return out, None


class _SecondMoment:
    """E[x_k^2] over the tokens of one Linear's inputs, accumulated by a forward hook in float32."""

    def __init__(self):
        self.sum: torch.Tensor | None = None
        self.tokens = 0

    def __call__(self, mod, args, output):
        x = args[0].detach()
        x = x.reshape(-1, x.shape[-1]).to(torch.float32)
        if x.shape[0] == 0:
            return
        s = x.square().sum(0)
        self.sum = s if self.sum is None else self.sum + s
        self.tokens += x.shape[0]

    def mean(self) -> torch.Tensor | None:
        return None if self.sum is None else self.sum / self.tokens


def input_second_moments(model: nn.Module, linears: dict[str, nn.Linear], groups: Iterable[Iterable[dict]]
                         ) -> dict[str, torch.Tensor]:
    """{name: E[x_k^2] [K]} of the inputs of ``linears`` over the batches, each group of batches weighing the same
    (the mean of its groups' moments); a Linear no batch reached is absent. The model runs in eval mode without
    gradients and is left as it was."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    was_training = model.training
    model.eval()
    try:
        for group in groups:
            hooks, moments = [], {name: _SecondMoment() for name in linears}
            try:
                for name, lin in linears.items():
                    hooks.append(lin.register_forward_hook(moments[name]))
                with torch.no_grad():
                    for batch in group:
                        run_model(model, batch)
            finally:
                for h in hooks:
                    h.remove()
            for name, m in moments.items():
                mean = m.mean()
                if mean is not None:
                    sums[name] = mean if name not in sums else sums[name] + mean
                    counts[name] = counts.get(name, 0) + 1
    finally:
        model.train(was_training)
    return {name: s / counts[name] for name, s in sums.items()}


__all__ = ["RANDOM_LENGTHS", "input_second_moments", "random_token_batches"]
