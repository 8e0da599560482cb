"""Calibration (one at a time, in a thread) with a fake measurement: what it stores, and
what it refuses to store."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from shardline.service.db import Database
from shardline.service.migrate import upgrade_to_head
from shardline.service.rates import AlreadyCalibrating, Calibration, CalibrationState, RatesBook
from shardline.workers.contract.rates import DEFAULT_RATES, Rates
from shardline.workers.contract.spec import JobSpec

SPEC = JobSpec.model_validate({"name": "c"})


@pytest.fixture
def book(tmp_path: Path) -> RatesBook:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(url)
    return RatesBook(Database(url))


def ended(calibration: Calibration) -> CalibrationState:
    deadline = time.monotonic() + 10
    while (state := calibration.state()).state == "running":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return state


def test_measured_rates_are_stored_shared_and_planned_with(book: RatesBook) -> None:
    release = threading.Event()
    measured = replace(DEFAULT_RATES["cpu"], flops_per_s=1.5e10)
    shared: list[tuple[str, Rates]] = []

    def measure(spec: JobSpec, ranks: int) -> Rates:
        release.wait(10)
        return measured

    calibration = Calibration(book, measure, lambda kind, rates: shared.append((kind, rates)))
    assert calibration.start(SPEC, 2, "ada").state == "running"
    with pytest.raises(AlreadyCalibrating):
        calibration.start(SPEC, 2, "ada")
    release.set()
    assert ended(calibration).state == "done"
    assert shared == [("cpu", measured)]
    planning = book.for_spec(SPEC)
    assert planning.rates == measured and planning.calibrated_at is not None
    assert calibration.start(SPEC, 2, "ada").state == "running"  # again, once ended


def test_rates_of_the_wrong_device_are_not_stored(book: RatesBook) -> None:
    calibration = Calibration(book, lambda spec, ranks: DEFAULT_RATES["h100"])
    calibration.start(SPEC, 2, "ada")
    state = ended(calibration)
    assert state.state == "failed"
    assert "measured a h100 for cpu rates" in (state.message or "")
    assert book.stored() == [] and book.for_spec(SPEC).calibrated_at is None


def test_a_failed_share_leaves_the_stored_rates_done(book: RatesBook) -> None:
    def share(kind: str, rates: Rates) -> None:
        raise ConnectionError("ray is away")

    calibration = Calibration(book, lambda spec, ranks: DEFAULT_RATES["cpu"], share)
    calibration.start(SPEC, 2, "ada")
    assert ended(calibration).state == "done"
    assert [r.kind for r in book.stored()] == ["cpu"]
