"""A job's priority, changed after it was queued, changes which job the scheduler admits
first; an owner may lower their own but never raise it. A real job store on SQLite; only
the launcher is a stand-in."""

from __future__ import annotations

import pytest

from shardline.service.queue import PriorityRefused, queued_in_order, set_priority
from shardline.service.scheduler import Scheduler
from shardline.service.store import IllegalTransition, JobStore
from shardline.service.users import UserDirectory
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.spec import JobSpec

# Each job needs all 8 CPUs of the made-up cluster: only one can be admitted.
WHOLE_CLUSTER = {"parallel": {"dp": 8}, "train": {"global_batch_size": 16, "micro_batch_size": 2}}


def admitted_first(store: JobStore) -> list[str]:
    launched: list[str] = []
    Scheduler(
        store,
        cluster_total=lambda: {"CPU": 8.0, "GPU": 0.0},
        launch=lambda job: launched.append(job.id),
        discard=lambda _: None,
    ).tick()
    return launched


def test_an_admin_raising_a_younger_job_admits_it_first(store: JobStore) -> None:
    users = UserDirectory(store.db)
    alice, admin = users.ensure_user("alice"), users.ensure_user("root", admin=True)
    old = store.create(alice, JobSpec.model_validate({"name": "old", **WHOLE_CLUSTER}))[0].id
    young = store.create(alice, JobSpec.model_validate({"name": "young", **WHOLE_CLUSTER}))[0].id
    assert [q.id for q in queued_in_order(store.db, alice)] == [old, young]
    set_priority(store, young, admin, 5)
    assert [(q.id, q.position) for q in queued_in_order(store.db, alice)] == [
        (young, 1),
        (old, 2),
    ]
    assert admitted_first(store) == [young]
    assert store.get(old).state == JobState.QUEUED
    said = [e.message for e in store.events(young)]
    assert "priority 0 -> 5, set by root" in said


def test_an_owner_lowers_but_cannot_raise_and_an_ended_job_keeps_its_priority(
    store: JobStore,
) -> None:
    users = UserDirectory(store.db)
    alice, bob = users.ensure_user("alice"), users.ensure_user("bob")
    mine = store.create(alice, JobSpec.model_validate({"name": "mine", **WHOLE_CLUSTER}))[0].id
    theirs = store.create(bob, JobSpec.model_validate({"name": "theirs", **WHOLE_CLUSTER}))[0].id
    # Bob lowers his job: Alice's, younger, now comes first.
    assert set_priority(store, theirs, bob, -3).priority == -3
    assert [q.id for q in queued_in_order(store.db, alice)] == [mine]  # only her own...
    assert queued_in_order(store.db, alice)[0].position == 1  # ...at its place among all
    with pytest.raises(PriorityRefused, match="only an administrator can raise"):
        set_priority(store, theirs, bob, 0)
    store.request_cancel(mine, alice, "test")
    with pytest.raises(IllegalTransition, match="has not ended"):
        set_priority(store, mine, alice, -1)
