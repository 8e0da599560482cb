"""Text generation for `shardline generate`: sampling over the logits a model family's
decoder gives (a KV cache, so a new token costs one position's work)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from shardline.workers.engine.models.family import ModelFamily


@dataclass(frozen=True)
class Sampling:
    """Greedy (argmax), or temperature and nucleus (top-p) sampling with a seed."""

    greedy: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


def next_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    """Choose the next token from one position's logits (vocab,)."""
    if sampling.greedy:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    sorted_probs, order = probs.sort(descending=True)
    # Keep the smallest set of most likely tokens whose mass reaches top_p (at least one).
    keep = sorted_probs.cumsum(-1) - sorted_probs < sampling.top_p
    kept = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
    choice = torch.multinomial(kept / kept.sum(), 1, generator=generator)
    return int(order[choice])


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: list[int],
    *,
    family: ModelFamily,
    max_new_tokens: int,
    sampling: Sampling = Sampling(),
    eos_token_id: int | None = None,
) -> list[int]:
    """The new token ids after `prompt` (at most `max_new_tokens`, stopping after eos),
    decoded by `family`'s decoder over `model` (whole, one process)."""
    if not prompt:
        raise ValueError("the prompt is empty; give at least one token")
    device = next(model.parameters()).device
    decode = family.decoder(model, len(prompt) + max_new_tokens)
    generator = torch.Generator(device="cpu").manual_seed(sampling.seed)
    model.eval()
    tokens = torch.tensor([prompt], dtype=torch.long, device=device)
    logits = decode(tokens, 0)[0, -1]
    out: list[int] = []
    while len(out) < max_new_tokens:
        token = next_token(logits.cpu(), sampling, generator)
        out.append(token)
        if token == eos_token_id or len(out) == max_new_tokens:
            break
        step = torch.tensor([[token]], dtype=torch.long, device=device)
        logits = decode(step, len(prompt) + len(out) - 1)[0, -1]
    return out
