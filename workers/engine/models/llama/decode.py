"""Llama's decoding with a KV cache, using the model's own modules and weights.

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
from torch import nn

from shardline.workers.engine.models.llama.config import ModelArgs
from shardline.workers.engine.models.llama.model import (
    Attention,
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
    if attn.q_norm is not None and attn.k_norm is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    end = start + seq
    cache_k[:, start:end] = k
    cache_v[:, start:end] = v
    q, keys, values = (t.transpose(1, 2) for t in (q, cache_k[:, :end], cache_v[:, :end]))
    # New position i (absolute start + i) sees every cached position up to itself, and
    # under a sliding window only the last `sliding_window` of them.
    mask = torch.ones(seq, end, dtype=torch.bool, device=x.device).tril(diagonal=start)
    if attn.sliding_window is not None:
        mask = mask.triu(diagonal=start - attn.sliding_window + 1)
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


class LlamaDecoder:
    """Logits of the positions given, one call after another, over one cache."""

    def __init__(self, model: nn.Module, max_len: int) -> None:
        assert isinstance(model, Transformer)
        self.model = model
        args = model.args
        param = next(model.parameters())
        device, dtype = param.device, param.dtype
        tables = rope_tables(args.head_dim, max_len, args.rope_theta, args.rope_scaling)
        cos, sin = (t.to(device) for t in tables)
        self.rope = (cos, sin)
        self.cache = KVCache.empty(args, 1, max_len, device, dtype)

    def __call__(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        return forward_cached(self.model, tokens, self.cache, start, self.rope)
