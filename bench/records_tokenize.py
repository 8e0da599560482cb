"""Tokenizing records on one process: throughput and peak memory against the corpus size;
one JSON line.

    .venv/bin/python -m bench.records_tokenize [--mb 200] [--format chat|text]
        [--tokenizer byte|PATH/tokenizer.json]

Writes a JSON Lines corpus of about `--mb` MB (conversations of random words, or plain
documents) to a temporary folder, then turns it into documents the way a rank does
(`workers/engine/data/documents.py`: read, render, tokenize, write the memmaps) in a fresh
process with an empty cache, and reports the wall time, MB/s, records/s, tokens/s and that
process's peak resident memory. Memory is bounded by a record, not by the corpus: the
figure to compare is the peak against the corpus size, at two sizes.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shardline.workers.contract.sections import DataSpec
from shardline.workers.engine.data.documents import record_documents

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "her",
    "an",
    "they",
    "be",
]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_corpus(path: Path, megabytes: float, kind: str, seed: int = 0) -> int:
    """About `megabytes` MB of records; returns how many."""
    rng = random.Random(seed)
    target, written, count = megabytes * 1e6, 0, 0
    with path.open("w") as out:
        while written < target:
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 200)))
            if kind == "chat":
                reply = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 100)))
                record: dict[str, object] = {
                    "messages": [
                        {"role": "user", "content": text},
                        {"role": "assistant", "content": reply},
                    ]
                }
            else:
                record = {"text": text}
            line = json.dumps(record) + "\n"
            out.write(line)
            written += len(line)
            count += 1
    return count


def tokenize(corpus: str, kind: str, tokenizer: str, cache: str) -> None:
    """The child: build the documents and print what it took."""
    import os

    os.environ["SHARDLINE_CACHE_DIR"] = cache
    data = {"source": "records", "path": corpus, "tokenizer": tokenizer}
    if kind == "chat":
        data.update(format="chat", chat_template=CHATML)
    spec = DataSpec.model_validate(data)
    start = time.perf_counter()
    docs = record_documents(spec, seq_len=4096, vocab_size=1 << 17)
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "peak_rss_mb": peak_kib / 1024, **docs.counts}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=200.0)
    parser.add_argument("--format", choices=["chat", "text"], default="chat")
    parser.add_argument("--tokenizer", default="byte")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        tokenize(args.child[0], args.format, args.tokenizer, args.child[1])
        return
    with tempfile.TemporaryDirectory(prefix="shardline-bench-") as folder:
        corpus = Path(folder) / "corpus.jsonl"
        records = write_corpus(corpus, args.mb, args.format)
        size_mb = corpus.stat().st_size / 1e6
        child = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.records_tokenize",
                "--format",
                args.format,
                "--tokenizer",
                args.tokenizer,
                "--child",
                str(corpus),
                f"{folder}/cache",
                "-",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        got = json.loads(child.stdout.strip().splitlines()[-1])
    seconds = got.pop("seconds")
    print(
        json.dumps(
            {
                "bench": "records_tokenize",
                "format": args.format,
                "tokenizer": args.tokenizer,
                "corpus_mb": round(size_mb, 1),
                "records": records,
                "seconds": round(seconds, 2),
                "mb_per_s": round(size_mb / seconds, 2),
                "records_per_s": round(records / seconds),
                "tokens_per_s": round(got["tokens"] / seconds),
                "peak_rss_mb": round(got.pop("peak_rss_mb"), 1),
                **got,
            }
        )
    )


if __name__ == "__main__":
    main()
