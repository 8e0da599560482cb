"""`shardline generate` on a byte-level model, exported and as a checkpoint: it samples by
default (seeded), `--greedy` takes the argmax, and the export's tokenizer is the engine's
byte codec for transformers' AutoTokenizer too."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import transformers
from typer.testing import CliRunner

from shardline.api.cli.app import app
from shardline.workers.contract.data_access import DataAccess
from shardline.workers.contract.hf_config import resolve_init_from
from shardline.workers.contract.net import free_port
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.data.tokenizers import ByteTokenizer
from shardline.workers.engine.distributed import init_world, leave_world
from shardline.workers.engine.hf_export import export_checkpoint
from shardline.workers.engine.local_model import load_local_model
from shardline.workers.engine.trainer import Trainer
from shardline.workers.storage.checkpoints import CheckpointStore
from shardline.workers.storage.layout import CheckpointLocations
from tests.support.hf_models import save_random_llama

SHARDLINE = str(Path(sys.executable).parent / "shardline")
PROMPT = "Grüße 😀\n"
NEW = 12


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A tiny random byte-level model: the step-0 checkpoint of a job started from a
    Hugging Face Llama (whose config.json has bos 1 and eos 2), and its export."""
    tmp = tmp_path_factory.mktemp("byte-model")
    start = save_random_llama(tmp / "llama", seed=5, num_hidden_layers=1)
    assert (start.config.bos_token_id, start.config.eos_token_id) == (1, 2)
    spec = JobSpec.model_validate(
        {
            "name": "bytes",
            "model": {"init_from": str(tmp / "llama"), "seq_len": 64},
            "data": {"tokenizer": "byte"},
            "precision": "fp32",
            "train": {"steps": 1, "global_batch_size": 1, "micro_batch_size": 1},
        }
    )
    spec = resolve_init_from(spec, DataAccess())
    cpu = torch.device("cpu")
    init_world(rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(), device=cpu)
    try:
        locations = CheckpointLocations(save_url=str(tmp / "checkpoints"))
        Trainer(spec, world_size=1, device=cpu, checkpoints=locations).save_checkpoint()
    finally:
        leave_world()
    ckpt = CheckpointStore(str(tmp / "checkpoints")).find(0)
    assert ckpt is not None
    export_checkpoint(ckpt.path, tmp / "export")
    yield Path(ckpt.path), tmp / "export"


def _generate(model: Path, *options: str) -> dict[str, list[int]]:
    args = ["generate", str(model), "--prompt", PROMPT, "--max-new-tokens", str(NEW), "--ids"]
    result = CliRunner().invoke(app, [*args, *options])
    assert result.exit_code == 0, result.output
    ids: dict[str, list[int]] = json.loads(result.stdout)
    return ids


def test_export_of_a_byte_model_loads_with_autotokenizer_as_the_engine_codec(
    byte_model: tuple[Path, Path],
) -> None:
    _, export = byte_model
    tok = transformers.AutoTokenizer.from_pretrained(export)
    codec = ByteTokenizer()
    for text in ["hello world", "  two  spaces ", "é à ü ß", "emoji 😀🚀!", "a\nb\r\n\tc", "中文"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == codec.encode(text), text
        assert tok.encode(text) == ids  # no special tokens around a text either
        assert tok.decode(ids) == text
    config = json.loads((export / "config.json").read_text())
    # The byte codec has no special tokens; config.json names none either (not the bos 1
    # and eos 2 of the Llama the job started from: those ids are bytes here).
    assert config["bos_token_id"] is None and config["eos_token_id"] is None
    assert tok.bos_token_id is None and tok.eos_token_id is None
    assert config["shardline"]["tokenizer"] == "byte"


def test_generate_samples_by_default_seeded_and_greedy_is_the_argmax(
    byte_model: tuple[Path, Path],
) -> None:
    checkpoint, export = byte_model
    first = _generate(export)
    assert first["prompt_ids"] == list(PROMPT.encode("utf-8"))
    assert len(first["new_ids"]) == NEW
    # Sampled: reproducible with one seed, different with another.
    assert _generate(export, "--seed", "0") == first
    assert _generate(export, "--seed", "1")["new_ids"] != first["new_ids"]
    # The defaults are temperature 0.8 and top-p 0.95.
    explicit = _generate(export, "--seed", "3", "--temperature", "0.8", "--top-p", "0.95")
    assert _generate(export, "--seed", "3") == explicit

    greedy = _generate(export, "--greedy")["new_ids"]
    model = load_local_model(checkpoint, torch.device("cpu")).model.eval()
    ids = list(PROMPT.encode("utf-8"))
    with torch.no_grad():
        for _ in range(NEW):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert greedy == ids[-NEW:]
    assert first["new_ids"] != greedy
    # A checkpoint folder generates the same as its export.
    assert _generate(checkpoint, "--greedy")["new_ids"] == greedy
    assert _generate(checkpoint)["new_ids"] == first["new_ids"]

    text = CliRunner().invoke(app, ["generate", str(export), "--prompt", PROMPT])
    assert text.exit_code == 0 and text.stdout.startswith(PROMPT), text.output


def test_greedy_with_a_sampling_option_is_a_one_line_error(
    byte_model: tuple[Path, Path],
) -> None:
    _, export = byte_model
    done = subprocess.run(
        [SHARDLINE, "generate", str(export), "--prompt", "x", "--greedy", "--temperature", "0.5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--greedy" in lines[0] and "--temperature" in lines[0], lines
