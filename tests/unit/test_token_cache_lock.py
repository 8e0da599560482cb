"""Ranks on one node that need the same corpus: one tokenizes it, the others wait and
read what it wrote (not every rank tokenizing the same corpus at once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.records import write_jsonl

# One "rank": the build marked (a file per call) and slowed, so that the others arrive
# while it runs; then what it read, printed. Its own process, as ranks are (spawned, not
# forked from this test's threads).
RANK = """
import json, os, sys, time
from pathlib import Path
import numpy as np
from shardline.workers.contract.sections import DataSpec
from shardline.workers.engine.data import documents, sources
from shardline.workers.engine.data.tokenizers import ByteTokenizer

kind, path, marks = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
module, name = (sources, "_tokenize_files") if kind == "text" else (documents, "_write")
original = getattr(module, name)

def build(*args, **kwargs):
    (marks / f"{os.getpid()}").touch()
    time.sleep(0.5)
    return original(*args, **kwargs)

setattr(module, name, build)
if kind == "text":
    tokens = sources.text_tokens(path, ByteTokenizer(), 256)
else:
    spec = DataSpec.model_validate({"source": "records", "path": str(path)})
    tokens = documents.record_documents(spec, 32, 256).tokens
print(json.dumps(np.asarray(tokens).tolist()))
"""


def ranks(kind: str, path: Path, marks: Path, cache: Path, n: int = 3) -> list[list[int]]:
    env = {**os.environ, "SHARDLINE_CACHE_DIR": str(cache)}
    started = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, kind, str(path), str(marks)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(n)
    ]
    out = []
    for proc in started:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        out.append(json.loads(stdout))
    return out


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    folder = tmp_path / "marks"
    folder.mkdir()
    return folder


def test_one_process_tokenizes_text_and_the_others_wait(tmp_path: Path, marks: Path) -> None:
    (tmp_path / "corpus.txt").write_text("hello world\n" * 1000)
    got = ranks("text", tmp_path / "corpus.txt", marks, tmp_path / "cache")
    assert len(list(marks.iterdir())) == 1
    assert all(g == got[0] for g in got) and len(got[0]) == 12_001


def test_one_process_tokenizes_records_and_the_others_wait(tmp_path: Path, marks: Path) -> None:
    path = write_jsonl([{"text": f"record {i}"} for i in range(200)], tmp_path / "r.jsonl")
    got = ranks("records", path, marks, tmp_path / "cache")
    assert len(list(marks.iterdir())) == 1
    assert all(g == got[0] for g in got)
