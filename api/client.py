"""The Python SDK: a thin, typed client of the REST API on httpx.

from shardline.api.client import Client
client = Client.from_env()  # or Client("http://127.0.0.1:8000", token)
job = client.submit("examples/tiny.yaml")
client.wait(job["id"], timeout=600)
"""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import httpx

from shardline.api.credentials import NoCredentials, find_credentials
from shardline.workers.contract.lifecycle import TERMINAL
from shardline.workers.contract.spec import JobSpec, load_spec

TERMINAL_STATES = frozenset(state.value for state in TERMINAL)

log = logging.getLogger(__name__)


class ShardlineError(Exception):
    """An error answered by the API; `code` is its machine-readable code."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message, self.details = status, code, message, details


class Unauthorized(ShardlineError):
    pass


class Forbidden(ShardlineError):
    pass


class NotFound(ShardlineError):
    pass


class Conflict(ShardlineError):
    pass


class InvalidRequest(ShardlineError):
    pass


# What a request on a connection the server has just closed fails with.
_STALE_CONNECTION = (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError)


class ServerUnreachable(ShardlineError):
    """No answer from the server: it cannot be reached, or did not answer in time. The
    message names the URL tried."""

    def __init__(self, url: str, err: httpx.TransportError, request: str = "") -> None:
        detail = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        if isinstance(err, httpx.UnsupportedProtocol):
            code = "bad_url"
            message = (
                f"the server address {url} does not start with http:// or https://; "
                f"write it as http://{url.split('://')[-1]} (--url, SHARDLINE_URL or login)"
            )
        elif isinstance(err, _STALE_CONNECTION) and not request.startswith("GET"):
            # Sent, then the connection broke: the server may have done it.
            code = "connection_lost"
            message = (
                f"the connection to the Shardline server at {url} broke during {request} "
                f"({detail}); it may have been done: check before sending it again"
            )
        else:
            if isinstance(err, httpx.TimeoutException) and not isinstance(
                err, httpx.ConnectTimeout
            ):
                code, said = "timeout", f"the Shardline server at {url} did not answer in time"
            else:
                code, said = "unreachable", f"cannot reach the Shardline server at {url}"
            message = f"{said} ({detail}); is `shardline serve` running there?"
        super().__init__(0, code, message)
        self.url = url


class WaitTimeout(TimeoutError):
    pass


__all__ = [
    "TERMINAL_STATES",
    "Client",
    "Conflict",
    "Forbidden",
    "InvalidRequest",
    "NoCredentials",
    "NotFound",
    "ServerUnreachable",
    "ShardlineError",
    "Unauthorized",
    "WaitTimeout",
]


_BY_STATUS: dict[int, type[ShardlineError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    400: InvalidRequest,
    413: InvalidRequest,
    422: InvalidRequest,
}


def _spec_body(spec: JobSpec | dict[str, Any] | str | Path) -> dict[str, Any]:
    if isinstance(spec, JobSpec):
        return spec.model_dump(mode="json", exclude_defaults=True)
    if isinstance(spec, dict):
        return spec
    return load_spec(spec).model_dump(mode="json", exclude_defaults=True)


class Client:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        token_source: str | None = None,
    ) -> None:
        if not token:
            raise ValueError(
                "no API token: pass one, or use Client.from_env() (SHARDLINE_TOKEN, "
                "`shardline login`, or ./.shardline/admin-token)"
            )
        # Named in authentication errors, so the person knows which token to replace.
        self.token_source = token_source
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            timeout=timeout,
            headers={"Authorization": f"Bearer {token}"},
            transport=transport,
        )

    @classmethod
    def from_env(cls, url: str | None = None, *, timeout: float = 30.0) -> Client:
        """A client for the server and token found as the CLI finds them: SHARDLINE_URL and
        SHARDLINE_TOKEN, then `shardline login`'s file, then ./.shardline/admin-token.
        Raises NoCredentials (saying where it looked) when there is no token."""
        found = find_credentials(url)
        return cls(found.url, found.token, timeout=timeout, token_source=found.source)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return str(self._http.base_url).rstrip("/")

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._send(method, path, **kwargs)
        except httpx.TransportError as err:
            raise ServerUnreachable(self.url, err, f"{method} {path}") from err
        if response.is_success:
            return response.json()
        self._raise_for(response)

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except _STALE_CONNECTION as err:
            if method != "GET":
                raise
            # A kept-alive connection the server closed as this request went out (its idle
            # timeout, on a loaded host): a read is safe to send once more, on a new one.
            log.info("%s %s: %s; sending it again", method, path, type(err).__name__)
            return self._http.request(method, path, **kwargs)

    def _raise_for(self, response: httpx.Response) -> NoReturn:
        try:
            err = response.json()["error"]
            code, message, details = err["code"], err["message"], err.get("details")
        except (ValueError, KeyError, TypeError):
            code, message, details = "http_error", response.text[:500], None
        if response.status_code == 401 and self.token_source:
            message = f"{message} (the token came from {self.token_source})"
        cls = _BY_STATUS.get(response.status_code, ShardlineError)
        raise cls(response.status_code, code, message, details)

    def submit(
        self, spec: JobSpec | dict[str, Any] | str | Path, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Queue a job from a JobSpec, a dict, or a YAML/JSON file path."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._call("POST", "/v1/jobs", json=_spec_body(spec), headers=headers)

    def get(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def list(
        self, state: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> dict[str, Any]:
        params = {
            k: v
            for k, v in {"state": state, "limit": limit, "cursor": cursor}.items()
            if v is not None
        }
        return self._call("GET", "/v1/jobs", params=params)

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    def delete(self, job_id: str) -> dict[str, Any]:
        """Delete an ended job: its record, events, metrics, logs and checkpoints."""
        return self._call("DELETE", f"/v1/jobs/{job_id}")

    def inject_fault(self, job_id: str, kind: str, rank: int = 0) -> dict[str, Any]:
        """Admins: make one rank of a running job fail (kill, hang, raise, nan)."""
        return self._call("POST", f"/v1/jobs/{job_id}/faults", json={"kind": kind, "rank": rank})

    def pause(self, job_id: str) -> dict[str, Any]:
        """Checkpoint the job and free its workers (PAUSING, then PAUSED)."""
        return self._call("POST", f"/v1/jobs/{job_id}/pause")

    def resume(self, job_id: str) -> dict[str, Any]:
        """Queue a PAUSED job again; it continues from its checkpoint."""
        return self._call("POST", f"/v1/jobs/{job_id}/resume")

    def set_priority(self, job_id: str, priority: int) -> dict[str, Any]:
        """A new priority for a job that has not ended (an owner may only lower it)."""
        return self._call("PATCH", f"/v1/jobs/{job_id}", json={"priority": priority})

    def events(self, job_id: str, after: int = 0) -> builtins.list[dict[str, Any]]:
        return self._call("GET", f"/v1/jobs/{job_id}/events", params={"after": after})["events"]

    def metrics(self, job_id: str, since_step: int = 0) -> builtins.list[dict[str, Any]]:
        return self._call("GET", f"/v1/jobs/{job_id}/metrics", params={"since_step": since_step})[
            "metrics"
        ]

    def checkpoints(self, job_id: str) -> builtins.list[dict[str, Any]]:
        return self._call("GET", f"/v1/jobs/{job_id}/checkpoints")["checkpoints"]

    def logs(
        self, job_id: str, rank: int = 0, tail: int = 200, contains: str | None = None
    ) -> builtins.list[str]:
        """The last `tail` lines of a rank's log; with `contains`, the last that contain it."""
        params: dict[str, str | int] = {"rank": rank, "tail": tail}
        if contains is not None:
            params["contains"] = contains
        return self._call("GET", f"/v1/jobs/{job_id}/logs", params=params)["lines"]

    def download_log(self, job_id: str, dest: str | Path, rank: int = 0) -> Path:
        """A rank's whole log, as far as it has been written, saved to `dest`."""
        return self._save(f"/v1/jobs/{job_id}/logs/download", {"rank": rank}, dest)

    def follow_logs(self, job_id: str, rank: int = 0, tail: int = 200) -> Iterator[str]:
        """The last `tail` lines of a rank's log, then each new line until the job ends."""
        params: dict[str, str | int] = {"rank": rank, "tail": tail, "follow": "true"}
        # No read timeout: a quiet rank may write nothing for minutes.
        with self._stream(f"/v1/jobs/{job_id}/logs", params) as response:
            yield from response.iter_lines()

    def export(self, job_id: str, dest: str | Path, step: int | None = None) -> Path:
        """Download a checkpoint (`step`, or the newest) as a zipped Hugging Face folder."""
        params = {"step": step} if step is not None else {}
        # The server converts before it answers: no read timeout for a big model.
        return self._save(f"/v1/jobs/{job_id}/export", params, dest)

    def _save(self, path: str, params: dict[str, Any], dest: str | Path) -> Path:
        """A streamed GET written to `dest`."""
        with self._stream(path, params) as response, Path(dest).open("wb") as out:
            for chunk in response.iter_bytes():
                out.write(chunk)
        return Path(dest)

    @contextmanager
    def _stream(self, path: str, params: dict[str, Any]) -> Iterator[httpx.Response]:
        """A streamed GET with no read timeout; an error answer raises as `_call` does."""
        timeout = httpx.Timeout(self._http.timeout.connect, read=None)
        try:
            with self._http.stream("GET", path, params=params, timeout=timeout) as response:
                if not response.is_success:
                    response.read()
                    self._raise_for(response)
                yield response
        except httpx.TransportError as err:
            raise ServerUnreachable(self.url, err, f"GET {path}") from err

    def profile(self, job_id: str, steps: int = 3) -> dict[str, Any]:
        """Have every rank of a RUNNING job record its next `steps` steps (1-20)."""
        return self._call("POST", f"/v1/jobs/{job_id}/profile", json={"steps": steps})

    def profile_state(self, job_id: str, profile_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}/profiles/{profile_id}")

    def wait_for_profile(
        self, job_id: str, profile_id: str, timeout: float = 300.0, poll_s: float = 0.5
    ) -> dict[str, Any]:
        """Poll until the profile is done or failed; returns its state, or raises
        WaitTimeout."""
        deadline = time.monotonic() + timeout
        while (state := self.profile_state(job_id, profile_id))["state"] == "recording":
            if time.monotonic() > deadline:
                raise WaitTimeout(f"profile {profile_id} still recording after {timeout}s")
            time.sleep(poll_s)
        return state

    def profile_trace(self, job_id: str, profile_id: str, dest: str | Path) -> Path:
        """Download a done profile's merged Chrome trace to `dest`."""
        return self._save(f"/v1/jobs/{job_id}/profiles/{profile_id}/trace", {}, dest)

    def cluster(self) -> dict[str, Any]:
        return self._call("GET", "/v1/cluster")

    def plan(
        self, spec: JobSpec | dict[str, Any] | str | Path, ranks: int | None = None, **options: Any
    ) -> dict[str, Any]:
        """The spec's legal layouts, predicted, best first: on `ranks` ranks, or on what the
        cluster has free now (options: gpus_per_node, device_memory, limit)."""
        body = {"spec": _spec_body(spec), "ranks": ranks, **options}
        return self._call("POST", "/v1/plan", json=body)

    def cluster_rates(self) -> dict[str, Any]:
        """The cost model's rates stored for this cluster, and the last calibration."""
        return self._call("GET", "/v1/cluster/rates")

    def calibrate(
        self, spec: JobSpec | dict[str, Any] | str | Path | None = None, ranks: int = 2
    ) -> dict[str, Any]:
        """Start measuring the cluster's rates (administrators); poll `cluster_rates`."""
        body: dict[str, Any] = {"ranks": ranks}
        if spec is not None:
            body["spec"] = _spec_body(spec)
        return self._call("POST", "/v1/cluster/calibrate", json=body)

    def wait(
        self,
        job_id: str,
        timeout: float,
        poll_s: float = 1.0,
        until: frozenset[str] = TERMINAL_STATES,
    ) -> dict[str, Any]:
        """Poll until the job is in one of `until` (default: ended); returns it, or raises
        WaitTimeout."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job["state"] in until:
                return job
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"job {job_id} is still {job['state']} after {timeout}s")
            time.sleep(poll_s)
