"""A pinned checkpoint (an export reading it) is kept from retention until its pin lapses;
the export route's queue refuses what it cannot hold."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from shardline.api.errors import ApiError
from shardline.api.export_slots import ExportSlots
from shardline.workers.storage.checkpoints import CheckpointStore

T = TypeVar("T")


def committed(store: CheckpointStore, step: int) -> None:
    staging = Path(store.staging_path(step))
    staging.mkdir(parents=True)
    (staging / "__0_0.distcp").write_bytes(b"shard")
    store.commit(step, store.checksums(str(staging), ["__0_0.distcp"]), {"layout": "x"})


def test_retention_keeps_a_pinned_checkpoint_and_drops_it_once_unpinned(
    tmp_path: Path,
) -> None:
    store = CheckpointStore(str(tmp_path / "checkpoints"))
    for step in (10, 20, 30):
        committed(store, step)
    pin = store.pin(10, for_s=60)
    assert store.prune(keep_last=1) == [20]
    assert [c.step for c in store.committed()] == [30, 10]
    store.unpin(pin)
    assert store.prune(keep_last=1) == [10]
    store.unpin(pin)  # twice is harmless


def test_a_lapsed_pin_keeps_nothing(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "checkpoints"))
    for step in (1, 2):
        committed(store, step)
    store.pin(1, for_s=-1)  # as one left by a server that died long ago
    assert store.pinned() == set()
    assert store.prune(keep_last=1) == [1]
    assert [c.step for c in store.committed()] == [2]  # .pins is never a checkpoint


def run_loop(scenario: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """asyncio.run in a thread of its own: a test before this one (Playwright's sync API)
    may have left an event loop running in the main thread."""
    result: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(scenario()))
        except BaseException as err:
            errors.append(err)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=30)
    if errors:
        raise errors[0]
    return result[0]


def test_exports_beyond_the_running_and_waiting_ones_get_429() -> None:
    async def scenario() -> list[str]:
        slots = ExportSlots(at_once=1, waiting=1)
        release = asyncio.Event()
        said: list[str] = []

        async def export(name: str) -> None:
            try:
                async with slots.slot(user_id=ord(name)):
                    said.append(f"{name} runs")
                    await release.wait()
            except ApiError as err:
                said.append(f"{name} {err.status} {err.code}")

        tasks = [asyncio.create_task(export(n)) for n in ("a", "b", "c")]
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(*tasks)
        slots.executor.shutdown()
        return said

    started = time.monotonic()
    said = run_loop(scenario)
    assert said[:2] == ["a runs", "c 429 too_many_exports"], said
    assert said[2] == "b runs"  # the one that waited gets its turn
    assert time.monotonic() - started < 5


def test_the_export_queue_names_its_limit() -> None:
    with pytest.raises(ApiError) as caught:

        async def full() -> None:
            slots = ExportSlots(at_once=1, waiting=0)
            async with slots.slot(1), slots.slot(2):
                pass

        run_loop(full)
    assert caught.value.status == 429 and "at most 1 at once" in caught.value.message
    assert caught.value.headers is not None and "Retry-After" in caught.value.headers


def test_one_user_cannot_take_every_export_slot() -> None:
    """Ten slots on the server, two a user: the third export of one user is told to come
    back while another user's still runs."""

    async def scenario() -> list[str]:
        slots = ExportSlots(at_once=2, waiting=8, per_user=2)
        release = asyncio.Event()
        said: list[str] = []

        async def export(user: int, name: str) -> None:
            try:
                async with slots.slot(user):
                    said.append(f"{name} runs")
                    await release.wait()
            except ApiError as err:
                said.append(f"{name} {err.status} {err.message}")

        first = [asyncio.create_task(export(1, n)) for n in ("a1", "a2", "a3")]
        await asyncio.sleep(0.05)
        other = asyncio.create_task(export(2, "b1"))
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(*first, other)
        slots.executor.shutdown()
        return said

    said = run_loop(scenario)
    assert said[:3] == [
        "a1 runs",
        "a2 runs",
        "a3 429 you have 2 exports running or waiting "
        "on this server (at most 2 per user); retry after the Retry-After "
        "seconds",
    ], said
    assert said[3] == "b1 runs"
