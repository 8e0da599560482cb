"""Per-step losses of a fixed set of runs, to hold a refactor to the numerics before it;
one JSON line.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.loss_trace --out /tmp/after.json \
        [--against /tmp/before.json] [--cases tp2,dp2-zero3]

Each case is the layout suite's tiny spec (seed 7, fp32 unless the case says, every step
logged) run through `shardline train`'s launcher on local gloo ranks: every layout of
tests/dist/test_layouts.py, the data-parallel ZeRO stages, mixed precision, gradient
compression, activation checkpointing, local SGD and real text through the byte
tokenizer. `--out` keeps every logged step's loss, gradient norm and validation loss;
`--against` compares with a file an earlier tree wrote and reports, per case, the largest
difference (`exact` where every value is bit-for-bit the same).

Only the launcher and the spec are used, so one copy of this file runs on any tree that
has them. Asynchronous replicas are left out: which replica trains which batch follows
the timing of their pushes, so two runs of the same tree differ.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.launch import train_local

TRAIN = {"eval_every": 5}
# name -> (spec overrides by section, ranks)
CASES: dict[str, tuple[dict[str, Any], int]] = {
    "single": ({}, 1),
    "tp2": ({"parallel": {"tp": 2}}, 2),
    "pp2-gpipe": ({"parallel": {"pp": 2, "pp_schedule": "gpipe"}}, 2),
    "pp2-1f1b": ({"parallel": {"pp": 2, "pp_schedule": "1f1b"}}, 2),
    "pp2-interleaved-v2": (
        {"parallel": {"pp": 2, "pp_schedule": "interleaved_1f1b", "pp_virtual_stages": 2}},
        2,
    ),
    "dp2-tp2-zero3": ({"parallel": {"dp": 2, "tp": 2, "zero_stage": 3}}, 4),
    "pp2-dp2-zero1": ({"parallel": {"pp": 2, "dp": 2, "zero_stage": 1}}, 4),
    "pp2-tp2": ({"parallel": {"pp": 2, "tp": 2}}, 4),
    "pp2-dp2-tp2-zero2": ({"parallel": {"pp": 2, "dp": 2, "tp": 2, "zero_stage": 2}}, 8),
    "tp2-sequence-parallel": ({"parallel": {"tp": 2, "sequence_parallel": True}}, 2),
    "dp2-tp2-zero0": ({"parallel": {"dp": 2, "tp": 2, "zero_stage": 0}}, 4),
    "dp2-tp2-zero1": ({"parallel": {"dp": 2, "tp": 2, "zero_stage": 1}}, 4),
    "dp2-zero0": ({"parallel": {"dp": 2}}, 2),
    "dp2-zero1": ({"parallel": {"dp": 2, "zero_stage": 1}}, 2),
    "dp2-zero2": ({"parallel": {"dp": 2, "zero_stage": 2}}, 2),
    "dp2-zero3": ({"parallel": {"dp": 2, "zero_stage": 3}}, 2),
    "bf16": ({"precision": "bf16"}, 1),
    "fp16-dp2": ({"precision": "fp16", "parallel": {"dp": 2}}, 2),
    "dp2-bf16-grads": ({"parallel": {"dp": 2, "grad_compression": {"kind": "bf16"}}}, 2),
    "dp2-powersgd": (
        {"parallel": {"dp": 2, "grad_compression": {"kind": "powersgd", "warmup_steps": 2}}},
        2,
    ),
    "ac-full-dp2-zero3": (
        {"parallel": {"dp": 2, "zero_stage": 3}, "train": {"activation_checkpointing": "full"}},
        2,
    ),
    "local-sgd-dp2": (
        {
            "parallel": {"dp": 2, "dp_mode": "local_sgd", "local_sgd": {"sync_every": 5}},
            "train": {"log_every": 5},
        },
        2,
    ),
    "text-dp2": ({"data": {"source": "text"}, "parallel": {"dp": 2}}, 2),
}


def text_corpus(folder: Path) -> Path:
    """A fixed text file (the same on every tree): lines of words from a seeded walk."""
    words = [
        "shard", "line", "train", "model", "token", "rank", "step", "loss", "batch", "layer",
        "pipe", "tensor", "data", "grad", "check", "point",
    ]  # fmt: skip
    lines, state = [], 7
    for _ in range(4000):
        row = []
        for _ in range(9):
            state = (state * 1103515245 + 12345) % (1 << 31)
            row.append(words[state % len(words)])
        lines.append(" ".join(row) + ".")
    path = folder / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def case_spec(name: str, corpus: Path) -> JobSpec:
    overrides, _ = CASES[name]
    base: dict[str, Any] = {
        "name": f"trace-{name}",
        "model": {"preset": "tiny", "seq_len": 64},
        "data": {"source": "synthetic"},
        "precision": "fp32",
        "train": {
            "steps": 10,
            "global_batch_size": 8,
            "micro_batch_size": 2,
            "lr": 3e-3,
            "warmup_steps": 2,
            "log_every": 1,
            "seed": 7,
            **TRAIN,
        },
    }
    for section, values in overrides.items():
        base[section] = {**base.get(section, {}), **values} if isinstance(values, dict) else values
    if base["data"]["source"] == "text":
        base["data"]["path"] = str(corpus)
    return JobSpec.model_validate(base)


def trace(name: str, corpus: Path) -> list[dict[str, Any]]:
    metrics: list[dict[str, Any]] = []
    train_local(case_spec(name, corpus), CASES[name][1], on_metrics=metrics.append)
    keys = ("step", "loss", "grad_norm", "val_loss")
    return [{k: m[k] for k in keys if k in m} for m in metrics]


def largest_difference(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> float:
    """The largest relative difference of any value of any step (inf where the steps or
    the values logged differ)."""
    if [m.keys() for m in ours] != [m.keys() for m in theirs]:
        return float("inf")
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        for key in a:
            x, y = a[key], b[key]
            if x == y:
                continue
            if x is None or y is None:
                return float("inf")
            worst = max(worst, abs(x - y) / max(abs(y), 1e-12))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--against", type=Path, default=None)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    names = [n for n in args.cases.split(",") if n]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = text_corpus(Path(tmp))
        traces = {name: trace(name, corpus) for name in names}
    args.out.write_text(json.dumps(traces, indent=1), encoding="utf-8")
    result: dict[str, Any] = {"bench": "loss_trace", "cases": len(traces)}
    if args.against is not None:
        before = json.loads(args.against.read_text(encoding="utf-8"))
        diffs = {n: largest_difference(traces[n], before[n]) for n in names if n in before}
        result["exact"] = sorted(n for n, d in diffs.items() if d == 0.0)
        result["differ"] = {n: d for n, d in diffs.items() if d != 0.0}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
