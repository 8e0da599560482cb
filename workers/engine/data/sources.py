"""Turning data sources into one flat array of token ids: synthetic, text (tokenized once
and cached on disk as a memmap, token_cache.py) or a file of token ids."""

from __future__ import annotations

import codecs
import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from shardline.workers.contract.data_access import DataAccess
from shardline.workers.contract.sections import DataSource
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.data.token_cache import (
    building,
    cache_dir,
    prune_token_cache,
    stamp_files,
    token_cache_limit,
)
from shardline.workers.engine.data.tokenizers import Tokenizer, load_tokenizer

log = logging.getLogger(__name__)

SYNTHETIC_TOKENS = 1 << 20
SYNTHETIC_RUN = 256
# Text is read and tokenized this many bytes at a time, cut at line ends, so tokenizing
# needs bounded memory whatever the corpus size (a whole file at once took ~17x its size).
TEXT_CHUNK_BYTES = 1 << 20
# A line longer than this many chunks is cut where it is (tokens across the cut may differ
# from a whole-line encoding for subword tokenizers; the byte tokenizer is exact anyway).
MAX_CHUNK_LINES = 8


def token_dtype(vocab_size: int) -> type[np.unsignedinteger]:
    """uint16 while every id fits, uint32 beyond (the nanoGPT .bin convention)."""
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


def synthetic_tokens(vocab_size: int, seed: int) -> np.ndarray:
    """Deterministic random tokens with structure a model can learn.

    Runs of SYNTHETIC_RUN tokens each start at a random id and then follow one fixed random
    permutation of the vocabulary, so loss starts at ln(vocab) and can fall towards zero.
    """
    rng = np.random.default_rng([seed, 0x5EED])
    perm = rng.permutation(vocab_size)
    runs = SYNTHETIC_TOKENS // SYNTHETIC_RUN
    out = np.empty((runs, SYNTHETIC_RUN), dtype=np.int64)
    out[:, 0] = rng.integers(0, vocab_size, size=runs)
    for t in range(1, SYNTHETIC_RUN):
        out[:, t] = perm[out[:, t - 1]]
    return out.reshape(-1).astype(token_dtype(vocab_size))


def text_files(root: Path) -> list[Path]:
    """The file itself, or every file under a folder (recursively, in a stable order)."""
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"data.path: {root} is neither a file nor a folder")
    return sorted(p for p in root.rglob("*") if p.is_file())


def _fingerprint(files: list[Path], tokenizer: Tokenizer, access: DataAccess) -> str:
    h = hashlib.sha256(tokenizer.name.encode())
    stamp_files(h, files, access)
    return h.hexdigest()[:24]


def text_tokens(
    root: Path, tokenizer: Tokenizer, vocab_size: int, access: DataAccess | None = None
) -> np.ndarray:
    """Tokenize a file or folder of UTF-8 text once, then reuse the cached memmap."""
    access = access or DataAccess()
    if tokenizer.vocab_size > vocab_size:
        raise ValueError(
            f"model.vocab_size={vocab_size} is smaller than the tokenizer's "
            f"{tokenizer.vocab_size} tokens; raise model.vocab_size"
        )
    files = text_files(root)
    dtype = token_dtype(vocab_size)
    digest = _fingerprint(files, tokenizer, access)
    cached = cache_dir() / "tokens" / f"{digest}.{np.dtype(dtype).name}"
    if not cached.exists():
        with building(cached):
            if not cached.exists():  # another process may have built it meanwhile
                _build_text_tokens(files, root, tokenizer, dtype, access, cached)
    os.utime(cached)  # used now: the last to go when the cache is pruned
    tokens = np.memmap(cached, dtype=dtype, mode="r")
    prune_token_cache(cached.parent, cached, token_cache_limit())
    return tokens


def _build_text_tokens(
    files: list[Path],
    root: Path,
    tokenizer: Tokenizer,
    dtype: type[np.unsignedinteger],
    access: DataAccess,
    cached: Path,
) -> None:
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".tmp{os.getpid()}")
    try:
        count, skipped = _tokenize_files(files, tokenizer, dtype, access, tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if skipped:
        log.warning("skipped %d of %d files under %s: not UTF-8 text", skipped, len(files), root)
    if not count:
        tmp.unlink(missing_ok=True)
        raise ValueError(f"data.path: no UTF-8 text found under {root}")
    os.replace(tmp, cached)  # atomic: concurrent readers see all of it or nothing
    log.info("tokenized %d files under %s into %d tokens (%s)", len(files), root, count, cached)


def _tokenize_files(
    files: list[Path],
    tokenizer: Tokenizer,
    dtype: type[np.unsignedinteger],
    access: DataAccess,
    out_path: Path,
) -> tuple[int, int]:
    """Append each UTF-8 file's tokens to `out_path`, a chunk at a time; returns (tokens
    written, files skipped as not UTF-8). Memory stays about TEXT_CHUNK_BYTES times a
    small factor (Python ints of one chunk), whatever the corpus size."""
    count = skipped = 0
    # Each file is encoded as one text: its special tokens (BOS, EOS, ...) once around it,
    # not around every chunk.
    prefix, suffix = (np.asarray(ids, dtype=dtype) for ids in tokenizer.affixes())
    with out_path.open("wb") as out:
        for f in files:
            start, written = out.tell(), 0
            try:
                with access.open(f, "data.path") as handle:
                    out.write(prefix.tobytes())
                    for text in text_chunks(handle, TEXT_CHUNK_BYTES):
                        ids = np.asarray(tokenizer.encode_piece(text), dtype=dtype)
                        out.write(ids.tobytes())
                        written += len(ids)
                    out.write(suffix.tobytes())
                    written += len(prefix) + len(suffix)
            except UnicodeDecodeError:
                # Binary files in a folder of text (images, bytecode) are not text: drop
                # what this one wrote before its first undecodable byte.
                out.seek(start)
                out.truncate()
                skipped += 1
                continue
            count += written
    return count, skipped


def text_chunks(handle: BinaryIO, chunk_bytes: int = TEXT_CHUNK_BYTES) -> Iterator[str]:
    """A file's UTF-8 text in pieces of about `chunk_bytes`, each ending at a line end
    (a line longer than MAX_CHUNK_LINES chunks is cut where it is), the last one with
    a "\n" added (a file's tokens end as if the whole file plus a newline were encoded).
    Raises UnicodeDecodeError at the first byte that is not UTF-8."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending = ""
    while True:
        raw = handle.read(chunk_bytes)
        text = pending + decoder.decode(raw, final=not raw)
        if not raw:
            yield text + "\n"
            return
        cut = text.rfind("\n") + 1
        if cut == 0 and len(text) < MAX_CHUNK_LINES * chunk_bytes:
            pending = text  # no line end yet: read on
            continue
        cut = cut or len(text)
        pending = text[cut:]
        yield text[:cut]


def bin_tokens(path: Path, vocab_size: int, access: DataAccess | None = None) -> np.ndarray:
    """A pre-tokenized flat .bin of uint16 (vocab <= 65536) or uint32 ids."""
    if not path.is_file():
        raise FileNotFoundError(f"data.path: no token file at {path}")
    dtype = token_dtype(vocab_size)
    # Map the file that was opened and checked, not whatever the path names a moment later.
    with (access or DataAccess()).open(path, "data.path") as handle:
        if os.fstat(handle.fileno()).st_size % np.dtype(dtype).itemsize:
            raise ValueError(
                f"data.path: {path} is not a whole number of {np.dtype(dtype).name} ids "
                f"(model.vocab_size={vocab_size} selects {np.dtype(dtype).name})"
            )
        return np.memmap(handle, dtype=dtype, mode="r")


def load_tokens(spec: JobSpec, access: DataAccess | None = None) -> np.ndarray:
    """The job's whole token stream (train and held-out) as a 1-D array.

    Files are read under `access`, by default the rules the service put in this process's
    environment (none for `shardline train` on one machine)."""
    access = access or DataAccess.from_env()
    vocab_size = spec.model.resolved()["vocab_size"]
    data = spec.data
    if data.source == DataSource.synthetic:
        return synthetic_tokens(vocab_size, spec.train.seed)
    assert data.path is not None  # the spec requires it for these sources
    if data.source == DataSource.text:
        tokenizer = load_tokenizer(data.tokenizer, access)
        return text_tokens(Path(data.path), tokenizer, vocab_size, access)
    return bin_tokens(Path(data.path), vocab_size, access)
