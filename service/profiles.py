"""Profiles on demand, as the control plane keeps them: a folder per profile under the
job's `profiles/`, with `request.json` (what was asked, when, of which workers) beside each
rank's trace (workers/runtime/profiling.py writes them). No database row: the files are
the state.

A profile is `recording` until every rank it was sent to has written its trace (`done`),
or one rank wrote why it could not, or the job's workers changed first (a restart, a pause,
its end: the job's version moved on) or too long went by (`failed`, which is then written
down and stays). A job records one profile at a time (`active` names it, created with
O_EXCL). The merged trace names each rank's process "rank R", so Perfetto and
chrome://tracing show one track group per rank; it is merged once and kept.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardline.service.store import StoreError
from shardline.workers.runtime.profiling import trace_file, write_atomically

MAX_STEPS = 20  # a profile's steps, at most (ProfileCreate's bound)
# A backstop for a rank that never writes (its job's own hang detection restarts a stuck
# rank long before, which ends the profile sooner).
RECORDING_LIMIT_S = 3600.0
# The ranks' traces together, at most: merging holds one rank's trace in memory at a time.
MAX_MERGED_BYTES = 256 * 2**20
REQUEST = "request.json"
FAILED = "request.error"
MERGED = "merged.json"
ACTIVE = "active"

# One merge at a time in the service: a merge holds a rank's whole trace in memory, and two
# first downloads of one profile would otherwise write the same file at once.
_MERGING = threading.Lock()


class ProfileBusy(StoreError):
    """The job is recording another profile (the API: 409)."""

    code = "conflict"


class ProfileNotFound(StoreError):
    code = "not_found"


class ProfileTooLarge(StoreError):
    """The ranks' traces together are more than the API merges (409)."""

    code = "too_large"


class ProfileUnreadable(StoreError):
    """One of the profile's files is not what a rank or the API wrote (409)."""

    code = "conflict"


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

    def begin(self, steps: int, world_size: int, version: int) -> str:
        """A new profile's id, its request written, for workers of the job at `version`;
        ProfileBusy while another records."""
        self.folder.mkdir(parents=True, exist_ok=True)
        profile_id = uuid.uuid4().hex[:12]
        for _ in range(2):
            try:
                fd = os.open(self.folder / ACTIVE, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                self._busy_or_clear(version)
                continue
            with os.fdopen(fd, "w") as out:
                out.write(profile_id)
            break
        else:
            raise ProfileBusy("another profile of this job began just now; try again")
        request = {
            "steps": steps,
            "world_size": world_size,
            "version": version,
            "requested_at": time.time(),
        }
        (self.folder / profile_id).mkdir()
        write_atomically(self.folder / profile_id / REQUEST, json.dumps(request))
        return profile_id

    def _busy_or_clear(self, version: int) -> None:
        """ProfileBusy if the profile `active` names still records; else forget it."""
        active = self.folder / ACTIVE
        try:
            other = active.read_text().strip()
        except FileNotFoundError:
            return
        try:
            still = self.state(other, version).state == "recording"
        except ProfileNotFound:  # its begin() has not written its request yet
            still = time.time() - active.stat().st_mtime < 60
        if still:
            raise ProfileBusy(
                f"profile {other} of this job is still recording; wait for it "
                f"(GET .../profiles/{other})"
            )
        active.unlink(missing_ok=True)

    def sent_to(self, profile_id: str, ranks: int) -> None:
        """The ranks the supervisor armed: fewer than the spec's for a shrunk elastic job."""
        where = self._folder_of(profile_id)
        request = _read(where / REQUEST) | {"world_size": ranks}
        write_atomically(where / REQUEST, json.dumps(request))

    def fail(self, profile_id: str, message: str) -> None:
        """The profile cannot finish: say so where its state is read, for good."""
        write_atomically(self._folder_of(profile_id) / FAILED, json.dumps({"error": message}))
        self._release(profile_id)

    def state(self, profile_id: str, version: int | None) -> ProfileState:
        """`version`: the job's now while it is RUNNING, None when it is not (a profile
        cannot finish then)."""
        where = self._folder_of(profile_id)
        request = _read(where / REQUEST)
        world = int(request["world_size"])
        done = [r for r in range(world) if trace_file(where, r).is_file()]
        errors = sorted(where.glob("*.error"))  # a rank's, or the profile's own
        error = "; ".join(str(_read(p).get("error")) for p in errors) if errors else None
        if error is None and len(done) < world:
            if version is None or version != request.get("version"):
                error = "the job's workers stopped or changed before every rank wrote its trace"
            elif time.time() - float(request["requested_at"]) > RECORDING_LIMIT_S:
                error = f"not every rank wrote its trace within {RECORDING_LIMIT_S:.0f} s"
            if error is not None:
                self.fail(profile_id, error)
        state = "failed" if error else "done" if len(done) == world else "recording"
        if state == "done":
            self._release(profile_id)
        return ProfileState(
            profile_id,
            int(request["steps"]),
            world,
            state,
            done,
            float(request["requested_at"]),
            error,
        )

    def merged_trace(self, profile_id: str) -> Path:
        """Every rank's trace in one file (made once): each event's process is its rank."""
        where = self._folder_of(profile_id)
        merged = where / MERGED
        if merged.is_file():
            return merged
        with _MERGING:
            if merged.is_file():  # merged by the request this one waited for
                return merged
            world = int(_read(where / REQUEST)["world_size"])
            size = sum(trace_file(where, rank).stat().st_size for rank in range(world))
            if size > MAX_MERGED_BYTES:
                raise ProfileTooLarge(
                    f"the {world} ranks' traces are {size >> 20} MiB together, over the "
                    f"{MAX_MERGED_BYTES >> 20} MiB merged here; profile fewer steps"
                )
            write_atomically(merged, _merged_chunks(where, world))
        return merged

    def _release(self, profile_id: str) -> None:
        active = self.folder / ACTIVE
        try:
            if active.read_text().strip() == profile_id:
                active.unlink(missing_ok=True)
        except FileNotFoundError:
            pass

    def _folder_of(self, profile_id: str) -> Path:
        where = self.folder / profile_id
        # An id is 12 hex digits: anything else (a path, "..") is no profile of this job.
        if not (len(profile_id) == 12 and profile_id.isalnum()) or not (where / REQUEST).is_file():
            raise ProfileNotFound(f"no profile {profile_id} of this job")
        return where


def _merged_chunks(where: Path, world: int) -> Iterator[str]:
    yield '{"displayTimeUnit": "ms", "traceEvents": ['
    first = True
    for rank in range(world):
        trace = _read(trace_file(where, rank))
        events: list[dict[str, Any]] = [
            {
                "name": "process_name",
                "ph": "M",
                "pid": rank,
                "tid": 0,
                "args": {"name": f"rank {rank}"},
            },
            {
                "name": "process_sort_index",
                "ph": "M",
                "pid": rank,
                "tid": 0,
                "args": {"sort_index": rank},
            },
        ]
        for event in trace.get("traceEvents", []):
            if event.get("ph") == "M" and event.get("name") == "process_name":
                continue  # the rank's own process names would hide "rank R"
            events.append({**event, "pid": rank})
        for event in events:
            yield ("" if first else ",") + json.dumps(event)
            first = False
    yield "]}"


def _read(path: Path) -> dict[str, Any]:
    """A profile's JSON file; one that cannot be read is a failed profile, not a 500."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ProfileUnreadable(f"{path.name} of this profile cannot be read: {err}") from None
    if not isinstance(value, dict):
        raise ProfileUnreadable(f"{path.name} of this profile is not a JSON object")
    return value
