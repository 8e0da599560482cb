"""Recovery from each kind of fault, through the service and its fault-injection API.

Starts `shardline serve` on its embedded defaults (a local Ray head), and for each fault
kind submits the same small job, injects the fault once the job has trained a few steps,
and waits for it to end. Prints one JSON line per kind: the job's end state, the recovery
event's MTTR (failure to the first new step), steps lost, seconds lost, and the job's
goodput as GET /v1/jobs/{id} shows it.

    .venv/bin/python -m bench.recovery [KIND ...] [--trials N] [--at-step S]
        [--restart in-place|full|both] [--steps N] [--repeat K [--every S]]
        (kinds: kill hang raise nan supervisor node_loss preemption; with N > 1, a
        summary line per kind: p50 and p99 MTTR, mean steps lost and goodput; with
        `both`, N trials of each, in turn, and a summary line for each)

The node kinds run on a cluster of two local Ray nodes (the head takes other nodes, and
each trial starts a second node at its own loopback address with its own host memory:
service/local_nodes.py). Their job is elastic on 4 ranks, two on each node, with
snapshots every 2 steps: `node_loss` kills the second node (and its host memory);
`preemption` drains it with a 20 s deadline, as a spot handler would, and kills it once
the job has left it. Their trials also compare each step's loss with the same job trained
uninterrupted in one process (`max_loss_rel_diff`).

With `--repeat K` each trial is one job that gets the fault K times, each once the job has
trained S new steps (`--every`, default 6) past its last recovery: failures seconds apart
with training between them, which must not be taken for a crash loop. Its line gives every
recovery's MTTR, their p50 and maximum.

Two clocks: `mttr_s` is the recovery event's (from when the supervisor saw the failure
to the first new step it saw), `fault_to_step_s` is from the fault's injection to that
recovery event, both as the database recorded them: it adds the time to notice the
failure and to take the old ranks down.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import signal
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shardline.api.client import Client, Conflict
from shardline.api.local_service import local_service
from shardline.service.local_nodes import (
    FAST_NODE_DEATH,
    LocalNode,
    drain_for_preemption,
    start_local_node,
)
from shardline.service.local_ray import LocalRay, start_local_ray
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.launch import train_local

log = logging.getLogger(__name__)

KINDS = ("kill", "hang", "supervisor", "node_loss", "preemption")
NODE_KINDS = ("node_loss", "preemption")
CPUS_PER_NODE = 2
DEADLINE_S = 20
INJECT_AT_STEP = 10
LIMIT_S = 600.0

SPEC: dict[str, Any] = {
    "name": "bench-recovery",
    "model": {"preset": "tiny", "seq_len": 32},
    "parallel": {"dp": 2, "zero_stage": 2},
    "train": {
        "steps": 40,
        "global_batch_size": 4,
        "micro_batch_size": 1,
        "lr": 3e-3,
        "log_every": 1,
        "seed": 11,
    },
    "checkpoint": {"every_steps": 4},
    "fault_tolerance": {"max_failures": 2, "hang_timeout_s": 8},
}


# Two ranks on each of two nodes; it goes on at 2 ranks on one.
NODE_SPEC: dict[str, Any] = {
    **SPEC,
    "parallel": {"dp": 4, "zero_stage": 2},
    "train": {**SPEC["train"], "global_batch_size": 8},
    "checkpoint": {"every_steps": 20, "memory_every_steps": 2},
    "fault_tolerance": {"max_failures": 2, "hang_timeout_s": 8, "elastic": {"min_dp": 1}},
}


def wait(client: Client, job_id: str, done: Any) -> dict[str, Any]:
    deadline = time.monotonic() + LIMIT_S
    while True:
        job = client.get(job_id)
        if done(job) or job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} is still {job['state']} after {LIMIT_S:.0f}s")
        time.sleep(0.2)


def kill_supervisor(state_dir: Path, job_id: str) -> None:
    """SIGKILL the job's supervisor process (no API for this: it is what the reconciler
    recovers from, not a rank's fault)."""
    from shardline.service.local_ray import find_local_ray

    head = find_local_ray(state_dir)
    if head is None:
        raise RuntimeError("no local Ray head found")
    head.use_auth()
    import ray

    from shardline.workers.runtime.names import NAMESPACE, supervisor_name

    if not ray.is_initialized():
        ray.init(address=head.address, namespace=NAMESPACE, log_to_driver=False)
    actor = ray.get_actor(supervisor_name(job_id), namespace=NAMESPACE)
    pid: Any = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60)
    os.kill(int(pid), signal.SIGKILL)


def second_node_id(head: LocalRay, ip: str) -> str:
    head.use_auth()  # before ray is imported: it reads its authentication settings then
    import ray

    if not ray.is_initialized():
        ray.init(address=head.address, log_to_driver=False)
    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == ip)


def lose_node(client: Client, head: LocalRay, node: LocalNode, kind: str, job_id: str) -> datetime:
    """Kill or drain the second node under the job; when the fault began."""
    began = datetime.now(UTC)
    if kind == "node_loss":
        node.kill()
        return began
    drain_for_preemption(head, second_node_id(head, node.ip), DEADLINE_S)
    # Once the job trains off the node (its recovery closed), the provider takes it.
    deadline = time.monotonic() + LIMIT_S
    while not any(
        (e["data"] or {}).get("kind") == "recovery" for e in client.events(job_id, after=0)
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} did not leave the drained node")
        time.sleep(0.2)
    node.kill()
    return began


def measure(
    client: Client,
    state_dir: Path,
    kind: str,
    at_step: int = INJECT_AT_STEP,
    cluster: tuple[LocalRay, LocalNode] | None = None,
    in_place: bool = True,
    total_steps: int | None = None,
) -> dict[str, Any]:
    base = NODE_SPEC if kind in NODE_KINDS else SPEC
    ft = {**base["fault_tolerance"], "recover_in_place": in_place}
    train = {**base["train"], "steps": total_steps or base["train"]["steps"]}
    spec = {**base, "fault_tolerance": ft, "train": train}
    job = client.submit({**spec, "name": f"bench-recovery-{kind}"})
    wait(client, job["id"], lambda j: j["state"] == "RUNNING" and j["step"] >= at_step)
    began: datetime | None = None
    if cluster is not None:
        began = lose_node(client, *cluster, kind, job["id"])
    elif kind == "supervisor":
        kill_supervisor(state_dir, job["id"])
    else:
        try:
            client.inject_fault(job["id"], kind, rank=1)
        except Conflict as refused:  # the job ended its training first: nothing measured
            log.warning("job %s: %s", job["id"], refused)
    end = wait(client, job["id"], lambda j: False)
    events = client.events(job["id"], after=0)
    closed = [e for e in events if (e["data"] or {}).get("kind") == "recovery"]
    recoveries = [e["data"] for e in closed]
    metrics = client.metrics(job["id"])
    steps = [m["step"] for m in metrics]
    # Node kinds: the losses against the same job trained uninterrupted in one process
    # (every layout trains like one process, so an elastic re-plan must keep them).
    loss_diff = None
    if kind in NODE_KINDS and steps == list(range(1, spec["train"]["steps"] + 1)):
        loss_diff = max_relative_difference(
            [m["loss"] for m in metrics], reference_losses(json.dumps(spec, sort_keys=True))
        )
    fault_to_step = None
    faults = [e for e in events if e["message"].startswith("fault injected")]
    if began is None and faults:
        began = datetime.fromisoformat(faults[0]["time"])
    if closed and began is not None:
        took = _aware(datetime.fromisoformat(closed[0]["time"])) - _aware(began)
        fault_to_step = round(took.total_seconds(), 2)
    return {
        "fault": kind,
        "restart": "in place" if in_place else "full",
        "state": end["state"],
        "restarts": end["restarts"],
        "recoveries": len(recoveries),
        "mttr_s": round(recoveries[0]["mttr_s"], 2) if recoveries else None,
        "fault_to_step_s": fault_to_step,
        "restored_step": recoveries[0]["restored_step"] if recoveries else None,
        # Whether it went in place, or why every rank restarted.
        "in_place": recoveries[0].get("in_place") if recoveries else None,
        "why_not_in_place": recoveries[0].get("why_not_in_place") if recoveries else None,
        "steps_lost": end["steps_lost"],
        "seconds_lost": round(end["seconds_lost"], 2),
        "goodput": round(end["goodput"], 3) if end["goodput"] is not None else None,
        "every_step_once": steps == list(range(1, spec["train"]["steps"] + 1)),
        # Where it was not: the steps never recorded, and those recorded twice.
        "missing": sorted(set(range(1, spec["train"]["steps"] + 1)) - set(steps)),
        "repeated": sorted({s for s in steps if steps.count(s) > 1}),
        "cause": recoveries[0]["cause"] if recoveries else end["failure_reason"],
        "max_loss_rel_diff": None if loss_diff is None else float(f"{loss_diff:.2g}"),
    }


def measure_repeated(client: Client, kind: str, kills: int, every: int) -> dict[str, Any]:
    """One job, `kind` on rank 1 `kills` times, each once the job trained `every` steps
    past its last recovery (or past `every` for the first)."""
    steps = (kills + 2) * (every + 8)  # room for each kill's steps and the ones retrained
    train = {**SPEC["train"], "steps": steps, "log_every": 1}
    ft = {**SPEC["fault_tolerance"], "max_failures": kills + 1}
    job = client.submit(
        {**SPEC, "name": f"bench-recovery-{kind}-x{kills}", "train": train, "fault_tolerance": ft}
    )
    recovered_at = 0
    for n in range(kills):
        wait(
            client,
            job["id"],
            lambda j, at=recovered_at: j["state"] == "RUNNING" and j["step"] >= at + every,
        )
        try:
            client.inject_fault(job["id"], kind, rank=1)
        except Conflict as refused:  # the job ended its training first
            log.warning("job %s: %s", job["id"], refused)
            break
        # Until this fault's recovery has closed (a new step trained after it).
        wait(client, job["id"], lambda j, want=n + 1: len(_recoveries(client, j["id"])) >= want)
        recovered_at = client.get(job["id"])["step"]
    end = wait(client, job["id"], lambda j: False)
    recoveries = _recoveries(client, job["id"])
    mttr = [round(r["mttr_s"], 2) for r in recoveries]
    messages = [e["message"] for e in client.events(job["id"], after=0)]
    metrics = [m["step"] for m in client.metrics(job["id"])]
    return {
        "fault": kind,
        "kills": kills,
        "every_steps": every,
        "state": end["state"],
        "recoveries": len(recoveries),
        "mttr_s": mttr,
        "mttr_p50_s": round(statistics.median(mttr), 2) if mttr else None,
        "mttr_max_s": max(mttr) if mttr else None,
        "faults_delivered": sum(m.startswith("fault injected") for m in messages),
        "crash_loops_said": sum("crash loop" in m for m in messages),
        "every_step_once": metrics == list(range(1, steps + 1)),
    }


def _recoveries(client: Client, job_id: str) -> list[dict[str, Any]]:
    return [
        e["data"]
        for e in client.events(job_id, after=0)
        if (e["data"] or {}).get("kind") == "recovery"
    ]


@functools.cache
def reference_losses(spec_json: str) -> list[float]:
    """Each step's loss of the spec trained uninterrupted in one process."""
    spec = json.loads(spec_json)
    alone = {**spec, "parallel": {"dp": 1}, "fault_tolerance": {"max_failures": 0}}
    rows: list[dict[str, Any]] = []
    train_local(JobSpec.model_validate(alone), 1, on_metrics=rows.append)
    return [float(r["loss"]) for r in rows]


def max_relative_difference(got: list[float], want: list[float]) -> float:
    if len(got) != len(want):
        return math.inf
    return max((abs(g - w) / abs(w) for g, w in zip(got, want, strict=True)), default=0.0)


def _aware(moment: datetime) -> datetime:
    """The database's times are UTC, with or without saying so."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (of 10 trials, p99 is the slowest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summary(kind: str, trials: list[dict[str, Any]]) -> dict[str, Any]:
    mttr = [t["mttr_s"] for t in trials if t["mttr_s"] is not None]
    whole = [t["fault_to_step_s"] for t in trials if t["fault_to_step_s"] is not None]
    return {
        "fault": kind,
        "restart": trials[0]["restart"],
        "trials": len(trials),
        "measured": len(mttr),  # those the fault reached before the job ended
        "succeeded": sum(t["state"] == "SUCCEEDED" for t in trials),
        "every_step_once": all(t["every_step_once"] for t in trials),
        "mttr_p50_s": round(percentile(mttr, 50), 2) if mttr else None,
        "mttr_p99_s": round(percentile(mttr, 99), 2) if mttr else None,
        "fault_to_step_p50_s": round(percentile(whole, 50), 2) if whole else None,
        "fault_to_step_p99_s": round(percentile(whole, 99), 2) if whole else None,
        "steps_lost_mean": round(statistics.mean(t["steps_lost"] for t in trials), 1),
        "goodput_mean": round(statistics.mean(t["goodput"] or 0.0 for t in trials), 3),
        **_loss_summary(trials),
    }


def _loss_summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The largest loss difference from an uninterrupted run, where trials measured one."""
    diffs = [t["max_loss_rel_diff"] for t in trials if t.get("max_loss_rel_diff") is not None]
    return {"max_loss_rel_diff": float(f"{max(diffs):.2g}")} if diffs else {}


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kinds", nargs="*", default=list(KINDS), help=f"of {', '.join(KINDS)}")
    parser.add_argument("--trials", type=int, default=1, help="jobs per kind (default 1)")
    parser.add_argument(
        "--at-step", type=int, default=INJECT_AT_STEP, help="inject once the job reaches it"
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"the job's steps (default {SPEC['train']['steps']}): a later --at-step, "
        "once the warm spares have started, needs more",
    )
    parser.add_argument(
        "--restart",
        choices=("in-place", "full", "both"),
        default="in-place",
        help="recover in place (the default), restart every rank, or both in turn",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="faults per job, each after --every new steps"
    )
    parser.add_argument("--every", type=int, default=6, help="new steps between faults")
    args = parser.parse_args()
    if args.repeat > 1:
        with (
            tempfile.TemporaryDirectory(prefix="shardline-bench-") as state,
            local_service(Path(state)) as svc,
            svc.client() as client,
        ):
            for kind in args.kinds:
                for _ in range(args.trials):
                    got = measure_repeated(client, kind, args.repeat, args.every)
                    print(json.dumps(got), flush=True)
        return
    modes = {"in-place": [True], "full": [False], "both": [True, False]}[args.restart]
    with tempfile.TemporaryDirectory(prefix="shardline-bench-") as state:
        head = None
        if set(args.kinds) & set(NODE_KINDS):
            # A head that takes other nodes, started first: `shardline serve` adopts it.
            os.environ.update(FAST_NODE_DEATH)
            head = start_local_ray(Path(state), CPUS_PER_NODE, loopback=False)
        with local_service(Path(state)) as svc, svc.client() as client:
            nodes = 0
            for kind in args.kinds:
                trials: dict[bool, list[dict[str, Any]]] = {mode: [] for mode in modes}
                for trial in range(args.trials * len(modes)):
                    in_place = modes[trial % len(modes)]  # in turn: both see the same load
                    cluster = None
                    if kind in NODE_KINDS and head is not None:
                        nodes += 1  # a fresh node (and address) each trial
                        node = start_local_node(
                            head,
                            Path(state) / "nodes",
                            f"node{nodes}",
                            f"127.0.0.{nodes + 1}",
                            CPUS_PER_NODE,
                        )
                        cluster = (head, node)
                        wait_for_cpus(client, 2 * CPUS_PER_NODE)
                    try:
                        got = measure(
                            client, Path(state), kind, args.at_step, cluster, in_place, args.steps
                        )
                    finally:
                        if cluster is not None:
                            cluster[1].kill()
                    trials[in_place].append(got)
                    print(json.dumps(got), flush=True)
                for mode in modes:
                    if args.trials > 1:
                        print(json.dumps(summary(kind, trials[mode])), flush=True)


def wait_for_cpus(client: Client, cpus: float) -> None:
    deadline = time.monotonic() + 120
    while client.cluster()["resources"].get("CPU", 0) < cpus:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the cluster has not {cpus} CPUs: {client.cluster()}")
        time.sleep(0.5)


if __name__ == "__main__":
    main()
