"""Llama's parameters <-> Hugging Face's LlamaForCausalLM tensors (and Qwen2's, Qwen3's and
Mistral's, which name them the same).

Names: `model.layers.0.self_attn.q_proj.weight` is `layers.0.attention.wq.weight`, and so
on (table below). Rotary convention: this model rotates interleaved channel pairs
(model.apply_rope, as Meta's Llama code), Hugging Face rotates the two halves of each
head, so the rows of each q and k head are permuted on the way out and back on the way in
(the same permutation as transformers' convert_llama_weights_to_hf); so are the q and k
biases (Qwen2) and the channels of the q and k norms (Qwen3), which act on the same
channels before rope.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from shardline.workers.engine.models.llama.config import ModelArgs

_TOP = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "attention.wq.bias": "self_attn.q_proj.bias",
    "attention.wk.bias": "self_attn.k_proj.bias",
    "attention.wv.bias": "self_attn.v_proj.bias",
    "attention.q_norm.weight": "self_attn.q_norm.weight",
    "attention.k_norm.weight": "self_attn.k_norm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_LAYER_BACK = {hf: own for own, hf in _LAYER.items()}
_OWN_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def to_hf_name(name: str) -> str:
    """`layers.3.attention.wq.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    if name in _TOP:
        return _TOP[name]
    match = _OWN_LAYER.match(name)
    if match is None or match.group(2) not in _LAYER:
        raise KeyError(f"no Hugging Face name for parameter {name}")
    return f"model.layers.{match.group(1)}.{_LAYER[match.group(2)]}"


def from_hf_name(hf_name: str) -> str:
    """The inverse of `to_hf_name`."""
    for own, hf in _TOP.items():
        if hf == hf_name:
            return own
    match = _HF_LAYER.match(hf_name)
    if match is None or match.group(2) not in _LAYER_BACK:
        raise KeyError(f"{hf_name} is not a Llama parameter this model has")
    return f"layers.{match.group(1)}.{_LAYER_BACK[match.group(2)]}"


def rope_heads(name: str, args: ModelArgs) -> int | None:
    """How many heads a tensor's rows hold where they are in rotary order (permuted on
    the way in and out); None for the rest."""
    if name.endswith(("attention.wq.weight", "attention.wq.bias")):
        return args.n_heads
    if name.endswith(("attention.wk.weight", "attention.wk.bias")):
        return args.n_kv_heads
    if name.endswith(("attention.q_norm.weight", "attention.k_norm.weight")):
        return 1  # one head's channels, shared by every head
    return None


def interleaved_to_halves(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """q/k rows of this model -> Hugging Face's order, head by head."""
    rows, rest = w.shape[0], w.shape[1:]
    pairs = w.reshape(n_heads, rows // n_heads // 2, 2, *rest).transpose(1, 2)
    return pairs.reshape(rows, *rest)


def halves_to_interleaved(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Hugging Face q/k rows -> this model's order (the inverse of interleaved_to_halves)."""
    rows, rest = w.shape[0], w.shape[1:]
    halves = w.reshape(n_heads, 2, rows // n_heads // 2, *rest).transpose(1, 2)
    return halves.reshape(rows, *rest)


class LlamaStateDictAdapter:
    """Names and rotary order between this model and LlamaForCausalLM, for one shape."""

    tied = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, args: ModelArgs) -> None:
        self.args = args
        # Tied embeddings are written back tied: no lm_head tensor, as transformers saves.
        self.not_written = frozenset({"output.weight"}) if args.tie_embeddings else frozenset()

    def to_hf_name(self, name: str) -> str:
        return to_hf_name(name)

    def from_hf_name(self, hf_name: str) -> str:
        return from_hf_name(hf_name)

    def to_hf(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        heads = rope_heads(name, self.args)
        return interleaved_to_halves(tensor, heads) if heads else tensor

    def read_hf(
        self, name: str, lazy: Any, shape: tuple[int, ...], offset: tuple[int, ...]
    ) -> torch.Tensor:
        """Read global[offset : offset + shape] in this model's rotary order for q/k
        (whole heads are read, then cut)."""
        box = [slice(o, o + n) for o, n in zip(offset, shape, strict=True)]
        heads = rope_heads(name, self.args)
        if heads is None:
            return lazy[tuple(box)]
        rows = int(lazy.get_shape()[0])
        head_dim = rows // heads
        first, last = offset[0] // head_dim, -(-(offset[0] + shape[0]) // head_dim)
        whole = lazy[(slice(first * head_dim, last * head_dim), *box[1:])]
        ours = halves_to_interleaved(whole, last - first)
        start = offset[0] - first * head_dim
        return ours[start : start + shape[0]]
