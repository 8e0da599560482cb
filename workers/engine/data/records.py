"""Records as users keep them: JSON Lines (`.jsonl`, `.jsonl.gz`), Parquet (`.parquet`)
and `datasets` folders (what `Dataset.save_to_disk` writes: Arrow stream files listed in
its state.json), as one file, a folder of them or a glob.

Each record is a dict with the place it came from ("chats.jsonl line 12"), so a bad one
can be named. The same records in any of the three containers come out in the same
order with the same values. Every file is opened through the job's data access rules.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from shardline.workers.contract.data_access import DataAccess

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json.gz", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
# A datasets folder holds these two beside its .arrow files.
DATASETS_STATE = "state.json"
DATASETS_INFO = "dataset_info.json"
_ARROW_BATCH_ROWS = 1024
_PARQUET_MAGIC = b"PAR1"
_GZIP_MAGIC = b"\x1f\x8b"


class BadRecord(ValueError):
    """A record or file that is not what the job's data section says; the message names
    the file, the line or row, and the field; `field` is the spec's field to change."""

    def __init__(self, message: str, field: str = "data.path") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Record:
    values: dict[str, Any]
    where: str  # "chats.jsonl line 12", "part-0.parquet row 7"
    # Why a line could not be read as a record (the reading goes on after it).
    error: str | None = None


def record_files(path: str) -> list[Path]:
    """The files `data.path` names, in a stable order: a file, a glob, a `datasets` folder
    (its Arrow files in its own order) or a folder of record files (recursively)."""
    if any(ch in path for ch in "*?["):
        # A glob takes the record files and datasets folders it matches, nothing else.
        matches = sorted(Path(p) for p in glob.glob(path, recursive=True))
        files = [
            f
            for m in matches
            if _kind(m) is not None or (m / DATASETS_STATE).is_file()
            for f in record_files(str(m))
        ]
        if not files:
            raise FileNotFoundError(f"data.path: {path} matches no record files")
        return files
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"data.path: {root} is neither a file nor a folder")
    if (root / DATASETS_STATE).is_file() and (root / DATASETS_INFO).is_file():
        return _datasets_files(root)
    files = sorted(p for p in root.rglob("*") if p.is_file() and _kind(p) is not None)
    if not files:
        raise FileNotFoundError(
            f"data.path: {root} holds no .jsonl, .jsonl.gz or .parquet files and is not a "
            "datasets folder (save_to_disk)"
        )
    return files


def _datasets_files(root: Path) -> list[Path]:
    try:
        state = json.loads((root / DATASETS_STATE).read_text(encoding="utf-8"))
        names = [entry["filename"] for entry in state["_data_files"]]
    except (ValueError, KeyError, TypeError):
        raise BadRecord(
            f"data.path: {root}/{DATASETS_STATE} is not a datasets state file"
        ) from None
    files = [root / name for name in names]
    outside = [n for n, f in zip(names, files, strict=True) if f.resolve().parent != root.resolve()]
    if outside:
        raise BadRecord(f"data.path: {root}/{DATASETS_STATE} names a file outside its folder")
    return files


def _kind(path: Path) -> str | None:
    name = path.name.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(".arrow"):
        return "arrow"
    return None


def read_records(files: list[Path], access: DataAccess) -> Iterator[Record]:
    """Every record of `files`, in order."""
    for path in files:
        kind = _kind(path)
        if kind is None:
            raise BadRecord(
                f"data.path: {path.name} is not a record file; give .jsonl, .jsonl.gz, "
                ".parquet or a datasets folder"
            )
        with access.open(path, "data.path") as handle:
            if kind == "jsonl":
                yield from _jsonl(path, handle)
            elif kind == "parquet":
                yield from _parquet(path, handle)
            else:
                yield from _arrow(path, handle)


def _jsonl(path: Path, handle: BinaryIO) -> Iterator[Record]:
    head = handle.read(4)
    handle.seek(0)
    if head == _PARQUET_MAGIC:
        raise BadRecord(
            f"data.path: {path.name} is a Parquet file, not JSON Lines; name it .parquet"
        )
    raw: BinaryIO = handle
    if head[:2] == _GZIP_MAGIC:
        raw = gzip.GzipFile(fileobj=handle)  # type: ignore[assignment]
    elif path.name.lower().endswith(".gz"):
        raise BadRecord(f"data.path: {path.name} is not gzip-compressed; name it .jsonl")
    text = io.TextIOWrapper(raw, encoding="utf-8")
    line_no = 0
    try:
        for line_no, line in enumerate(text, start=1):
            if not line.strip():
                continue
            where = f"{path.name} line {line_no}"
            try:
                value = json.loads(line)
            except ValueError:
                yield Record({}, where, f"data.path: {where} is not JSON")
                continue
            if not isinstance(value, dict):
                yield Record({}, where, f"data.path: {where} is not a JSON object")
                continue
            yield Record(value, where)
    except UnicodeDecodeError:
        raise BadRecord(
            f"data.path: {path.name} line {line_no + 1} is not UTF-8 text; is it JSON Lines?"
        ) from None
    except (OSError, EOFError) as err:  # a broken gzip stream
        raise BadRecord(f"data.path: {path.name} cannot be read ({type(err).__name__})") from None


def _parquet(path: Path, handle: BinaryIO) -> Iterator[Record]:
    import pyarrow.parquet as pq

    def batches() -> Iterator[Any]:
        yield from pq.ParquetFile(handle).iter_batches(batch_size=_ARROW_BATCH_ROWS)

    return _rows(path, batches, "a Parquet file")


def _arrow(path: Path, handle: BinaryIO) -> Iterator[Record]:
    import pyarrow as pa

    def batches() -> Iterator[Any]:
        yield from pa.ipc.open_stream(handle)

    return _rows(path, batches, "an Arrow stream file")


def _rows(path: Path, batches: Callable[[], Iterator[Any]], what: str) -> Iterator[Record]:
    """The rows of Arrow record batches as records; a file pyarrow cannot read is not
    `what`."""
    import pyarrow as pa

    row = 0
    try:
        for batch in batches():
            for values in batch.to_pylist():
                yield Record(values, f"{path.name} row {row}")
                row += 1
    except (pa.ArrowException, OSError):
        raise BadRecord(f"data.path: {path.name} is not {what}") from None
