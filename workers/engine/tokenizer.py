"""Tokenizers: the built-in byte-level one, or a local Hugging Face tokenizer.json."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol

from workers.engine.data_access import DataAccess

BYTE_VOCAB_SIZE = 256


class Tokenizer(Protocol):
    name: str
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255: no files, no training, works on any text."""

    name = "byte"
    vocab_size = BYTE_VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


class HFTokenizer:
    """A `tokenizers` tokenizer.json read from local disk (never fetched from a hub)."""

    def __init__(self, path: Path, access: DataAccess | None = None) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        if not path.is_file():
            raise FileNotFoundError(f"data.tokenizer: no tokenizer file at {path}")
        with (access or DataAccess()).open(path, "data.tokenizer") as handle:
            content = handle.read()
        try:
            self._tok = _Tokenizer.from_str(content.decode("utf-8"))
        except Exception:
            # The parser's message can quote the file; the file may not be the user's.
            raise ValueError(f"data.tokenizer: {path} is not a tokenizer.json") from None
        # Named by content: the token cache must not outlive an edit of the file.
        self.name = f"hf:{hashlib.sha256(content).hexdigest()[:24]}"
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)


def load_tokenizer(spec_value: str, access: DataAccess | None = None) -> Tokenizer:
    """`byte`, or a path to a tokenizer.json (inside the data roots of `access`)."""
    if spec_value == "byte":
        return ByteTokenizer()
    return HFTokenizer(Path(spec_value), access)
