"""Ranks on one node that need the same corpus: one tokenizes it, the others wait and
read what it wrote (not every rank tokenizing the same corpus at once)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardline.workers.contract.sections import DataSpec
from shardline.workers.engine.data import documents, sources
from shardline.workers.engine.data.tokenizers import ByteTokenizer
from tests.support.records import write_jsonl


def counted(original: Callable[..., Any], marks: Path) -> Callable[..., Any]:
    """`original`, leaving a file in `marks` per call and taking a while."""

    def build(*args: Any, **kwargs: Any) -> Any:
        (marks / f"{os.getpid()}-{time.monotonic_ns()}").touch()
        time.sleep(0.5)  # long enough for the others to arrive meanwhile
        return original(*args, **kwargs)

    return build


def in_processes(target: Callable[[], np.ndarray], n: int = 3) -> list[np.ndarray]:
    ctx = mp.get_context("fork")  # the patched functions go with the children
    with ctx.Pool(n) as pool:
        return pool.starmap(_call, [(target,)] * n)


def _call(target: Callable[[], np.ndarray]) -> np.ndarray:
    return np.asarray(target())


@pytest.fixture
def marks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SHARDLINE_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "marks"
    folder.mkdir()
    return folder


def _text(root: Path) -> np.ndarray:
    return sources.text_tokens(root, ByteTokenizer(), 256)


def _records(path: Path) -> np.ndarray:
    spec = DataSpec.model_validate({"source": "records", "path": str(path)})
    return np.asarray(documents.record_documents(spec, 32, 256).tokens)


def test_one_process_tokenizes_text_and_the_others_wait(
    tmp_path: Path, marks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "corpus.txt").write_text("hello world\n" * 1000)
    monkeypatch.setattr(sources, "_tokenize_files", counted(sources._tokenize_files, marks))
    got = in_processes(partial(_text, tmp_path / "corpus.txt"))
    assert len(list(marks.iterdir())) == 1
    assert all(np.array_equal(g, got[0]) for g in got) and len(got[0]) == 12_001


def test_one_process_tokenizes_records_and_the_others_wait(
    tmp_path: Path, marks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_jsonl([{"text": f"record {i}"} for i in range(200)], tmp_path / "r.jsonl")
    monkeypatch.setattr(documents, "_write", counted(documents._write, marks))
    got = in_processes(partial(_records, path))
    assert len(list(marks.iterdir())) == 1
    assert all(np.array_equal(g, got[0]) for g in got)
