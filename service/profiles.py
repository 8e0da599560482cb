"""Profiles on demand, as the control plane keeps them: a folder per profile under the
job's `profiles/`, with `request.json` (what was asked, when) beside each rank's trace
(workers/runtime/profiling.py writes them). No database row: the files are the state.

A profile is `recording` until every rank has written its trace (`done`), one rank has
written why it could not, or the job stopped running or took too long first (`failed`).
A job has one profile recording at a time. The merged trace names each rank's process
"rank R", so Perfetto and chrome://tracing show one track group per rank.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.store import StoreError
from workers.runtime.profiling import trace_file

MAX_STEPS = 20
# A profile still recording after this long has failed (a rank that never reached the
# steps: stalled, or its job was paused and resumed under new workers).
RECORDING_LIMIT_S = 600.0
REQUEST = "request.json"
# The merged trace is built in the API's memory: its ranks' traces together at most this.
MAX_MERGED_BYTES = 512 * 2**20


class ProfileBusy(StoreError):
    """The job is recording another profile (the API: 409)."""

    code = "conflict"


class ProfileNotFound(StoreError):
    code = "not_found"


class ProfileTooLarge(StoreError):
    """The ranks' traces together are more than the API merges in memory (409)."""

    code = "too_large"


@dataclass(frozen=True)
class ProfileState:
    id: str
    steps: int
    world_size: int
    state: str  # recording, done or failed
    ranks_done: list[int]
    requested_at: float  # Unix time
    error: str | None


class Profiles:
    def __init__(self, folder: Path) -> None:
        self.folder = folder  # the job's profiles/ (JobLayout.profiles_dir)

    def begin(self, steps: int, world_size: int, running: bool) -> str:
        """A new profile's id, its request written; ProfileBusy if one is recording."""
        for state in self.all(running):
            if state.state == "recording":
                raise ProfileBusy(
                    f"profile {state.id} of this job is still recording; wait for it "
                    f"(GET .../profiles/{state.id})"
                )
        profile_id = uuid.uuid4().hex[:12]
        where = self.folder / profile_id
        where.mkdir(parents=True)
        request = {"steps": steps, "world_size": world_size, "requested_at": time.time()}
        (where / REQUEST).write_text(json.dumps(request))
        return profile_id

    def fail(self, profile_id: str, message: str) -> None:
        """The request never reached the ranks: say so where the state is read."""
        (self.folder / profile_id / "request.error").write_text(json.dumps({"error": message}))

    def all(self, running: bool) -> Iterator[ProfileState]:
        if self.folder.is_dir():
            for where in sorted(self.folder.iterdir()):
                if (where / REQUEST).is_file():
                    yield self.state(where.name, running)

    def state(self, profile_id: str, running: bool) -> ProfileState:
        """`running`: whether the job is running now (a profile cannot finish otherwise)."""
        where = self._folder_of(profile_id)
        request = json.loads((where / REQUEST).read_text())
        world = int(request["world_size"])
        done = [r for r in range(world) if trace_file(where, r).is_file()]
        errors = sorted(where.glob("*.error"))  # a rank's, or the request's own
        error: str | None = None
        if errors:
            error = "; ".join(json.loads(p.read_text())["error"] for p in errors)
        elif len(done) < world and not running:
            error = "the job stopped running before every rank had written its trace"
        elif len(done) < world and time.time() - request["requested_at"] > RECORDING_LIMIT_S:
            error = f"not every rank wrote its trace within {RECORDING_LIMIT_S:.0f} s"
        state = "failed" if error else "done" if len(done) == world else "recording"
        return ProfileState(
            profile_id, int(request["steps"]), world, state, done, request["requested_at"], error
        )

    def merged_trace(self, profile_id: str) -> dict[str, Any]:
        """Every rank's trace in one: each event's process is its rank, named so."""
        where = self._folder_of(profile_id)
        world = int(json.loads((where / REQUEST).read_text())["world_size"])
        size = sum(trace_file(where, rank).stat().st_size for rank in range(world))
        if size > MAX_MERGED_BYTES:
            raise ProfileTooLarge(
                f"the {world} ranks' traces are {size >> 20} MiB together, over the "
                f"{MAX_MERGED_BYTES >> 20} MiB merged here; profile fewer steps"
            )
        events: list[dict[str, Any]] = []
        for rank in range(world):
            trace = json.loads(trace_file(where, rank).read_text())
            events.append(_meta("process_name", rank, {"name": f"rank {rank}"}))
            events.append(_meta("process_sort_index", rank, {"sort_index": rank}))
            for event in trace.get("traceEvents", []):
                if event.get("ph") == "M" and event.get("name") == "process_name":
                    continue  # the rank's own process names would hide "rank R"
                events.append({**event, "pid": rank})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def _folder_of(self, profile_id: str) -> Path:
        where = self.folder / profile_id
        # An id is 12 hex digits: anything else (a path, "..") is no profile of this job.
        if not (len(profile_id) == 12 and profile_id.isalnum()) or not (where / REQUEST).is_file():
            raise ProfileNotFound(f"no profile {profile_id} of this job")
        return where


def _meta(name: str, rank: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": rank, "tid": 0, "args": args}
