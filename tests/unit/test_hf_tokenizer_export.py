"""An export carries the job's tokenizer so transformers' AutoTokenizer reads it; a
byte-level job's export carries the engine's byte codec as a tokenizer.json."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from shardline.workers.contract.data_access import DataAccess, DataAccessDenied
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.data.tokenizer_files import write_tokenizer
from shardline.workers.engine.data.tokenizers import ByteTokenizer


def _tokenizer_file(folder: Path) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["hello shardline world"] * 20, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def _spec(tokenizer: str, **data: Any) -> JobSpec:
    return JobSpec.model_validate({"name": "t", "data": {"tokenizer": tokenizer, **data}})


def test_exported_tokenizer_loads_with_autotokenizer(tmp_path: Path) -> None:
    path = _tokenizer_file(tmp_path / "tok")
    out = tmp_path / "out"
    out.mkdir()
    written = write_tokenizer(_spec(str(path)), out, DataAccess())
    assert written == ["tokenizer.json", "tokenizer_config.json"]
    auto = transformers.AutoTokenizer.from_pretrained(out)
    text = "hello shardline world"
    expected = Tokenizer.from_file(str(path)).encode(text).ids
    assert auto.encode(text, add_special_tokens=False) == expected
    assert auto.decode(expected) == text


# Every valid UTF-8 byte (1- to 4-byte characters) and the texts a user types.
EVERY_CHARACTER = "".join(map(chr, range(0xD800))) + "".join(map(chr, range(0xE000, 0x110000, 251)))
TEXTS = [
    "hello world",
    " lead and trail ",
    "é",
    "naïve café",
    "😀 🚀🇫🇷",
    "a\nb\r\n\tc",
    "",
    "x  y",
    "wait , what ? it 's so .",  # spaces a decode's clean-up would remove
]


def test_byte_tokenizer_jobs_export_the_byte_codec(tmp_path: Path) -> None:
    written = write_tokenizer(_spec("byte"), tmp_path, DataAccess())
    assert written == ["tokenizer.json", "tokenizer_config.json"]
    side = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert side["tokenizer_class"] == "PreTrainedTokenizerFast"
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path)
    codec = ByteTokenizer()
    for text in [*TEXTS, EVERY_CHARACTER]:
        ids = auto.encode(text, add_special_tokens=False)
        assert ids == codec.encode(text), text[:40]
        assert auto.decode(ids) == text, text[:40]
    assert auto.all_special_ids == []
    # Decoding what a model emits (any ids, invalid UTF-8, ids past the 256 bytes of a
    # larger vocabulary) gives what the engine's codec gives.
    rng = random.Random(0)
    samples = [[i] for i in range(300)]
    samples += [[rng.randrange(300) for _ in range(rng.randrange(1, 9))] for _ in range(500)]
    for ids in samples:
        assert auto.decode(ids) == codec.decode(ids), ids


def test_pretokenized_jobs_export_no_tokenizer(tmp_path: Path) -> None:
    # data.source 'tokens': the ids come from a tokenizer Shardline never saw.
    spec = _spec("byte", source="tokens", path=str(tmp_path / "tokens.bin"))
    assert write_tokenizer(spec, tmp_path, DataAccess()) == []
    assert list(tmp_path.iterdir()) == []


def test_a_tokenizer_outside_the_data_roots_is_not_copied(tmp_path: Path) -> None:
    path = _tokenizer_file(tmp_path / "elsewhere")
    roots = DataAccess.of([tmp_path / "data"], [])
    with pytest.raises(DataAccessDenied, match=r"data\.tokenizer"):
        write_tokenizer(_spec(str(path)), tmp_path, roots)


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.mark.parametrize("where", ["tokenizer_config.json", "chat_template.jinja"])
def test_the_chat_template_that_came_in_goes_out(tmp_path: Path, where: str) -> None:
    """transformers keeps a chat template in tokenizer_config.json (4.x) or in
    chat_template.jinja (recent): either way the export's AutoTokenizer renders it."""
    path = _tokenizer_file(tmp_path / "tok")
    side: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if where == "tokenizer_config.json":
        side["chat_template"] = CHAT_TEMPLATE
    else:
        (tmp_path / "tok" / where).write_text(CHAT_TEMPLATE)
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps(side))
    out = tmp_path / "out"
    out.mkdir()
    written = write_tokenizer(_spec(str(path)), out, DataAccess())
    assert where in written
    auto = transformers.AutoTokenizer.from_pretrained(out)
    chat = [{"role": "user", "content": "hello"}]
    rendered = auto.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|user|>hello\n<|assistant|>"


def test_a_chat_job_s_own_template_goes_out_and_renders_as_it_trained(tmp_path: Path) -> None:
    from tests.support.records import PLAIN_CHAT

    spec = JobSpec.model_validate(
        {
            "name": "chat",
            "data": {
                "source": "records",
                "path": "chats.jsonl",
                "format": "chat",
                "chat_template": PLAIN_CHAT,
            },
        }
    )
    written = write_tokenizer(spec, tmp_path, DataAccess())
    assert "chat_template.jinja" in written
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert loaded.apply_chat_template(messages, tokenize=False) == "<u>hi\n<a>yo\n"
