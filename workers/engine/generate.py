"""Text generation with a KV cache, using the model's own modules and weights.

The training forward (model.Transformer.forward) recomputes attention over the whole
sequence; here each layer's keys and values are kept in a cache, so a new token costs one
position's work. The decode calls the same submodules (norms, projections, MLP) and the
same `apply_rope`, so it computes what the training forward computes, one position at a
time (a test checks this against the full forward).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from workers.engine.model import (
    Attention,
    ModelArgs,
    Transformer,
    TransformerBlock,
    apply_rope,
    rope_tables,
)


@dataclass
class KVCache:
    """Keys and values of every layer: (batch, max_len, n_kv_heads, head_dim) each."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @classmethod
    def empty(
        cls, args: ModelArgs, batch: int, max_len: int, device: torch.device, dtype: torch.dtype
    ) -> KVCache:
        shape = (batch, max_len, args.n_kv_heads, args.head_dim)

        def one() -> list[torch.Tensor]:
            return [torch.zeros(shape, device=device, dtype=dtype) for _ in range(args.n_layers)]

        return cls(one(), one())


@dataclass(frozen=True)
class Sampling:
    """Greedy (argmax), or temperature and nucleus (top-p) sampling with a seed."""

    greedy: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


def _attend(
    attn: Attention,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    start: int,
) -> torch.Tensor:
    """Attention of the new positions [start, start + seq) over the cache and themselves."""
    bsz, seq, _ = x.shape
    q = attn.wq(x).view(bsz, seq, -1, attn.head_dim)
    k = attn.wk(x).view(bsz, seq, -1, attn.head_dim)
    v = attn.wv(x).view(bsz, seq, -1, attn.head_dim)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    end = start + seq
    cache_k[:, start:end] = k
    cache_v[:, start:end] = v
    q, keys, values = (t.transpose(1, 2) for t in (q, cache_k[:, :end], cache_v[:, :end]))
    # New position i (absolute start + i) sees every cached position up to itself.
    mask = torch.ones(seq, end, dtype=torch.bool, device=x.device).tril(diagonal=start)
    out = F.scaled_dot_product_attention(
        q, keys, values, attn_mask=mask, enable_gqa=q.shape[1] != keys.shape[1]
    )
    return attn.wo(out.transpose(1, 2).reshape(bsz, seq, -1))


@torch.no_grad()
def forward_cached(
    model: Transformer,
    tokens: torch.Tensor,
    cache: KVCache,
    start: int,
    rope: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """Logits (batch, seq, vocab) of `tokens` at positions [start, start + seq), filling
    the cache there. `rope` are cos/sin tables covering every position generated."""
    assert model.tok_embeddings is not None and model.norm is not None
    assert model.output is not None, "generation needs the whole model, not a pipeline stage"
    seq = tokens.shape[1]
    cos, sin = rope[0][start : start + seq], rope[1][start : start + seq]
    h = model.tok_embeddings(tokens)
    for i, layer in enumerate(model.layers.values()):
        assert isinstance(layer, TransformerBlock)
        h = h + _attend(
            layer.attention,
            layer.attention_norm(h),
            cos,
            sin,
            cache.keys[i],
            cache.values[i],
            start,
        )
        h = h + layer.feed_forward(layer.ffn_norm(h))
    return model.output(model.norm(h))


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
    model: Transformer,
    prompt: list[int],
    *,
    max_new_tokens: int,
    sampling: Sampling = Sampling(),
    eos_token_id: int | None = None,
) -> list[int]:
    """The new token ids after `prompt` (at most `max_new_tokens`, stopping after eos)."""
    if not prompt:
        raise ValueError("the prompt is empty; give at least one token")
    args = model.args
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    max_len = len(prompt) + max_new_tokens
    rope = tuple(t.to(device) for t in rope_tables(args.head_dim, max_len, args.rope_theta))
    cos_sin = (rope[0], rope[1])
    cache = KVCache.empty(args, 1, max_len, device, dtype)
    generator = torch.Generator(device="cpu").manual_seed(sampling.seed)
    model.eval()
    tokens = torch.tensor([prompt], dtype=torch.long, device=device)
    logits = forward_cached(model, tokens, cache, 0, cos_sin)[0, -1]
    out: list[int] = []
    while len(out) < max_new_tokens:
        token = next_token(logits.cpu(), sampling, generator)
        out.append(token)
        if token == eos_token_id or len(out) == max_new_tokens:
            break
        step = torch.tensor([[token]], dtype=torch.long, device=device)
        logits = forward_cached(model, step, cache, len(prompt) + len(out) - 1, cos_sin)[0, -1]
    return out
