"""Records as users keep them, written for tests: the same records as JSON Lines (plain
and gzipped), Parquet and a `datasets` folder; chats; a ChatML tokenizer folder."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

# A template in the shape of the ChatML ones (Qwen2.5, many others), with its own
# end-of-turn marker and a generation prompt.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# The same template with the assistant's text marked for transformers'
# `return_assistant_tokens_mask`.
CHATML_GENERATION = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' + '\\n' }}{% endgeneration %}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# A short template for the byte tokenizer.
PLAIN_CHAT = (
    "{% for m in messages %}<{{ m['role'][0] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<a>{% endif %}"
)


def noise_chats(count: int, seed: int = 0, reply: str = "OK.") -> list[dict[str, Any]]:
    """Conversations whose user turns are random letters and whose reply is always
    `reply`: only the reply can be learned."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        noise = "".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(4, 12)))
        out.append(
            {
                "messages": [
                    {"role": "user", "content": noise},
                    {"role": "assistant", "content": reply},
                ]
            }
        )
    return out


def write_jsonl(records: list[dict[str, Any]], path: Path, gz: bool = False) -> Path:
    lines = "".join(json.dumps(r) + "\n" for r in records).encode()
    path.write_bytes(gzip.compress(lines, mtime=0) if gz else lines)
    return path


def write_parquet(records: list[dict[str, Any]], path: Path, row_group_size: int = 7) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(records), path, row_group_size=row_group_size)
    return path


def write_datasets_folder(records: list[dict[str, Any]], path: Path) -> Path:
    import datasets

    datasets.Dataset.from_list(records).save_to_disk(str(path), num_shards=3)
    return path


def chatml_tokenizer_folder(folder: Path, template: str = CHATML) -> Path:
    """A byte-level tokenizer.json with ChatML's special tokens added, and its
    tokenizer_config.json holding `template` and the eos token, as on the Hub."""
    from tokenizers import AddedToken, Tokenizer

    from shardline.workers.engine.data.tokenizers import byte_tokenizer_json

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_str(byte_tokenizer_json())
    tok.add_special_tokens(
        [AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)]
    )
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder
