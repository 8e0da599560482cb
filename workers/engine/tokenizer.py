"""Tokenizers: the built-in byte-level one, or a local Hugging Face tokenizer.json."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

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

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        if not path.is_file():
            raise FileNotFoundError(f"data.tokenizer: no tokenizer file at {path}")
        self._tok = _Tokenizer.from_file(str(path))
        self.name = f"hf:{path.resolve()}"
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)


def load_tokenizer(spec_value: str) -> Tokenizer:
    """`byte`, or a path to a tokenizer.json."""
    if spec_value == "byte":
        return ByteTokenizer()
    return HFTokenizer(Path(spec_value))
