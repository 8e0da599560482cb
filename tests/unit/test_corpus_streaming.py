"""Text corpora are tokenized a chunk at a time: the same tokens as encoding each whole
file, with memory bounded whatever the corpus size."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shardline.workers.engine.data import sources as corpus
from shardline.workers.engine.data.sources import text_chunks, text_tokens
from shardline.workers.engine.data.tokenizers import ByteTokenizer

TEXT = "héllo wörld, the cat sat on the mat.\n" * 40 + "a last line without an end"


def test_chunks_end_at_line_ends_and_join_to_the_text_plus_a_newline() -> None:
    pieces = list(text_chunks(io.BytesIO(TEXT.encode()), chunk_bytes=50))
    assert "".join(pieces) == TEXT + "\n"
    assert len(pieces) > 10 and all(p.endswith("\n") for p in pieces)


def test_a_character_split_between_reads_is_decoded_whole() -> None:
    # 3-byte reads cut "é" and "ö" (2 bytes each) in half again and again.
    pieces = list(text_chunks(io.BytesIO("éöé\néö".encode()), chunk_bytes=3))
    assert "".join(pieces) == "éöé\néö\n"


def test_a_line_longer_than_the_bound_is_cut() -> None:
    pieces = list(text_chunks(io.BytesIO(b"x" * 1000), chunk_bytes=10))
    assert "".join(pieces) == "x" * 1000 + "\n"
    assert max(len(p) for p in pieces) <= corpus.MAX_CHUNK_LINES * 10 + 10


def test_bytes_that_are_not_utf8_raise() -> None:
    with pytest.raises(UnicodeDecodeError):
        list(text_chunks(io.BytesIO(b"fine\n" * 100 + b"\xff\xfe"), chunk_bytes=16))


def test_tokens_are_those_of_whole_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    from shardline.workers.engine.data.tokenizers import load_tokenizer

    monkeypatch.setenv("SHARDLINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(corpus, "TEXT_CHUNK_BYTES", 64)  # many chunks per file
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT, encoding="utf-8")
    (folder / "b.txt").write_text("the dog sat on the log.\n" * 30, encoding="utf-8")
    (folder / "c.bin").write_bytes(b"text at first\n" * 20 + b"\xff\xfe")  # skipped whole
    whole = [TEXT + "\n", "the dog sat on the log.\n" * 30 + "\n"]

    tokens = text_tokens(folder, ByteTokenizer(), 256)
    assert bytes(tokens.tolist()) == "".join(whole).encode()

    trained = Tokenizer(models.BPE(unk_token="[UNK]"))
    trained.pre_tokenizer = pre_tokenizers.Whitespace()
    trained.train_from_iterator(whole, trainers.BpeTrainer(vocab_size=80, special_tokens=["[UNK]"]))
    trained.save(str(tmp_path / "tokenizer.json"))
    hf_tokens = text_tokens(folder, load_tokenizer(str(tmp_path / "tokenizer.json")), 256)
    assert hf_tokens.tolist() == [i for text in whole for i in trained.encode(text).ids]

    # A post-processor that wraps a text in BOS/EOS does so once per file, not per chunk.
    trained.add_special_tokens(["<s>", "</s>"])
    trained.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        special_tokens=[("<s>", trained.token_to_id("<s>")), ("</s>", trained.token_to_id("</s>"))],
    )
    trained.save(str(tmp_path / "wrapped.json"))
    wrapped = text_tokens(folder, load_tokenizer(str(tmp_path / "wrapped.json")), 256)
    assert wrapped.tolist() == [i for text in whole for i in trained.encode(text).ids]
    assert wrapped.tolist().count(trained.token_to_id("<s>")) == len(whole)


PEAK = """
import resource, sys
from pathlib import Path
from shardline.workers.engine.data.sources import text_tokens
from shardline.workers.engine.data.tokenizers import ByteTokenizer
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tokens = text_tokens(Path(sys.argv[1]), ByteTokenizer(), 256)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(len(tokens), (after - before) * 1024)
"""
CORPUS_BYTES = 48 << 20
PEAK_BOUND_BYTES = 96 << 20


def test_peak_memory_is_bounded_for_a_corpus_larger_than_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    line = ("the quick brown fox jumps over the lazy dog " * 3 + "\n").encode()
    with path.open("wb") as f:
        for _ in range(CORPUS_BYTES // (len(line) * 1000) + 1):
            f.write(line * 1000)
    size = path.stat().st_size
    assert size > PEAK_BOUND_BYTES // 2
    done = subprocess.run(
        [sys.executable, "-c", PEAK, str(path)],
        env={"SHARDLINE_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"},
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    count, grown = (int(x) for x in done.stdout.split())
    assert count == size + 1  # every byte, and the newline after the file
    assert grown < PEAK_BOUND_BYTES, f"peak memory grew {grown >> 20} MiB for {size >> 20} MiB"
    assert np.fromfile(next((tmp_path / "cache" / "tokens").iterdir()), np.uint16)[-1] == 10
