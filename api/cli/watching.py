"""Watching a job to its end: `shardline follow` (a progress bar) and `shardline wait`
(for scripts). Both exit 0 only when the job SUCCEEDED."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any

import typer

from shardline.api.cli.common import (
    TokenOption,
    UrlOption,
    api_errors,
    client,
    console,
    fail,
    step_progress,
)
from shardline.api.client import TERMINAL_STATES, Client, ServerUnreachable

# How long a follow rides out an unreachable server (a restart, an upgrade) before it
# gives up; the job itself does not depend on the server being up.
UNREACHABLE_GRACE_S = 120.0


def follow(job_id: str, url: UrlOption = None, token: TokenOption = None) -> None:
    """Show a job's progress until it ends; exit 0 only if it SUCCEEDED.

    Follows through pauses and resumes; exits 1 if the job FAILED or was CANCELLED."""

    with api_errors(), client(url, token) as c:
        job = c.get(job_id)
        final = follow_job(c, job["id"], job["steps"])
    end_with(final)


def wait(
    job_id: str,
    timeout: Annotated[
        float | None, typer.Option(min=0, help="Give up after this many seconds (exit 124).")
    ] = None,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Wait until a job ends, for scripts; exit 0 only if it SUCCEEDED.

    Prints the end state; exits 1 if the job FAILED or was CANCELLED, 124 on --timeout."""

    deadline = None if timeout is None else time.monotonic() + timeout
    with api_errors(), client(url, token) as c:
        poll = Poller(c, job_id)
        while True:
            job = poll()
            if job is not None and job["state"] in TERMINAL_STATES:
                break
            if deadline is not None and time.monotonic() >= deadline:
                state = job["state"] if job is not None else "unknown (server unreachable)"
                raise fail([f"job {job_id} is still {state} after {timeout:g}s"], code=124)
            time.sleep(1.0)
    console.print(f"{job['id']}  {job['state']}  step {job['step']}/{job['steps']}")
    end_with(job)


def follow_job(
    c: Client, job_id: str, steps: int, on_poll: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """A progress bar of the job's steps until it ends; returns the final job. Where
    stdout is not a terminal (a log file, CI), a plain line instead whenever the job's
    step or state changes, at most every PLAIN_EVERY_S unless its state changed."""
    poll = Poller(c, job_id)
    plain = PlainProgress(job_id, steps) if not console.is_terminal else None
    with step_progress(disable=plain is not None) as progress:
        task = progress.add_task(job_id, total=steps, status="")
        while True:
            job = poll()
            if job is None:
                progress.update(task, status="server unreachable; retrying")
                if plain is not None:
                    plain.say("server unreachable; retrying")
                time.sleep(1.0)
                continue
            progress.update(task, completed=job["step"], status=describe(job))
            if plain is not None:
                plain.job(job)
            if on_poll is not None:
                on_poll(job)
            if job["state"] in TERMINAL_STATES:
                return job
            time.sleep(1.0)


# A plain progress line at most this often while only the step moves.
PLAIN_EVERY_S = 5.0


class PlainProgress:
    """Progress as plain lines on stdout, with the time left at the rate seen so far."""

    def __init__(self, job_id: str, steps: int) -> None:
        self.job_id, self.steps = job_id, steps
        self.last_line = ""
        self.last_state = ""
        self.last_said = 0.0
        self.first: tuple[float, int] | None = None  # (time, step) when training was seen

    def job(self, job: dict[str, Any]) -> None:
        now = time.monotonic()
        step, state = int(job["step"]), str(job["state"])
        if state == "RUNNING" and (self.first is None or step < self.first[1]):
            self.first = (now, step)
        line = f"{self.job_id}  step {step}/{self.steps}  {describe(job)}"
        eta = self._eta(now, step) if state == "RUNNING" else None
        due = now - self.last_said >= PLAIN_EVERY_S or state != self.last_state
        if line != self.last_line and (due or state in TERMINAL_STATES):
            self.say(line + (f"  eta {eta}" if eta else ""))
            self.last_line, self.last_state = line, state

    def _eta(self, now: float, step: int) -> str | None:
        if self.first is None or step <= self.first[1] or now <= self.first[0]:
            return None
        rate = (step - self.first[1]) / (now - self.first[0])
        left = int((self.steps - step) / rate)
        return f"{left // 60}m{left % 60:02d}s"

    def say(self, line: str) -> None:
        console.print(line, highlight=False, soft_wrap=True)
        self.last_said = time.monotonic()


class Poller:
    """Reads a job again and again; rides out an unreachable server for up to
    UNREACHABLE_GRACE_S (then the connection error is raised, for api_errors to report)."""

    def __init__(self, c: Client, job_id: str) -> None:
        self.c, self.job_id = c, job_id
        self.unreachable_since: float | None = None

    def __call__(self) -> dict[str, Any] | None:
        """The job, or None while the server cannot be reached."""
        try:
            job = self.c.get(self.job_id)
        except ServerUnreachable:
            now = time.monotonic()
            self.unreachable_since = self.unreachable_since or now
            if now - self.unreachable_since > UNREACHABLE_GRACE_S:
                raise
            return None
        self.unreachable_since = None
        return job


def describe(job: dict[str, Any]) -> str:
    """The job's state, loss and why it waits, for the progress bar."""
    metrics = job.get("latest_metrics") or {}
    status = str(job["state"])
    if "loss" in metrics:
        status += f"  loss {metrics['loss']:.4f}"
    if job.get("queue_reason") and job["state"] == "QUEUED":
        status += f"  ({job['queue_reason']})"
    return status


def end_with(job: dict[str, Any]) -> None:
    """Return for a SUCCEEDED job; otherwise say how it ended and exit 1."""
    if job["state"] == "SUCCEEDED":
        return
    reason = job.get("failure_reason")
    raise fail([f"job {job['id']} ended {job['state']}" + (f": {reason}" if reason else "")], 1)
