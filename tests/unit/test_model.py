"""The Llama-style model: shapes, causality, parameter and FLOP counts."""

from __future__ import annotations

import pytest
import torch

from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.models.family import count_params
from shardline.workers.engine.models.llama.config import ModelArgs
from shardline.workers.engine.models.llama.model import Transformer, flops_per_token


def tiny_args(**changes: int) -> ModelArgs:
    resolved = JobSpec.model_validate({"name": "t"}).model.resolved()
    return ModelArgs.from_resolved({**resolved, **changes})


def test_logits_have_vocabulary_width_and_are_causal() -> None:
    torch.manual_seed(0)
    model = Transformer(tiny_args())
    tokens = torch.randint(0, 256, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, 256)
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    # Changing token 10 may change positions >= 10 only.
    assert torch.allclose(model(changed)[:, :10], logits[:, :10], atol=1e-6)
    assert not torch.allclose(model(changed)[:, 10:], logits[:, 10:])


def test_grouped_query_attention_uses_fewer_key_value_weights() -> None:
    args = tiny_args()
    model = Transformer(args)
    wk = model.get_parameter("layers.0.attention.wk.weight")
    assert wk.shape == (args.n_kv_heads * args.head_dim, args.dim)


def test_parameter_count_matches_the_formula() -> None:
    a = tiny_args()
    per_layer = (
        2 * a.dim * a.dim
        + 2 * a.dim * a.n_kv_heads * a.head_dim
        + 3 * a.dim * a.ffn_dim
        + 2 * a.dim
    )
    expected = 2 * a.vocab_size * a.dim + a.n_layers * per_layer + a.dim
    model = Transformer(a)
    assert count_params(model) == expected
    assert count_params(model, exclude_embedding=True) == expected - a.vocab_size * a.dim


@pytest.mark.parametrize(("preset", "billions"), [("125m", 0.12), ("1b", 1.1), ("8b", 8.0)])
def test_presets_have_their_advertised_size(preset: str, billions: float) -> None:
    resolved = JobSpec.model_validate({"name": "t", "model": {"preset": preset}}).model.resolved()
    a = ModelArgs.from_resolved(resolved)
    kv = a.n_kv_heads * a.head_dim
    n = (
        a.n_layers * (2 * a.dim * a.dim + 2 * a.dim * kv + 3 * a.dim * a.ffn_dim)
        + 2 * a.vocab_size * a.dim
    )
    assert n / 1e9 == pytest.approx(billions, rel=0.15)


def test_flops_per_token_is_6n_plus_attention() -> None:
    a = tiny_args()
    assert flops_per_token(a, 1000) == 6000 + 12 * a.n_layers * a.dim * a.seq_len
