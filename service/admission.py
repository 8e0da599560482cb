"""What the service checks before it takes a spec: the files a job would read, the model's
shape from `model.init_from`, `resume_from`, the automatic layout, whether the cluster
could ever hold it, and the user's quotas; then the job is queued.

Planning and calibrating a spec take the same first checks (`Admission.checked`). Every
refusal is a `Refused` (a status, a code, and words that name the field and the fix) or a
`SpecInvalid` (a shape read from a config.json that does not fit the layout); the API
answers them as they are.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from shardline.service.config import Settings
from shardline.service.layout_planning import NoLayout, choose_layout
from shardline.service.models import Job
from shardline.service.principal import Viewer
from shardline.service.quotas import UserQuotas, never_fits_quota, resource_limits
from shardline.service.rates import RatesBook
from shardline.service.runtime import Runtime
from shardline.service.store import JobStore
from shardline.workers.contract.data_access import DataAccess, DataAccessDenied
from shardline.workers.contract.demand import job_demand
from shardline.workers.contract.events import Event
from shardline.workers.contract.hf_config import InitFromError, resolve_init_from
from shardline.workers.contract.sections import INIT_FROM
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.data.preflight import data_problem

log = logging.getLogger(__name__)


class Refused(Exception):
    """A spec the service will not take: an HTTP status, a code, the words, and the fields
    at fault."""

    def __init__(
        self, status: int, code: str, message: str, details: list[dict[str, str]] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details


def invalid_field(field: str, message: str, reason: str | None = None) -> Refused:
    """A 422 naming `field`."""
    return Refused(
        422, "validation_error", message, [{"field": field, "message": reason or message}]
    )


class SpecInvalid(Exception):
    """The spec with its shape read from config.json does not fit the layout (heads by
    tp, layers by pp): pydantic's errors, for the API's field words."""

    def __init__(self, errors: Any) -> None:
        super().__init__("the spec does not validate")
        self.errors = errors


class StorageUnavailable(Exception):
    """The checkpoint storage did not answer a read (an object store raises its own
    errors, not OSError)."""


@contextmanager
def checkpoint_storage(job_id: str, *passes: type[Exception]) -> Iterator[None]:
    """A read of job `job_id`'s checkpoints: one the storage does not answer raises
    StorageUnavailable naming the job's checkpoints and the kind of error, never what the
    storage's error says (its endpoint, bucket and prefix are the operator's to see, in
    the server's log). The caller's own refusals (`passes`, and Refused) go through."""
    through: tuple[type[Exception], ...] = (Refused, *passes)
    try:
        yield
    except through:
        raise
    except Exception as err:
        log.warning("job %s: the checkpoint storage failed a read: %r", job_id, err)
        raise StorageUnavailable(
            f"the checkpoint storage did not answer a read of job {job_id}'s checkpoints "
            f"({type(err).__name__}); try again, or ask an admin to check "
            "SHARDLINE_CHECKPOINT_ROOT"
        ) from None


class Admission:
    """The checks of a spec the service is given, and the queueing of a job."""

    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        runtime: Runtime,
        quotas: UserQuotas,
        rates: RatesBook,
    ) -> None:
        self.settings, self.store, self.runtime = settings, store, runtime
        self.quotas, self.rates = quotas, rates

    def checked(self, spec: JobSpec) -> JobSpec:
        """`spec` with its files checked, its shape read from `model.init_from` and a
        sample of its data read."""
        check_data_paths(spec, self.settings)
        resolved = resolved_init_from(spec, self.settings)
        check_data_sample(resolved, self.settings)
        return resolved

    def admit(self, spec: JobSpec, user: Viewer, idempotency_key: str | None) -> tuple[Job, bool]:
        """Queue `spec` for `user` (or find the job an earlier request with the same key
        made); returns the job and whether it is new. Blocking: database, cluster."""
        if spec.priority > 0 and not user.is_admin:
            # As with PATCH: raising a job above the others is an administrator's call.
            message = "above 0 is for administrators; leave it out (0) or give a lower one"
            raise Refused(
                403,
                "forbidden",
                f"priority: {message}",
                [{"field": "priority", "message": message}],
            )
        resolved = self.checked(spec)
        check_resume_from(resolved, user, self.store, self.settings)
        events: tuple[Event, ...] = ()
        auto = resolved.parallel.auto
        # A replay answers with the job already made, whatever is free now.
        if auto and not self.store.submitted_with_key(user, idempotency_key):
            try:
                resolved, planned = choose_layout(
                    resolved,
                    self.runtime,
                    resource_limits(self.settings),
                    self.rates.for_spec(resolved),
                )
            except NoLayout as err:
                raise Refused(422, "does_not_fit", str(err)) from None
            events = (planned,)
        refusal = self.runtime.refusal(resolved) or never_fits_quota(
            job_demand(resolved), resource_limits(self.settings)
        )
        if refusal is not None:
            raise Refused(422, "does_not_fit", refusal)
        return self.quotas.submit(
            user,
            idempotency_key,
            lambda: self.store.create(
                user, resolved, idempotency_key, submitted=spec if auto else None, events=events
            ),
        )


def check_data_paths(spec: JobSpec, settings: Settings) -> None:
    """A job may only read data inside the configured data roots, and never the service's
    own state (admin token, database) or storage. The worker checks every file again when
    it opens it; this answers early. Messages never show the server's absolute roots."""
    access = DataAccess.of(settings.data_roots, settings.private_dirs)
    for field, value in (
        ("data.path", spec.data.path),
        ("data.tokenizer", spec.data.tokenizer),
        ("model.init_from", spec.model.init_from),
    ):
        if value is None or (field == "data.tokenizer" and value in ("byte", INIT_FROM)):
            continue
        reason = _path_refusal(Path(value), access)
        if reason is not None:
            raise invalid_field(field, f"{field}: {value} {reason}", reason)


def check_data_sample(spec: JobSpec, settings: Settings) -> None:
    """The first records read as the ranks will read them, so a file that is not its
    format, a record without its field or a template that fails is a 422 now, not a
    failed job later. Call after check_data_paths."""
    model = spec.model.resolved()
    access = DataAccess.of(settings.data_roots, settings.private_dirs)
    problem = data_problem(spec.data, model["seq_len"], model["vocab_size"], access)
    if problem is not None:
        field, message = problem
        raise invalid_field(field, message)


def _path_refusal(path: Path, access: DataAccess) -> str | None:
    try:
        real = path.resolve()
        holds_private = real.is_dir() and any(p.is_relative_to(real) for p in access.private)
    except (OSError, RuntimeError) as err:  # a symlink loop, a name too long, ...
        return f"cannot be resolved ({type(err).__name__}); give an existing file or folder"
    if holds_private:
        return "holds the service's own state or storage, which is never data"
    refused = access.refusal(real)
    if refused is not None:
        return refused
    return _missing(path, real)


def _missing(path: Path, real: Path) -> str | None:
    """Why an allowed path cannot be read at all (the job would fail minutes later), or
    None. A relative path is read from the server's working directory, as the worker does."""
    relative = "" if path.is_absolute() else " (a relative path is read from the server's folder)"
    if not real.exists():
        return f"does not exist{relative}; give a file or folder inside the data roots"
    if not os.access(real, os.R_OK | (os.X_OK if real.is_dir() else 0)):
        return "is not readable by the server; check its permissions"
    return None


def resolved_init_from(spec: JobSpec, settings: Settings) -> JobSpec:
    """`spec` with its shape filled from `model.init_from` (unchanged without one), so
    the scheduler (resources), every listing and the workers see the model's real shape.
    Call after check_data_paths, which refuses a folder outside the data roots."""
    if spec.model.init_from is None:
        return spec
    access = DataAccess.of(settings.data_roots, settings.private_dirs)
    try:
        return resolve_init_from(spec, access)
    except InitFromError as err:
        raise invalid_field(err.field, str(err), err.reason) from None
    except DataAccessDenied as err:
        raise invalid_field(str(err).split(":", 1)[0], str(err)) from None
    except ValidationError as err:
        raise SpecInvalid(err.errors()) from None
    except OSError as err:
        raise invalid_field(
            "model.init_from",
            f"model.init_from: cannot read {spec.model.init_from} ({type(err).__name__})",
            "cannot be read",
        ) from None


def check_resume_from(spec: JobSpec, user: Viewer, store: JobStore, settings: Settings) -> None:
    """`resume_from` must name a job the user may see (404 otherwise, as for any other
    user's job) that has the committed checkpoint asked for."""
    source = spec.resume_from
    if source is None:
        return
    job = store.get(source.job_id, user)
    with checkpoint_storage(job.id):
        found = settings.job_layout(job.id).checkpoints().find(source.step)
    if found is None:
        which = f"at step {source.step}" if source.step else "yet"
        field = "resume_from.step" if source.step else "resume_from.job_id"
        raise invalid_field(
            field,
            f"resume_from: job {job.id} has no committed checkpoint {which}",
            f"no committed checkpoint {which}",
        )
