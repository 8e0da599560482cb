"""Records turned into token documents, once per corpus: each record's text (or rendered
conversation) as token ids, whether the loss learns each token, and where each document
starts. Kept in the cache folder as memmaps named by what made them (files, tokenizer,
template, fields), written a record at a time so memory stays bounded by one record.

A text document longer than a window (model.seq_len + 1 tokens) is cut into windows, each
its own document; a conversation is truncated at the window or dropped, as
`data.overflow` says, and counted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from shardline.workers.contract.data_access import DataAccess
from shardline.workers.contract.sections import DataSpec, Overflow, RecordFormat
from shardline.workers.engine.data.chat import (
    ChatTemplate,
    ChatTemplateError,
    check_messages,
    load_chat_template,
    render_conversation,
)
from shardline.workers.engine.data.records import BadRecord, Record, read_records, record_files
from shardline.workers.engine.data.token_cache import building, cache_dir, stamp_files
from shardline.workers.engine.data.tokenizers import Tokenizer, load_tokenizer

log = logging.getLogger(__name__)

# A progress line every this many records while a corpus is tokenized.
PROGRESS_RECORDS = 50_000
_COUNTS = "counts.json"


@dataclass
class Documents:
    """Documents one after another: document i is tokens[starts[i]:starts[i + 1]], and
    learned[j] says whether token j is a loss target."""

    tokens: np.ndarray
    learned: np.ndarray  # uint8
    starts: np.ndarray  # int64, one more than there are documents
    counts: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.starts) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.starts)

    def loss_tokens(self) -> np.ndarray:
        """Per document, how many of its tokens the loss counts: learned tokens after the
        first (a document's first token is never predicted from it; none is empty)."""
        seen = np.concatenate(([0], np.cumsum(self.learned, dtype=np.int64)))
        heads = self.starts[:-1]
        return seen[self.starts[1:]] - seen[heads] - self.learned[heads].astype(np.int64)


@dataclass
class Recipe:
    """How records become documents: what names a cached corpus."""

    data: DataSpec
    tokenizer: Tokenizer
    template: ChatTemplate | None
    window: int

    def digest(self, files: list[Path], access: DataAccess) -> str:
        d = self.data
        h = hashlib.sha256()
        parts: list[Any] = [
            "records-v1",
            self.tokenizer.name,
            d.format.value,
            d.text_field,
            d.messages_field,
            d.train_on_prompt,
            d.overflow.value,
            d.skip_bad_records,
            self.window,
            self.template.source if self.template else None,
            self.template.special_tokens if self.template else None,
        ]
        h.update(json.dumps(parts, default=str).encode())
        stamp_files(h, files, access)
        return h.hexdigest()[:24]


def record_documents(
    data: DataSpec, seq_len: int, vocab_size: int, access: DataAccess | None = None
) -> Documents:
    """The documents of `data` (source: records) for windows of seq_len + 1 tokens."""
    access = access or DataAccess.from_env()
    assert data.path is not None
    recipe = recipe_of(data, seq_len, vocab_size, access)
    files = record_files(data.path)
    folder = cache_dir() / "records" / recipe.digest(files, access)
    if not (folder / _COUNTS).is_file():
        with building(folder):
            if not (folder / _COUNTS).is_file():  # another process may have built it
                _build(recipe, read_records(files, access), folder, _dtype(vocab_size))
    return _open(folder, _dtype(vocab_size))


def recipe_of(data: DataSpec, seq_len: int, vocab_size: int, access: DataAccess) -> Recipe:
    """The tokenizer and template that turn `data`'s records into documents."""
    tokenizer = load_tokenizer(data.tokenizer, access)
    if tokenizer.vocab_size > vocab_size:
        raise BadRecord(
            f"model.vocab_size={vocab_size} is smaller than the tokenizer's "
            f"{tokenizer.vocab_size} tokens; raise model.vocab_size",
            "model.vocab_size",
        )
    template = None
    if data.format == RecordFormat.chat:
        try:
            template = load_chat_template(data.chat_template, data.tokenizer, access)
        except ChatTemplateError as err:
            raise BadRecord(str(err), "data.chat_template") from None
    return Recipe(data, tokenizer, template, seq_len + 1)


def _dtype(vocab_size: int) -> type[np.unsignedinteger]:
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


def _open(folder: Path, dtype: type[np.unsignedinteger]) -> Documents:
    os.utime(folder)  # used now
    counts = json.loads((folder / _COUNTS).read_text(encoding="utf-8"))
    starts = np.load(folder / "starts.npy")
    tokens: np.ndarray
    learned: np.ndarray
    if counts["tokens"]:
        tokens = np.memmap(folder / "tokens.bin", dtype=dtype, mode="r")
        learned = np.memmap(folder / "learned.bin", dtype=np.uint8, mode="r")
    else:
        tokens, learned = np.zeros(0, dtype=dtype), np.zeros(0, dtype=np.uint8)
    return Documents(tokens, learned, starts, counts)


def _build(
    recipe: Recipe, records: Iterator[Record], folder: Path, dtype: type[np.unsignedinteger]
) -> None:
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        counts = _write(recipe, records, tmp, dtype)
        if not counts["documents"]:
            raise BadRecord(
                f"data.path: no documents found in {recipe.data.path} "
                f"({counts['records']} records, {counts['skipped']} skipped, "
                f"{counts['dropped']} dropped)"
            )
        (tmp / _COUNTS).write_text(json.dumps(counts), encoding="utf-8")
        try:
            os.replace(tmp, folder)  # atomic; another process may have made it first
        except OSError:
            if not (folder / _COUNTS).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("records of %s: %s", recipe.data.path, counts)


def _write(
    recipe: Recipe, records: Iterator[Record], out: Path, dtype: type[np.unsignedinteger]
) -> dict[str, int]:
    counts = dict.fromkeys(("records", "documents", "tokens", "skipped", "truncated", "dropped"), 0)
    starts = [0]
    with (out / "tokens.bin").open("wb") as tokens, (out / "learned.bin").open("wb") as learned:
        # A file that cannot be read on raises out of `records`: never skipped.
        for record in records:
            counts["records"] += 1
            try:
                pieces = record_pieces(recipe, record, counts)
            except BadRecord as err:
                if not recipe.data.skip_bad_records:
                    raise
                counts["skipped"] += 1
                if counts["skipped"] <= 3:
                    log.warning("skipped: %s", err)
                continue
            for ids, mask in pieces:
                _append(tokens, learned, ids, mask, dtype)
                starts.append(starts[-1] + len(ids))
                counts["documents"] += 1
            if counts["records"] % PROGRESS_RECORDS == 0:
                log.info("tokenized %d records, %d tokens", counts["records"], starts[-1])
    counts["tokens"] = starts[-1]
    np.save(out / "starts.npy", np.asarray(starts, dtype=np.int64))
    return counts


def _append(
    tokens: BinaryIO,
    learned: BinaryIO,
    ids: np.ndarray,
    mask: np.ndarray,
    dtype: type[np.unsignedinteger],
) -> None:
    tokens.write(np.asarray(ids, dtype=dtype).tobytes())
    learned.write(np.asarray(mask, dtype=np.uint8).tobytes())


def record_pieces(
    recipe: Recipe, record: Record, counts: dict[str, int]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The documents one record gives: (token ids, learned) pairs of arrays."""
    data, window = recipe.data, recipe.window
    if record.error is not None:
        raise BadRecord(record.error)
    if data.format == RecordFormat.text:
        text = record.values.get(data.text_field)
        if not isinstance(text, str):
            what = "has no" if text is None else "has a non-text"
            raise BadRecord(
                f"data: {record.where} {what} field {data.text_field!r} (data.text_field)",
                "data.text_field",
            )
        ids = np.asarray(recipe.tokenizer.encode(text), dtype=np.int64)
        return [
            (ids[i : i + window], np.ones(len(ids[i : i + window]), dtype=bool))
            for i in range(0, len(ids), window)
        ]
    messages = check_messages(
        record.values.get(data.messages_field), record.where, data.messages_field
    )
    assert recipe.template is not None
    try:
        chat_ids, mask = render_conversation(
            recipe.template, recipe.tokenizer, messages, data.train_on_prompt
        )
    except ChatTemplateError as err:
        raise BadRecord(f"data: {record.where}: {err}", "data.chat_template") from None
    cut = max(0, len(chat_ids) - window)
    if cut and data.overflow == Overflow.drop:
        counts["dropped"] += 1
        return []
    chat_ids, mask = chat_ids[:window], mask[:window]
    if not mask[1:].any():  # nothing left to learn (no assistant turn in the window)
        counts["dropped"] += 1
        return []
    counts["truncated"] += cut > 0
    return [(chat_ids, mask)]
