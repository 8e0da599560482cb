"""Batches depend only on (seed, step); sources read real files and check their contents."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.data.loader import BatchLoader, build_loader
from shardline.workers.engine.data.sources import SYNTHETIC_RUN, synthetic_tokens, text_tokens
from shardline.workers.engine.data.tokenizers import ByteTokenizer


def loader(tokens: np.ndarray, dp_rank: int = 0, dp_size: int = 1, seed: int = 0) -> BatchLoader:
    return BatchLoader(
        tokens=tokens,
        seq_len=8,
        global_batch_size=8,
        dp_rank=dp_rank,
        dp_size=dp_size,
        seed=seed,
        val_fraction=0.1,
        vocab_size=1 << 16,
    )


def test_ranks_slices_make_up_the_single_process_batch() -> None:
    tokens = synthetic_tokens(256, seed=3)
    whole = loader(tokens).train_batch(5).tokens
    parts = [loader(tokens, r, 4).train_batch(5).tokens for r in range(4)]
    assert torch.equal(torch.cat(parts), whole)
    assert whole.shape == (8, 9)


def test_batches_differ_by_step_and_seed_but_repeat_exactly() -> None:
    tokens = synthetic_tokens(256, seed=3)
    five = loader(tokens).train_batch(5).tokens
    assert torch.equal(five, loader(tokens).train_batch(5).tokens)
    assert not torch.equal(five, loader(tokens).train_batch(6).tokens)
    assert not torch.equal(five, loader(tokens, seed=1).train_batch(5).tokens)


def test_validation_rows_come_only_from_the_held_out_tail() -> None:
    tokens = np.arange(1000, dtype=np.uint16)
    held = loader(tokens)
    assert len(held.val_tokens) == 100
    for batch in (b.tokens for b in held.val_batches()):
        assert int(batch.min()) >= 900
        # Each row is a contiguous window of the stream.
        assert torch.equal(batch[:, 1:] - batch[:, :-1], torch.ones(8, 8, dtype=torch.int64))
    assert int(held.train_batch(1).tokens.max()) < 900


def test_synthetic_tokens_follow_a_learnable_permutation() -> None:
    vocab = 64
    runs = synthetic_tokens(vocab, seed=0).astype(np.int64).reshape(-1, SYNTHETIC_RUN)
    before, after = runs[:, :-1].ravel(), runs[:, 1:].ravel()
    successor = np.full(vocab, -1)
    successor[before] = after
    # One map for the whole stream: every token is always followed by the same token...
    assert np.array_equal(successor[before], after)
    # ... and that map is a permutation of the whole vocabulary that moves tokens.
    assert sorted(successor.tolist()) == list(range(vocab))
    assert int((successor != np.arange(vocab)).sum()) > vocab // 2
    # Runs start at every id, so a model must learn the map, not memorise one sequence.
    assert set(runs[:, 0].tolist()) == set(range(vocab))


class CountingTokenizer(ByteTokenizer):
    """Bytes, counting how much text it was asked to encode."""

    def __init__(self) -> None:
        self.encoded_chars = 0

    def encode(self, text: str) -> list[int]:
        self.encoded_chars += len(text)
        return super().encode(text)


def test_text_folder_is_read_recursively_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDLINE_CACHE_DIR", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.txt").write_text("héllo", encoding="utf-8")
    (corpus / "sub" / "b.md").write_text("world", encoding="utf-8")
    (corpus / "image.bin").write_bytes(b"\xff\xfe\x00\x81")  # not UTF-8: skipped
    tokenizer = CountingTokenizer()
    tokens = text_tokens(corpus, tokenizer, 256)
    assert bytes(tokens.tolist()) == "héllo\nworld\n".encode()
    cached = list((tmp_path / "cache" / "tokens").iterdir())
    assert len(cached) == 1 and cached[0].suffix == ".uint16"
    encoded = tokenizer.encoded_chars
    # The second read maps the cached file and tokenizes nothing.
    again = text_tokens(corpus, tokenizer, 256)
    assert tokenizer.encoded_chars == encoded
    assert isinstance(again, np.memmap) and Path(str(again.filename)) == cached[0]
    assert np.array_equal(again, tokens)


def test_token_bin_is_memory_mapped_and_ids_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    np.arange(5000, dtype=np.uint16).tofile(path)
    spec = JobSpec.model_validate(
        {
            "name": "t",
            "data": {"source": "tokens", "path": str(path)},
            "model": {"vocab_size": 8192, "seq_len": 16},
        }
    )
    good = build_loader(spec, 0, 1)
    assert good.train_batch(1).tokens.shape == (8, 17)
    small = JobSpec.model_validate(
        {**spec.model_dump(), "model": {"vocab_size": 1000, "seq_len": 16}}
    )
    with pytest.raises(ValueError, match=r"out of range for model\.vocab_size=1000"):
        build_loader(small, 0, 1).train_batch(1)


def test_token_bin_beyond_65536_ids_is_uint32(tmp_path: Path) -> None:
    vocab = 100_000
    ids = np.concatenate(
        [np.arange(60_000, 65_000, dtype=np.uint32), np.arange(90_000, 95_000, dtype=np.uint32)]
    )  # ids on both sides of 65,536
    path = tmp_path / "data.bin"
    ids.tofile(path)
    spec = JobSpec.model_validate(
        {
            "name": "t",
            "data": {"source": "tokens", "path": str(path)},
            "model": {"vocab_size": vocab, "seq_len": 16},
        }
    )
    flat = build_loader(spec, 0, 1)
    assert isinstance(flat, BatchLoader)
    tokens = flat.tokens
    assert tokens.dtype == np.uint32 and np.array_equal(tokens, ids)
    # A file that is not whole uint32 ids is refused, naming the dtype the vocab selects.
    (tmp_path / "odd.bin").write_bytes(ids.tobytes()[:-2])
    odd = JobSpec.model_validate(
        {**spec.model_dump(), "data": {"source": "tokens", "path": str(tmp_path / "odd.bin")}}
    )
    with pytest.raises(ValueError, match="not a whole number of uint32 ids"):
        build_loader(odd, 0, 1)


def test_too_little_data_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="training split has 8 tokens, fewer than"):
        loader(np.zeros(8, dtype=np.uint16))
    with pytest.raises(ValueError, match=r"held-out split has 4 tokens; raise data\.val_fraction"):
        loader(np.zeros(44, dtype=np.uint16))


def test_text_with_a_local_tokenizer_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from shardline.workers.engine.data.tokenizers import load_tokenizer

    monkeypatch.setenv("SHARDLINE_CACHE_DIR", str(tmp_path / "cache"))
    text = "the cat sat on the mat. the dog sat on the log.\n" * 20
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"]))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")

    loaded = load_tokenizer(str(path))
    tokens = text_tokens(corpus, loaded, 256)
    assert tokens.tolist() == tok.encode(text + "\n").ids
    assert int(tokens.max()) < loaded.vocab_size <= 60
    with pytest.raises(ValueError, match=r"model\.vocab_size=8 is smaller than the tokenizer"):
        text_tokens(corpus, loaded, 8)
    with pytest.raises(FileNotFoundError, match="no tokenizer file"):
        load_tokenizer(str(tmp_path / "missing.json"))


def test_the_token_cache_drops_the_corpora_used_longest_ago_beyond_its_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDLINE_CACHE_DIR", str(tmp_path / "cache"))
    # Each corpus is 1,000 bytes of text: 2,000 bytes of uint16 tokens; two fit, not three.
    monkeypatch.setenv("SHARDLINE_TOKEN_CACHE_BYTES", "5000")
    cached = tmp_path / "cache" / "tokens"
    corpora = {}
    for name in "abc":
        corpora[name] = tmp_path / f"{name}.txt"
        corpora[name].write_text(name * 999 + "\n")
    tok = ByteTokenizer()

    def held() -> set[str]:
        """The corpora in the cache, by their first character."""
        return {chr(int(np.fromfile(f, dtype=np.uint16)[0])) for f in cached.iterdir()}

    for when, name in ((1000.0, "a"), (2000.0, "b")):  # "a" used first, then "b"
        text_tokens(corpora[name], tok, vocab_size=256)
        for f in cached.iterdir():
            if f.stat().st_mtime > 10_000:  # the file just written
                os.utime(f, (when, when))
    text_tokens(corpora["a"], tok, vocab_size=256)  # a cache hit: "a" is the newest use
    assert held() == {"a", "b"}
    text_tokens(corpora["c"], tok, vocab_size=256)  # 6,000 bytes: over the limit
    assert held() == {"a", "c"}  # "b", used longest ago, went
    assert sum(f.stat().st_size for f in cached.iterdir()) <= 5000


def test_the_loader_s_position_is_a_state_dict_a_restore_gives_back() -> None:
    tokens = synthetic_tokens(256, seed=3)
    first = loader(tokens)
    for step in range(1, 6):
        first.train_batch(step)
    saved = first.state_dict()
    assert saved == {"step": 5}
    again = loader(tokens)
    again.load_state_dict(saved)
    assert again.state_dict() == saved
    # The next batch depends on the step alone: the restored loader gives the same one.
    assert torch.equal(again.train_batch(6).tokens, first.train_batch(6).tokens)


def test_a_batch_counts_every_target_of_the_global_batch() -> None:
    tokens = synthetic_tokens(256, seed=3)
    batch = loader(tokens, 1, 4).train_batch(2)
    assert batch.tokens.shape == (2, 9)  # a quarter of the 8 rows, seq_len + 1 each
    assert batch.global_loss_tokens == 8 * 8
