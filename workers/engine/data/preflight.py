"""What is checked of a job's data when it is submitted, before any rank starts: the
first records turned into documents (a file that is not its format, a record without the
text field, a chat turn with an unknown role, a template that fails), and a file of
records given as plain text. Torch-free: the control plane runs it.

A problem past the sample is found by the ranks when they read the whole corpus, and
fails the job with the same message.
"""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

from shardline.workers.contract.data_access import DataAccess, DataAccessDenied
from shardline.workers.contract.sections import DataSource, DataSpec
from shardline.workers.engine.data.documents import recipe_of, record_pieces
from shardline.workers.engine.data.records import (
    JSONL_SUFFIXES,
    PARQUET_SUFFIXES,
    BadRecord,
    read_records,
    record_files,
)

SAMPLE_RECORDS = 64
_RECORD_MAGIC = (b"PAR1", b"ARROW1", b"\xff\xff\xff\xff")
_SNIFF_BYTES = 1 << 16


def data_problem(
    data: DataSpec, seq_len: int, vocab_size: int, access: DataAccess
) -> tuple[str, str] | None:
    """(the spec field to change, a message) for the first problem found, or None."""
    try:
        if data.source == DataSource.records:
            return _records_problem(data, seq_len, vocab_size, access)
        if data.source == DataSource.text and data.path is not None:
            return _records_as_text(Path(data.path), access)
    except DataAccessDenied as err:
        return str(err).split(":", 1)[0], str(err)
    return None


def _records_problem(
    data: DataSpec, seq_len: int, vocab_size: int, access: DataAccess
) -> tuple[str, str] | None:
    assert data.path is not None
    try:
        recipe = recipe_of(data, seq_len, vocab_size, access)
        files = record_files(data.path)
        counts: dict[str, int] = {"truncated": 0, "dropped": 0}
        for record in islice(read_records(files, access), SAMPLE_RECORDS):
            try:
                record_pieces(recipe, record, counts)
            except BadRecord:
                if not data.skip_bad_records:
                    raise
    except BadRecord as err:
        return err.field, str(err)
    except (FileNotFoundError, ValueError) as err:
        field = "data.tokenizer" if str(err).startswith("data.tokenizer") else "data.path"
        return field, str(err)
    return None


def _records_as_text(path: Path, access: DataAccess) -> tuple[str, str] | None:
    """A JSON Lines, Parquet or Arrow file given as `source: text` would train on its
    punctuation and field names: found by name or by content."""
    if not path.is_file():
        return None
    with access.open(path, "data.path") as handle:
        head = handle.read(_SNIFF_BYTES)
    name = path.name.lower()
    kind = None
    if name.endswith(PARQUET_SUFFIXES) or head.startswith(_RECORD_MAGIC[0]):
        kind = "a Parquet file"
    elif name.endswith(".arrow") or head.startswith(_RECORD_MAGIC[1:]):
        kind = "an Arrow file"
    elif name.endswith(JSONL_SUFFIXES) or _looks_like_json_lines(head):
        kind = "JSON Lines"
    if kind is None:
        return None
    return (
        "data.source",
        f"data.path: {path.name} is {kind}, not plain text; set data.source: records "
        "(with data.text_field, or data.format: chat)",
    )


def _looks_like_json_lines(head: bytes) -> bool:
    """The first lines (at least two, all whole) are each a JSON object."""
    lines = [line for line in head.split(b"\n")[:-1] if line.strip()][:8]
    if len(lines) < 2:
        return False
    try:
        return all(isinstance(json.loads(line), dict) for line in lines)
    except ValueError:
        return False
