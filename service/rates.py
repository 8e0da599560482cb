"""The cost model's rates for this cluster: calibrated ones from the database where a
calibration stored them, else the defaults for the job's device class.

`POST /v1/cluster/calibrate` measures them with a Ray task on a cluster node (the same
`workers.engine.calibrate` as `shardline plan --calibrate`, which writes a file instead);
one calibration runs at a time, in a thread, and its state is read back by polling.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select

from shardline.service.db import Database
from shardline.service.models import ClusterRates
from shardline.workers.contract.planner import default_rates, rates_kind
from shardline.workers.contract.rates import Rates
from shardline.workers.contract.spec import JobSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanningRates:
    rates: Rates
    calibrated_at: datetime | None  # None: the defaults

    def describe(self) -> str:
        """How the plan's events and answers name them."""
        if self.calibrated_at is None:
            return f"{self.rates.device} default rates"
        return f"{self.rates.device} rates calibrated {self.calibrated_at:%Y-%m-%d %H:%M} UTC"


class RatesBook:
    """The rates each device class plans with."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def for_spec(self, spec: JobSpec) -> PlanningRates:
        with self.db.session() as s:
            row = s.get(ClusterRates, rates_kind(spec))
            if row is None:
                return PlanningRates(default_rates(spec), None)
            try:
                return PlanningRates(Rates.from_json(row.rates), as_utc(row.measured_at))
            except (TypeError, ValueError) as err:  # planning goes on with the defaults
                log.warning("stored %s rates unreadable (%s): defaults", row.kind, err)
                return PlanningRates(default_rates(spec), None)

    def save(self, kind: str, rates: Rates, source: str) -> None:
        with self.db.session() as s, s.begin():
            row = s.get(ClusterRates, kind)
            if row is None:
                row = ClusterRates(kind=kind)
                s.add(row)
            row.rates, row.source, row.measured_at = rates.to_json(), source, datetime.now(UTC)
        log.info("calibrated %s rates stored (%s)", kind, source)

    def stored(self) -> list[ClusterRates]:
        with self.db.session() as s:
            rows = s.scalars(select(ClusterRates).order_by(ClusterRates.kind)).all()
            s.expunge_all()
            return list(rows)


def as_utc(when: datetime) -> datetime:
    """SQLite gives naive datetimes back; every stored one is UTC."""
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


class AlreadyCalibrating(RuntimeError):
    pass


@dataclass
class CalibrationState:
    state: str = "idle"  # idle | running | done | failed
    kind: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    message: str | None = None
    ranks: int | None = None


class Calibration:
    """One calibration at a time: `measure(spec, ranks)` (a Ray task) in a thread, its
    rates stored in `book` when it ends and handed to `stored(kind, rates)` (the runtime
    shares them with the cluster's supervisors)."""

    def __init__(
        self,
        book: RatesBook,
        measure: Callable[[JobSpec, int], Rates],
        stored: Callable[[str, Rates], None] = lambda kind, rates: None,
    ) -> None:
        self.book = book
        self.measure = measure
        self.stored = stored
        self._lock = threading.Lock()
        self._state = CalibrationState()

    def state(self) -> CalibrationState:
        with self._lock:
            return CalibrationState(**vars(self._state))

    def start(self, spec: JobSpec, ranks: int, by: str) -> CalibrationState:
        kind = rates_kind(spec)
        with self._lock:
            if self._state.state == "running":
                raise AlreadyCalibrating(
                    f"a calibration of {self._state.kind} rates is running (since "
                    f"{self._state.started_at:%H:%M:%S} UTC); wait for it"
                )
            self._state = CalibrationState(
                state="running", kind=kind, started_at=datetime.now(UTC), ranks=ranks
            )
        threading.Thread(
            target=self._run, args=(spec, ranks, kind, by), name="calibration", daemon=True
        ).start()
        return self.state()

    def _run(self, spec: JobSpec, ranks: int, kind: str, by: str) -> None:
        try:
            rates = self.measure(spec, ranks)
            if (rates.device == "cpu") != (kind == "cpu"):
                raise ValueError(
                    f"the task measured a {rates.device} for {kind} rates; nothing stored"
                )
            model = spec.model.preset or "custom"
            source = f"POST /v1/cluster/calibrate by {by}: {model} model, {ranks} ranks"
            self.book.save(kind, rates, source)
        except Exception as err:  # the state says why; the server goes on
            log.warning("calibration failed: %s", err)
            with self._lock:
                self._state.state, self._state.message = "failed", str(err)[:500]
                self._state.ended_at = datetime.now(UTC)
            return
        with self._lock:
            self._state.state = "done"
            self._state.ended_at = datetime.now(UTC)
        try:  # stored and planned with here; the cluster's supervisors learn them next start
            self.stored(kind, rates)
        except Exception as err:
            log.warning("sharing the calibrated %s rates with the cluster failed: %s", kind, err)
