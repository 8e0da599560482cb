"""The Llama family as the engine builds it, and the builder the Llama-like families
(Qwen2, Qwen3, Mistral) share: the same module, plan and adapters, with their switches."""

from __future__ import annotations

from shardline.workers.engine.models.family import ModelFamily, count_params
from shardline.workers.engine.models.llama.config import CONFIG, DecoderConfig, ModelArgs
from shardline.workers.engine.models.llama.decode import LlamaDecoder
from shardline.workers.engine.models.llama.model import Transformer, flops_per_token, init_std
from shardline.workers.engine.models.llama.parallelize import apply_tensor_parallel
from shardline.workers.engine.models.llama.state_dict_adapter import LlamaStateDictAdapter


def tied_parameters(args: ModelArgs) -> dict[str, str]:
    """The head is the embedding where the model ties them."""
    return {"output.weight": "tok_embeddings.weight"} if args.tie_embeddings else {}


def decoder_family(config: DecoderConfig) -> ModelFamily:
    """A Llama-like family read and written through `config`."""
    return ModelFamily(
        config=config,
        args=ModelArgs.from_resolved,
        build=Transformer,
        parallelize=apply_tensor_parallel,
        first_stage_parts=("tok_embeddings",),
        last_stage_parts=("norm", "output"),
        init_std=lambda name, args: init_std(name, args),
        flops_per_token=lambda args, model: flops_per_token(
            args, count_params(model, exclude_embedding=True)
        ),
        state_dict_adapter=LlamaStateDictAdapter,
        decoder=LlamaDecoder,
        tied_parameters=tied_parameters,
    )


FAMILY = decoder_family(CONFIG)
