"""An export carries the job's tokenizer so transformers' AutoTokenizer reads it."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from workers.contract.data_access import DataAccess, DataAccessDenied
from workers.contract.spec import JobSpec
from workers.engine.hf_export import write_tokenizer

transformers = pytest.importorskip("transformers")


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


def _spec(tokenizer: str) -> JobSpec:
    return JobSpec.model_validate({"name": "t", "data": {"tokenizer": tokenizer}})


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


def test_byte_tokenizer_jobs_export_no_tokenizer_files(tmp_path: Path) -> None:
    assert write_tokenizer(_spec("byte"), tmp_path, DataAccess()) == []
    assert list(tmp_path.iterdir()) == []


def test_a_tokenizer_outside_the_data_roots_is_not_copied(tmp_path: Path) -> None:
    path = _tokenizer_file(tmp_path / "elsewhere")
    roots = DataAccess.of([tmp_path / "data"], [])
    with pytest.raises(DataAccessDenied, match=r"data\.tokenizer"):
        write_tokenizer(_spec(str(path)), tmp_path, roots)
