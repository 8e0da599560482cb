"""The same Llama with torchtitan and with Shardline, one after the other on one GPU; one
JSON line with both tokens/s and their ratio.

    .venv/bin/python -m bench.vs_torchtitan [examples/bench-1b.yaml] [--steps 20]

Shardline trains the spec (one rank) with its Trainer. torchtitan's side is torchtitan's
own Llama 3 model (its module code and weight init) with what torchtitan's trainer does on
one GPU: each block compiled, bf16 autocast, fused AdamW, the same shape, micro-batch and
sequence length, random tokens. Both report the steady state (the first 3 steps, which
compile and allocate, are left out).

It prints `{"skipped": ...}` and exits 0 without a GPU, or when torchtitan cannot be
imported (it is not a dependency: install its wheel beside this project to compare).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import time
from typing import Any

import torch
import torch.nn.functional as F

from shardline.workers.contract.net import free_port
from shardline.workers.contract.presets import PRESETS
from shardline.workers.contract.spec import JobSpec, load_spec
from shardline.workers.engine.distributed import init_world, leave_world
from shardline.workers.engine.trainer import Trainer

WARMUP_STEPS = 3


def torchtitan_llama() -> tuple[Any, Any] | None:
    """torchtitan's (Transformer, model-args class), wherever this version keeps them."""
    for module, args_name in (
        ("torchtitan.models.llama3", "TransformerModelArgs"),
        ("torchtitan.models.llama3.model.args", "TransformerModelArgs"),
        ("torchtitan.models.llama", "TransformerModelArgs"),
        ("torchtitan.models.llama", "ModelArgs"),
    ):
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        args_class = getattr(found, args_name, None)
        transformer = getattr(found, "Transformer", None)
        if transformer is None:
            transformer = getattr(
                importlib.import_module("torchtitan.models.llama3"), "Transformer", None
            )
        if args_class is not None and transformer is not None:
            return transformer, args_class
    return None


def shardline_tokens_per_s(spec: JobSpec) -> float:
    init_world(
        rank=0,
        world_size=1,
        master_addr="127.0.0.1",
        master_port=free_port(),
        device=torch.device("cuda", 0),
    )
    try:
        trainer = Trainer(spec, world_size=1, device=torch.device("cuda", 0))
        summary = trainer.train()
        del trainer
    finally:
        leave_world()
    return float(summary["tokens_per_s"])


def torchtitan_tokens_per_s(spec: JobSpec, transformer: Any, args_class: Any) -> dict[str, Any]:
    r = spec.model.resolved()
    preset = PRESETS[spec.model.preset]
    device = torch.device("cuda", 0)
    args = args_class(
        dim=r["dim"],
        n_layers=r["n_layers"],
        n_heads=r["n_heads"],
        n_kv_heads=r["n_kv_heads"],
        vocab_size=r["vocab_size"],
        ffn_dim_multiplier=preset.ffn_multiplier,
        multiple_of=preset.ffn_multiple_of,
        max_seq_len=r["seq_len"],
    )
    with torch.device(device):
        model = transformer(args)
        model.init_weights()
    for name, block in model.layers.named_children():
        model.layers.register_module(name, torch.compile(block, fullgraph=True))
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=spec.train.lr,
        betas=(0.9, 0.95),
        weight_decay=spec.train.weight_decay,
        fused=True,
    )
    micro, accumulation = spec.train.micro_batch_size, spec.accumulation_steps
    seq = r["seq_len"]
    step_times = []
    for _ in range(spec.train.steps):
        start = time.perf_counter()
        for _ in range(accumulation):
            rows = torch.randint(0, r["vocab_size"], (micro, seq + 1), device=device)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(rows[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), rows[:, 1:].flatten())
            (loss / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.train.grad_clip or 1e9)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        step_times.append(time.perf_counter() - start)
    steady = step_times[WARMUP_STEPS:] or step_times
    hidden = model.layers["0"].feed_forward.w1.weight.shape[0]
    return {
        "tokens_per_s": spec.train.global_batch_size * seq * len(steady) / sum(steady),
        "parameters": sum(p.numel() for p in model.parameters()),
        "ffn_dim": hidden,
    }


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default="examples/bench-1b.yaml")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    line: dict[str, Any] = {"bench": "vs_torchtitan", "spec": args.spec}
    found = torchtitan_llama()
    if not torch.cuda.is_available():
        line["skipped"] = "no GPU"
    elif found is None:
        line["skipped"] = "torchtitan is not importable"
    else:
        data = load_spec(args.spec).model_dump(mode="json")
        data["train"].update(steps=args.steps, warmup_steps=min(2, args.steps))
        data["parallel"] = {}  # one GPU, one rank
        spec = JobSpec.model_validate(data)
        ours = shardline_tokens_per_s(spec)
        torch.cuda.empty_cache()
        theirs = torchtitan_tokens_per_s(spec, *found)
        line.update(
            device=torch.cuda.get_device_name(0),
            parameters=spec.model.parameter_count(),
            same_shape=theirs["parameters"] == spec.model.parameter_count(),
            seq_len=spec.model.resolved()["seq_len"],
            global_batch_size=spec.train.global_batch_size,
            shardline_tokens_per_s=ours,
            torchtitan_tokens_per_s=theirs["tokens_per_s"],
            ratio=ours / theirs["tokens_per_s"],
        )
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
