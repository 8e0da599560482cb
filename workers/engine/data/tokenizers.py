"""Tokenizers: the built-in byte-level one, or a local Hugging Face tokenizer.json."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol

import numpy as np

from shardline.workers.contract.data_access import DataAccess

BYTE_VOCAB_SIZE = 256


class Tokenizer(Protocol):
    name: str
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def encode_piece(self, text: str) -> list[int]:
        """Tokens of a piece of a longer text: without the special tokens (BOS, EOS, ...)
        that `encode` puts around a whole text."""
        ...

    def affixes(self) -> tuple[list[int], list[int]]:
        """The special tokens `encode` puts before and after a whole text."""
        ...

    def encode_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """`encode_piece(text)` and, for each token, the index of the character it
        starts at (a chat template's output holds its special tokens as text); both
        int64 arrays."""
        ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255: no files, no training, works on any text."""

    name = "byte"
    vocab_size = BYTE_VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_piece(self, text: str) -> list[int]:
        return self.encode(text)

    def affixes(self) -> tuple[list[int], list[int]]:
        return [], []

    def encode_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        # A character starts at each byte that is not a UTF-8 continuation (10xxxxxx).
        starts = np.cumsum((raw & 0xC0) != 0x80, dtype=np.int64) - 1
        return raw.astype(np.int64), starts

    def decode(self, ids: list[int]) -> str:
        # A model's vocabulary may be larger than 256: ids past the bytes are not text.
        return bytes(i for i in ids if i < BYTE_VOCAB_SIZE).decode("utf-8", errors="replace")


def byte_level_chars() -> list[str]:
    """The character that stands for each byte 0..255 in a `tokenizers` ByteLevel
    vocabulary (GPT-2's table: printable Latin-1 bytes stand for themselves, the others for
    the characters from U+0100 on, in byte order)."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    chars: list[str] = []
    shifted = 0
    for byte in range(BYTE_VOCAB_SIZE):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(BYTE_VOCAB_SIZE + shifted))
            shifted += 1
    return chars


def byte_tokenizer_json() -> str:
    """`ByteTokenizer` as a `tokenizers` tokenizer.json, for transformers' AutoTokenizer:
    token id = UTF-8 byte, no special tokens, as `ByteTokenizer.encode` and `decode` do.

    A BPE model with no merges over the 256 ByteLevel characters: the ByteLevel
    pre-tokenizer (no prefix space, no regex split) turns every byte of the text into its
    character, each character is one token, and the ByteLevel decoder turns them back into
    bytes (invalid UTF-8 becomes U+FFFD, as in `ByteTokenizer.decode`)."""
    from tokenizers import Tokenizer as _Tokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in enumerate(byte_level_chars())}
    tok = _Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return str(tok.to_str(pretty=True))


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

    def encode_piece(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def affixes(self) -> tuple[list[int], list[int]]:
        # The post-processor's template is not exposed: find where a plain encoding sits
        # inside the special one (a template wraps it, e.g. [BOS] ... [EOS]).
        plain, special = self.encode_piece("a"), self.encode("a")
        for start in range(len(special) - len(plain) + 1):
            if special[start : start + len(plain)] == plain:
                return special[:start], special[start + len(plain) :]
        return [], []

    def encode_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        encoding = self._tok.encode(text, add_special_tokens=False)
        starts = [start for start, _ in encoding.offsets]
        return np.asarray(encoding.ids, dtype=np.int64), np.asarray(starts, dtype=np.int64)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids))


def load_tokenizer(spec_value: str, access: DataAccess | None = None) -> Tokenizer:
    """`byte`, or a path to a tokenizer.json (inside the data roots of `access`)."""
    if spec_value == "byte":
        return ByteTokenizer()
    return HFTokenizer(Path(spec_value), access)
