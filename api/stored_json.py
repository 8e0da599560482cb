"""A stored JSON column's text, embedded in a response as it is.

A listing spent a quarter of its server time decoding each job's stored spec and encoding
it again. The text was written by the service's own encoder, so it is already JSON, except
in rows stored before specs refused what JSON cannot carry: those are decoded and take
`api.json_body`'s safe way.
"""

from __future__ import annotations

import re
from typing import Any

from shardline.service.db import load_stored_json

# Tokens a stored text may hold that a response must not pass on as they are: non-finite
# floats (not JSON) and escaped surrogates (a lone one is written "?" by the model). A
# text holding one, even inside a string, is decoded: slower, never wrong. One search in
# C: testing the tokens one by one in Python cost a listing more than the decoding saved.
_DECODE_IF = re.compile(r"NaN|Infinity|\\u[dD]")


class StoredJson:
    """JSON text that `api.json_body` embeds without decoding (a plain class, not a
    dataclass: orjson would encode a dataclass's fields)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    @staticmethod
    def of(text: str) -> StoredJson | Any:
        if _DECODE_IF.search(text):
            return load_stored_json(text)
        return StoredJson(text)

    def value(self) -> Any:
        return load_stored_json(self.text)
