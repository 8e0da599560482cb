"""The Llama family as the engine builds it."""

from __future__ import annotations

from shardline.workers.engine.models.family import ModelFamily, count_params
from shardline.workers.engine.models.llama.config import CONFIG, ModelArgs
from shardline.workers.engine.models.llama.decode import LlamaDecoder
from shardline.workers.engine.models.llama.model import Transformer, flops_per_token, init_std
from shardline.workers.engine.models.llama.parallelize import apply_tensor_parallel
from shardline.workers.engine.models.llama.state_dict_adapter import LlamaStateDictAdapter

FAMILY = ModelFamily(
    config=CONFIG,
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
)
