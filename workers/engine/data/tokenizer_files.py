"""A job's tokenizer written beside an exported model, so that transformers'
AutoTokenizer loads it: the job's tokenizer.json (and its config files), or the byte
codec written as one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shardline.workers.contract.data_access import DataAccess
from shardline.workers.contract.hf_config import TOKENIZER
from shardline.workers.contract.sections import DataSource, RecordFormat
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.data.chat import TEMPLATE_FILE, given_template
from shardline.workers.engine.data.tokenizers import byte_tokenizer_json

TOKENIZER_CONFIG = "tokenizer_config.json"
# Tokenizer files copied from beside the job's tokenizer.json, where they exist (recent
# transformers keep the chat template in a file of its own).
_TOKENIZER_SIDE_FILES = (TOKENIZER_CONFIG, "special_tokens_map.json", "chat_template.jinja")


def byte_codec(spec: JobSpec) -> bool:
    """Whether the job's token ids are the engine's byte codec's (UTF-8 bytes): not for
    data.source='tokens', whose ids come from a tokenizer Shardline never saw."""
    return spec.data.tokenizer == "byte" and spec.data.source != DataSource.tokens


def _tokenizer_config(spec: JobSpec) -> dict[str, Any]:
    """What AutoTokenizer needs to wrap a bare tokenizer.json."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        # Decoding must give back the text as it was (no spaces removed before punctuation).
        "clean_up_tokenization_spaces": False,
        "model_max_length": spec.model.resolved()["seq_len"],
    }


def write_tokenizer(spec: JobSpec, out: Path, access: DataAccess) -> list[str]:
    """Copy the job's tokenizer.json (and its config files beside it); for 'byte', write
    the byte codec as a tokenizer.json. None for data.source='tokens' (no tokenizer known).
    A chat job's own template (data.chat_template) goes with it as chat_template.jinja,
    which transformers prefers to the one in tokenizer_config.json."""
    written = _write_tokenizer_files(spec, out, access)
    if written and spec.data.format == RecordFormat.chat and spec.data.chat_template:
        text = given_template(spec.data.chat_template, access)
        (out / TEMPLATE_FILE).write_text(text, encoding="utf-8")
        if TEMPLATE_FILE not in written:
            written.append(TEMPLATE_FILE)
    return written


def _write_tokenizer_files(spec: JobSpec, out: Path, access: DataAccess) -> list[str]:
    if spec.data.tokenizer == "byte":
        if not byte_codec(spec):
            return []
        (out / TOKENIZER).write_text(byte_tokenizer_json(), encoding="utf-8")
        # The byte codec has no special tokens: no bos, eos, pad or unk to name.
        side_config = json.dumps(_tokenizer_config(spec), indent=2)
        (out / TOKENIZER_CONFIG).write_text(side_config, encoding="utf-8")
        return [TOKENIZER, TOKENIZER_CONFIG]
    source = Path(spec.data.tokenizer)
    written = []
    with access.open(source, "data.tokenizer") as handle:
        (out / TOKENIZER).write_bytes(handle.read())
    written.append(TOKENIZER)
    for name in _TOKENIZER_SIDE_FILES:
        side = source.parent / name
        if side.is_file():
            with access.open(side, "data.tokenizer") as handle:
                (out / name).write_bytes(handle.read())
            written.append(name)
    if TOKENIZER_CONFIG not in written:
        (out / TOKENIZER_CONFIG).write_text(json.dumps(_tokenizer_config(spec)), encoding="utf-8")
        written.append(TOKENIZER_CONFIG)
    return written
