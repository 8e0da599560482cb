"""Hugging Face in and out through the whole service: jobs start from Llama, Qwen2 and Qwen3
folders (`model.init_from`), train on real Ray, and their checkpoints are exported through
the API; transformers loads each export with no custom code and computes what Shardline
computes, and `shardline generate` decodes greedily what transformers' `generate` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.data.loader import build_loader
from shardline.workers.engine.local_model import load_local_model
from tests.e2e.conftest import Service
from tests.support.hf_models import save_random_llama, save_random_model

ServiceFactory = Callable[..., AbstractContextManager[Service]]
SHARDLINE = str(Path(sys.executable).parent / "shardline")


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SHARDLINE, *args], capture_output=True, text=True, env=env, timeout=600)


def first_batch_loss(model: torch.nn.Module, spec: JobSpec) -> float:
    """Loss of a transformers model on step 1's global batch (which depends only on the
    seed and the step, not on the layout)."""
    rows = build_loader(spec, dp_rank=0, dp_size=1).train_batch(1).tokens
    with torch.no_grad():
        logits = model(rows[:, :-1]).logits
    return float(F.cross_entropy(logits.float().flatten(0, 1), rows[:, 1:].flatten()))


def test_weights_swapped_out_of_the_data_roots_after_submit_fail_the_job(
    service: ServiceFactory, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path / "llama"
    save_random_llama(folder)
    outside = tmp_path_factory.mktemp("outside") / "model.safetensors"
    body = {
        "name": "swapped",
        "model": {"init_from": str(folder), "seq_len": 32},
        "train": {"steps": 2, "global_batch_size": 2, "micro_batch_size": 1},
        "fault_tolerance": {"max_failures": 2},
    }
    with service() as svc, svc.running() as server, svc.client(server) as client:
        job = client.submit(body)
        # Accepted at submit; then the weights become a symlink out of the data roots,
        # before the workers have started (they take seconds to).
        (folder / "model.safetensors").rename(outside)
        (folder / "model.safetensors").symlink_to(outside)
        ended = client.wait(job["id"], timeout=300)
    assert ended["state"] == "FAILED", ended
    reason = ended["failure_reason"]
    assert "model.init_from" in reason and "outside the data roots" in reason, reason
    assert str(tmp_path) not in reason.replace(str(folder), "")  # no server roots shown


FINE_TUNES = {
    # A Llama 3.1-style folder (llama3 rope scaling, tied embeddings, its own head_dim),
    # a Qwen2 with tied embeddings and q/k/v biases, a Qwen3 with q/k norms.
    "llama": {"tp": 2},
    "qwen2": {"dp": 2, "zero_stage": 3},
    "qwen3": {"pp": 2},
}


def test_each_family_is_fine_tuned_through_the_service_and_exported(
    service: ServiceFactory, tmp_path: Path
) -> None:
    starts = {f: save_random_model(f, tmp_path / f, seed=2) for f in FINE_TUNES}
    with service() as svc, svc.running() as server, svc.client(server) as client:
        jobs = {
            f: client.submit(
                {
                    "name": f"tune-{f}",
                    "model": {"init_from": str(tmp_path / f), "seq_len": 32},
                    "parallel": layout,
                    "train": {
                        "steps": 6,
                        "global_batch_size": 4,
                        "micro_batch_size": 1,
                        "lr": 3e-3,
                        "log_every": 1,
                        "seed": 3,
                    },
                }
            )
            for f, layout in FINE_TUNES.items()
        }
        env = {**os.environ, "SHARDLINE_URL": server.url, "SHARDLINE_TOKEN": svc.token}
        checkpoints = {}
        for family, job in jobs.items():
            spec = JobSpec.model_validate(job["spec"])
            assert spec.model.family == family  # from config.json's model_type
            # The shape too comes from config.json, not from a preset.
            assert spec.model.resolved()["dim"] == starts[family].config.hidden_size
            ended = client.wait(job["id"], timeout=600)
            assert ended["state"] == "SUCCEEDED", ended
            step_one = client.metrics(job["id"])[0]
            assert step_one["loss"] == pytest.approx(
                first_batch_loss(starts[family], spec), rel=1e-4
            ), family
            done = cli("export", "--job", job["id"], str(tmp_path / f"out-{family}"), env=env)
            assert done.returncode == 0, done.stderr
            # Named relative to the job's folder, never by the server's storage path.
            relative = client.checkpoints(job["id"])[0]["path"]
            assert relative.startswith("checkpoints/step-"), relative
            checkpoints[family] = svc.settings.job_layout(job["id"]).dir / relative

    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    for family, start in starts.items():
        out = tmp_path / f"out-{family}"
        exported = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
        assert type(exported) is type(start), family
        assert exported.config.tie_word_embeddings == start.config.tie_word_embeddings
        ours = load_local_model(checkpoints[family], torch.device("cpu")).model.eval()
        with torch.no_grad():
            assert float((exported(tokens).logits - ours(tokens)).abs().max()) < 1e-4, family
            # Training moved the weights away from where they started.
            assert float((start(tokens).logits - ours(tokens)).abs().max()) > 1e-3, family
    assert_generates_as_transformers(tmp_path / "out-llama", checkpoints["llama"])


def assert_generates_as_transformers(out: Path, checkpoint: Path) -> None:
    """The export is a byte-level model transformers loads as it is, and `shardline
    generate` decodes greedily from the export and from the checkpoint what transformers'
    `generate` does."""
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    # A byte-level job: AutoTokenizer reads the export as the engine's byte codec, and
    # config.json names no bos/eos (the codec has none, whatever init_from's config said).
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.encode("Grüße 😀", add_special_tokens=False) == list("Grüße 😀".encode())
    assert json.loads((out / "config.json").read_text())["eos_token_id"] is None
    exported = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
    prompt = "Shardline "
    for model_path in (out, checkpoint):
        generated = cli(
            "generate",
            str(model_path),
            "--prompt",
            prompt,
            "--greedy",
            "--max-new-tokens",
            "20",
            "--ids",
            env=dict(os.environ),
        )
        assert generated.returncode == 0, generated.stderr
        ids = json.loads(generated.stdout)
        assert ids["prompt_ids"] == list(prompt.encode())
        with torch.no_grad():
            expected = exported.generate(
                torch.tensor([ids["prompt_ids"]]),
                max_new_tokens=20,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
        assert ids["new_ids"] == expected, model_path
    text = cli(
        "generate", str(out), "--prompt", prompt, "--max-new-tokens", "5", env=dict(os.environ)
    )
    assert text.returncode == 0 and text.stdout.startswith(prompt), text.stderr
