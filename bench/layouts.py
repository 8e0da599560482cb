"""Run one spec in several (pp, dp, tp, zero) layouts and print one JSON line per layout.

    .venv/bin/python -m bench.layouts SPEC.yaml "dp=4" "tp=2,dp=2,zero=3" "pp=2,tp=2" ...

Each layout is comma-separated `key=value` over pp, dp, tp, zero (zero_stage), v
(pp_virtual_stages), sched (pp_schedule) and sp (sequence_parallel, 0/1). Every line has
the layout, steady-state tokens/s and step time, the peak memory of the busiest rank
(GPU allocated, or resident set on CPU) and the model-state bytes it held.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from pydantic import ValidationError

from shardline.workers.contract.spec import JobSpec, describe_errors, load_spec
from shardline.workers.engine.launch import TrainingFailed, train_local

KEYS = {
    "pp": "pp",
    "dp": "dp",
    "tp": "tp",
    "zero": "zero_stage",
    "v": "pp_virtual_stages",
    "sched": "pp_schedule",
    "sp": "sequence_parallel",
}
DEFAULT_LAYOUTS = ["dp=4", "dp=4,zero=3", "tp=2,dp=2,zero=3", "pp=2,dp=2", "pp=2,tp=2"]


def parse_layout(text: str) -> dict[str, Any]:
    """ "pp=2,tp=2" -> {"pp": 2, "tp": 2} with the spec's field names."""
    out: dict[str, Any] = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in KEYS:
            raise ValueError(f"{text!r}: unknown key {key!r}; use {', '.join(KEYS)}")
        out[KEYS[key]] = value if key == "sched" else int(value)
    if "sequence_parallel" in out:
        out["sequence_parallel"] = bool(out["sequence_parallel"])
    return out


def layout_spec(base: JobSpec, layout: str) -> JobSpec:
    """`base` with the layout `layout` ("pp=2,tp=2") in place of its own."""
    data = base.model_dump(mode="json")
    data["parallel"] = {**{"dp": 1, "tp": 1, "pp": 1, "zero_stage": 0}, **parse_layout(layout)}
    if data["parallel"].get("pp_virtual_stages", 1) > 1:
        data["parallel"].setdefault("pp_schedule", "interleaved_1f1b")
    return JobSpec.model_validate(data)


def run_layout(base: JobSpec, layout: str) -> dict[str, Any]:
    spec = layout_spec(base, layout)
    held: dict[str, int] = {}
    summary = train_local(
        spec, spec.parallel.world_size, on_metrics=lambda m: held.update(m.get("mem_bytes", {}))
    )
    return {
        "layout": summary["layout"],
        "tokens_per_s": round(summary["tokens_per_s"], 1),
        "step_time_s": round(summary["step_time_s"], 4),
        "peak_mem_bytes": summary["peak_mem_bytes"],
        "model_state_bytes": sum(held.values()),
        "final_loss": summary["final_loss"],
    }


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    base = load_spec(sys.argv[1])
    for layout in sys.argv[2:] or DEFAULT_LAYOUTS:
        try:
            line = run_layout(base, layout)
        except ValidationError as err:
            line = {"layout": layout, "error": "; ".join(describe_errors(err))}
        except (ValueError, TrainingFailed) as err:
            line = {"layout": layout, "error": str(err).splitlines()[0]}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
