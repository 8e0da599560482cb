"""Hugging Face export and import throughput, and KV-cached decode against recomputing
the whole sequence per token; one process, one JSON line.

    .venv/bin/python -m bench.hf_roundtrip [--dim 512] [--layers 8] [--vocab 32000]
                                           [--new-tokens 128] [--device cpu]

A random model of the given shape is written as a Hugging Face folder (names and rotary
order converted, safetensors), read back into a fresh model with `load_init_from` (the
lazy per-slice reads every rank does), checked equal, and then decodes greedily from a
16-token prompt with the cache (workers/engine/generate.py) and without it (the training
forward over the whole sequence for every new token).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from shardline.workers.engine.generate import generate
from shardline.workers.engine.hf_export import write_safetensors
from shardline.workers.engine.hf_weights import load_init_from, to_hf_state
from shardline.workers.engine.models.family import load_family
from shardline.workers.engine.models.llama.config import ModelArgs
from shardline.workers.engine.models.llama.model import Transformer

LLAMA = load_family("llama")


def _naive_greedy(model: Transformer, prompt: list[int], new_tokens: int) -> list[int]:
    ids = list(prompt)
    device = next(model.parameters()).device
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(torch.tensor([ids], device=device))
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt) :]


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    shape = ModelArgs(
        dim=args.dim,
        n_layers=args.layers,
        n_heads=args.dim // 64,
        n_kv_heads=max(1, args.dim // 128),
        vocab_size=args.vocab,
        seq_len=16 + args.new_tokens,
        ffn_dim=int(8 * args.dim / 3 / 64 + 1) * 64,
    )
    torch.manual_seed(0)
    source = Transformer(shape).to(device).eval()
    n_params = sum(p.numel() for p in source.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        tensors = to_hf_state(
            {k: v.cpu() for k, v in source.state_dict().items()}, LLAMA.state_dict_adapter(shape)
        )
        write_safetensors(tensors, folder, max_bytes=5 * 1024**3)
        resolved = {**shape.__dict__}
        config = LLAMA.config.hf_config(resolved, bos_token_id=None, eos_token_id=None)
        (folder / "config.json").write_text(json.dumps(config))
        export_s = time.perf_counter() - start
        nbytes = sum(p.stat().st_size for p in folder.iterdir())

        torch.manual_seed(1)
        target = Transformer(shape).to(device).eval()
        start = time.perf_counter()
        load_init_from([target], folder, LLAMA, shape)
        import_s = time.perf_counter() - start
    for name, value in source.state_dict().items():
        assert torch.equal(value, target.state_dict()[name]), name

    prompt = list(range(1, 17))
    generate(target, prompt, family=LLAMA, max_new_tokens=4)  # warm-up
    start = time.perf_counter()
    cached = generate(target, prompt, family=LLAMA, max_new_tokens=args.new_tokens)
    cached_s = time.perf_counter() - start
    start = time.perf_counter()
    naive = _naive_greedy(target, prompt, args.new_tokens)
    naive_s = time.perf_counter() - start
    return {
        "bench": "hf_roundtrip",
        "device": str(device),
        "params": n_params,
        "bytes": nbytes,
        "export_s": round(export_s, 3),
        "export_mb_s": round(nbytes / export_s / 1e6, 1),
        "import_s": round(import_s, 3),
        "import_mb_s": round(nbytes / import_s / 1e6, 1),
        "new_tokens": args.new_tokens,
        "cached_tokens_per_s": round(args.new_tokens / cached_s, 1),
        "recompute_tokens_per_s": round(args.new_tokens / naive_s, 1),
        "same_tokens": cached == naive,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    print(json.dumps(run(parser.parse_args())))


if __name__ == "__main__":
    main()
