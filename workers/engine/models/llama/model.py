"""A Llama-style decoder: RMSNorm, rotary embeddings, SwiGLU MLP, grouped-query attention,
with the switches Llama 3.x, Qwen2, Qwen3 and Mistral need (rope scaling, a head size of
its own, tied embeddings, biases on q/k/v, norms on q/k, a sliding window).

Plain PyTorch with no parallelism inside. Layers live in a ModuleDict keyed by their index
and every top-level part may be None, so a pipeline stage is this same class with the parts
it does not own removed, and parameter names never change with the layout.
"""

from __future__ import annotations

import math
from functools import lru_cache, partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shardline.workers.engine.models.llama.config import ModelArgs
from shardline.workers.engine.random_init import random_parameters


def scaled_frequencies(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Rotary frequencies stretched as transformers' `llama3` and `linear` rope types do
    (modeling_rope_utils), step for step, so the tables agree to the bit."""
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are divided by the factor, short ones kept, those between blended.
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(
    head_dim: int, seq_len: int, theta: float, scaling: dict[str, Any] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (seq_len, head_dim // 2)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if scaling is not None:
        inv_freq = scaled_frequencies(inv_freq, scaling)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


@lru_cache(maxsize=8)
def window_mask(seq: int, window: int, device: torch.device) -> torch.Tensor:
    """Boolean (seq, seq): position q sees positions q - window + 1 .. q (transformers'
    sliding_window_overlay on a causal mask). Built once per shape, not per layer and
    step."""
    q = torch.arange(seq, device=device)[:, None]
    k = torch.arange(seq, device=device)[None, :]
    return (k <= q) & (k > q - window)


def document_positions(documents: torch.Tensor) -> torch.Tensor:
    """(batch, seq) document numbers -> each token's position within its document."""
    index = torch.arange(documents.shape[1], device=documents.device).expand_as(documents)
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    return index - torch.where(starts, index, 0).cummax(dim=1).values


def document_mask(documents: torch.Tensor, window: int | None) -> torch.Tensor:
    """Boolean (batch, 1, seq, seq): causal, within one document (and within the sliding
    window). Every query sees at least itself, so no softmax row is empty."""
    seq = documents.shape[1]
    mask = documents[:, :, None] == documents[:, None, :]
    causal = window_mask(seq, window or seq, documents.device)
    return (mask & causal)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs of x (batch, seq, heads, head_dim) by position; the tables
    are (seq, head_dim // 2), or (batch, seq, head_dim // 2) where positions differ by row."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return rotated.type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 for stability under bf16/fp16 autocast.
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).type_as(x)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.head_dim = args.head_dim
        self.sliding_window = args.sliding_window
        bias = args.qkv_bias
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=bias)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=bias)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=bias)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        # Qwen3: each head's queries and keys normalised over its channels before rope.
        self.q_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`mask`: where documents are packed side by side (document_mask), else None for
        plain causal attention."""
        bsz, seq, _ = x.shape
        # -1 for head counts lets tensor parallelism shrink the projections from outside.
        q = self.wq(x).view(bsz, seq, -1, self.head_dim)
        k = self.wk(x).view(bsz, seq, -1, self.head_dim)
        v = self.wv(x).view(bsz, seq, -1, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # Tables cover seq_len; this batch may be shorter.
        cos, sin = cos[..., :seq, :], sin[..., :seq, :]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        gqa = q.shape[1] != k.shape[1]
        if mask is not None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        elif self.sliding_window is not None and self.sliding_window < seq:
            mask = window_mask(seq, self.sliding_window, x.device)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)  # gate
        self.w3 = nn.Linear(dim, hidden, bias=False)  # up
        self.w2 = nn.Linear(hidden, dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_dim)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(args.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(args.dim, args.norm_eps)
        self.output: nn.Linear | None = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.tie_weights()
        cos, sin = rope_tables(args.head_dim, args.seq_len, args.rope_theta, args.rope_scaling)
        # Not persistent: derived from the args, so never part of a checkpoint.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # Built under `torch.device("meta")` the model has no storage yet: the engine
        # allocates and fills only this rank's shards later (workers/engine/initialise.py).
        if not cos.is_meta:
            self.init_weights()

    def tie_weights(self) -> None:
        """With tied embeddings the output head's weight is the token embedding's: one
        parameter, one gradient (the sum of both uses), one optimizer state. Moving a
        module to another device (`to_empty`) replaces each module's parameter with a new
        one, so this runs again after it."""
        if self.args.tie_embeddings and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    def reset_buffers(self) -> None:
        """Recompute the rotary tables in place (after `to_empty` left them garbage), and
        tie the output head to the embedding again."""
        args = self.args
        cos, sin = rope_tables(args.head_dim, args.seq_len, args.rope_theta, args.rope_scaling)
        self.get_buffer("rope_cos").copy_(cos)
        self.get_buffer("rope_sin").copy_(sin)
        self.tie_weights()

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """The weights the engine gives a job seeded `seed`, in one piece (see
        workers/engine/random_init.py: each parameter from its own seeded generator)."""
        draw = random_parameters(seed=seed, init_std=partial(init_std, args=self.args))
        for name, p in self.named_parameters():
            p.copy_(draw(name, p.shape, p.device))

    def forward(self, tokens: torch.Tensor, documents: torch.Tensor | None = None) -> torch.Tensor:
        """tokens (batch, seq) of ids -> logits (batch, seq, vocab).

        A pipeline stage without embeddings takes hidden states instead, and one without
        the output head returns them. `documents` (batch, seq): which document each token
        belongs to where several are packed in a row; attention stays within each and
        positions restart at each.
        """
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        # Full tables: with sequence parallelism h is split along the sequence here, and
        # attention (which sees the whole sequence) slices them.
        cos, sin = self.get_buffer("rope_cos"), self.get_buffer("rope_sin")
        mask = None
        if documents is not None:
            positions = document_positions(documents)
            cos, sin = cos[positions], sin[positions]
            mask = document_mask(documents, self.args.sliding_window)
        for layer in self.layers.values():
            h = layer(h, cos, sin, mask)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


def init_std(name: str, args: ModelArgs) -> float | None:
    """GPT-2 style: N(0, 0.02), residual outputs scaled down by depth; None for norm
    gains, which start at one."""
    if name.endswith(("wo.weight", "w2.weight")):
        return 0.02 / (2 * args.n_layers) ** 0.5
    if name.endswith("norm.weight"):
        return None
    if name.endswith(".bias"):
        return 0.0
    return 0.02


def flops_per_token(args: ModelArgs, n_params_no_embedding: int) -> int:
    """Training FLOPs per token: 6N for the weights plus the attention term.

    Counted as torchtitan and MosaicML do: 6 * N (forward + backward matmuls) plus
    12 * n_layers * (attention width) * seq_len for the attention scores and weighted
    sum. N leaves out the embedding (a lookup), but a tied output head is a matmul all the
    same. A sliding window computes fewer scores; they are counted whole.
    """
    head = args.vocab_size * args.dim if args.tie_embeddings else 0
    attention = 12 * args.n_layers * args.n_heads * args.head_dim * args.seq_len
    return 6 * (n_params_no_embedding + head) + attention
