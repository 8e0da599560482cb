"""A trained model on this machine, for `shardline generate`: an exported Hugging Face
folder or a checkpoint folder, with the text codec that goes with it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from shardline.workers.contract.hf_config import CONFIG, TOKENIZER, family_of_config
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.checkpoint.reader import open_checkpoint, read_model_state
from shardline.workers.engine.data.tokenizers import ByteTokenizer, Tokenizer, load_tokenizer
from shardline.workers.engine.hf_weights import load_init_from
from shardline.workers.engine.models.family import FamilyModule, ModelFamily, load_family
from shardline.workers.engine.models.registry import family_of
from shardline.workers.storage.checkpoints import MANIFEST


@dataclass
class LocalModel:
    model: nn.Module
    family: ModelFamily
    codec: Tokenizer
    eos_token_id: int | None


def _empty_model(family: ModelFamily, args: Any, device: torch.device) -> nn.Module:
    # Built on the meta device and given storage once: the weights are loaded next, so
    # the random init would be wasted work on a large model.
    with torch.device("meta"):
        model = family.build(args)
    model.to_empty(device=device)
    # Buffers are not in any checkpoint (the rotary tables): computed again.
    with torch.no_grad():
        cast(FamilyModule, model).reset_buffers()
    return model


def _from_hf_folder(folder: Path, device: torch.device) -> LocalModel:
    config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    family = load_family(family_of_config(config))
    shape = family.config.shape_from_hf(config)
    seq_len = int(config.get("max_position_embeddings", 2048))
    args = family.args({"seq_len": seq_len, **shape, **family.config.fixed_args})
    model = _empty_model(family, args, device)
    load_init_from([model], folder, family, args)
    codec: Tokenizer
    marker = config.get("shardline")
    if isinstance(marker, dict) and marker.get("tokenizer") == "byte":
        # Exported from a byte-level job (its tokenizer.json, where there is one, is this
        # codec written out for transformers): the engine's own codec, as in training.
        codec = ByteTokenizer()
    elif (folder / TOKENIZER).is_file():
        codec = load_tokenizer(str(folder / TOKENIZER))
    elif shape["vocab_size"] >= 256:
        codec = ByteTokenizer()
    else:
        raise ValueError(f"{folder} has no {TOKENIZER} and the vocabulary is not byte-level")
    eos = config.get("eos_token_id")
    return LocalModel(model, family, codec, eos if isinstance(eos, int) else None)


def _from_checkpoint(path: Path, device: torch.device) -> LocalModel:
    ckpt = open_checkpoint(str(path))
    spec = JobSpec.model_validate(ckpt.manifest["spec"])
    family = load_family(family_of(spec.model))
    model = _empty_model(family, family.args(spec.model.resolved()), device)
    model.load_state_dict(read_model_state(ckpt), strict=True)
    return LocalModel(model, family, load_tokenizer(spec.data.tokenizer), None)


def load_local_model(path: Path, device: torch.device) -> LocalModel:
    """An exported Hugging Face folder (config.json) or a committed checkpoint
    (manifest.json), on `device`, in fp32."""
    if (path / CONFIG).is_file():
        return _from_hf_folder(path, device)
    if (path / MANIFEST).is_file():
        return _from_checkpoint(path, device)
    raise FileNotFoundError(
        f"{path} is neither an exported model ({CONFIG}) nor a checkpoint ({MANIFEST})"
    )
