"""Comparing runs and the ranks panel in real Chromium against a real server and database
(no Ray: the jobs' metrics and placement are recorded through the job store, as the
reconciler records a supervisor's; rank 1 of one job is made 1.6x slower)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from shardline.service.config import Settings
from shardline.service.db import Database
from shardline.service.migrate import upgrade_to_head
from shardline.service.store import JobStore
from shardline.service.users import UserDirectory
from shardline.workers.contract.progress import EventEntry, MetricsEntry
from shardline.workers.contract.spec import JobSpec
from tests.browser.conftest import Sandboxed
from tests.browser.test_status_page import shoot, sign_in
from tests.support.server import run_server

STEPS = 12
NODE = "f00dfeed" + "0" * 48


def spec(name: str, lr: float) -> dict[str, Any]:
    return {
        "name": name,
        "parallel": {"dp": 2},
        "train": {"steps": STEPS, "lr": lr, "global_batch_size": 4},
    }


def breakdown(rank: int, slow: float) -> dict[str, float]:
    compute, comm = 0.08 * (slow if rank == 1 else 1.0), 0.02
    return {
        "rank": rank,
        "data_s": 0.001,
        "compute_s": compute,
        "comm_s": comm,
        "bubble_s": 0.0,
        "checkpoint_s": 0.0,
        "step_s": compute + comm + 0.001,
        "mem_bytes": (100 + 50 * rank) * 2**20,
    }


def record(store: JobStore, job_id: str, lr: float, slow: float) -> None:
    """What a supervisor of a dp=2 job reports: where its ranks run and each step."""
    placed = EventEntry(
        message="placement group ready: 2 ranks on 1 node(s)",
        data={"kind": "placement", "nodes": [NODE], "ranks": [0, 0]},
        seq=1,
    )
    steps = [
        MetricsEntry(
            step=s,
            values={
                "step": s,
                "loss": 5.0 - s * lr * 10,
                "tokens_per_s": 1000.0 + s,
                "lr": lr,
                "breakdown": [breakdown(0, slow), breakdown(1, slow)],
                # The slower run compresses nothing: 3 MiB of fp32 gradients a step (and
                # says how many outer steps it took, as a local SGD job does).
                **({"grad_bytes": 3 * 2**20, "outer_steps": s // 4} if slow > 1 else {}),
                # The faster one says how stale its gradients were, as an async job does.
                **(
                    {"staleness_mean": 0.5, "staleness_max": 2, "stale_dropped": 1}
                    if slow == 1
                    else {}
                ),
            },
            seq=s + 1,
        )
        for s in range(1, STEPS + 1)
    ]
    store.record_progress(job_id, [placed, *steps], after_seq=0)


@pytest.fixture
def two_runs(tmp_path: Path) -> Iterator[tuple[Settings, str, list[str]]]:
    url = f"sqlite:///{tmp_path / 'shardline.db'}"
    upgrade_to_head(url)
    db = Database(url)
    users = UserDirectory(db)
    alice = users.ensure_user("alice")
    token = users.issue_token(alice, "browser").token
    store = JobStore(db)
    ids = []
    for name, lr, slow in (("lr-low", 0.01, 1.0), ("lr-high", 0.03, 1.6)):
        body = spec(name, lr)
        if name == "lr-high":  # the tiny preset's shape, written out (as init_from does)
            body["model"] = {"dim": 128, "n_layers": 4, "n_heads": 4}
        job, _ = store.create(alice, JobSpec.model_validate(body))
        record(store, job.id, lr, slow)
        ids.append(job.id)
    db.dispose()
    yield Settings(database_url=url, state_dir=tmp_path / "state"), token, ids


def test_two_runs_compare_on_shared_axes_with_their_differences(
    two_runs: tuple[Settings, str, list[str]], sandboxed_page: Sandboxed, screenshot_dir: Path
) -> None:
    settings, token, (fast, _) = two_runs
    page = sandboxed_page.page
    with run_server(settings) as server:
        sign_in(page, server.url, token)
        expect(page.locator("#jobs tbody tr")).to_have_count(2)
        compare = page.get_by_role("button", name="Compare selected")
        expect(compare).to_be_disabled()
        page.get_by_label("Select lr-low").check()
        page.get_by_label("Select lr-high").check()
        expect(compare).to_have_text("Compare selected (2)")
        compare.click()
        expect(page.locator("#compare-jobs tbody tr")).to_have_count(2)
        legend = page.locator("#compare-loss .u-legend .u-series")
        expect(legend).to_have_count(3)  # the step, then one per job
        expect(legend.nth(1)).to_contain_text("lr-low")
        expect(legend.nth(2)).to_contain_text("lr-high")
        assert page.locator("#compare-loss").get_attribute("data-points") == str(STEPS)
        lr = page.locator("#compare-diff tbody tr", has_text="train.lr")
        expect(lr).to_contain_text("0.01")
        expect(lr).to_contain_text("0.03")
        assert page.locator("#compare-diff tbody tr", has_text="parallel.dp").count() == 0
        # One shape, named by a preset in one and written out in the other: no difference.
        assert page.locator("#compare-diff tbody tr", has_text="model.").count() == 0
        page.goto(f"{server.url}/#/compare/{fast},nosuchjob")
        expect(page.locator("#compare-error")).to_have_text(
            "Cannot compare these jobs: no job nosuchjob"
        )
        page.go_back()
        expect(page.locator("#compare-jobs tbody tr")).to_have_count(2)
        shoot(page, screenshot_dir, "compare-page")  # and nothing scrolls sideways on a phone
    assert sandboxed_page.outside == []


def test_the_ranks_panel_places_each_rank_and_shows_the_slow_one(
    two_runs: tuple[Settings, str, list[str]], sandboxed_page: Sandboxed, screenshot_dir: Path
) -> None:
    settings, token, (fast, slow) = two_runs
    page = sandboxed_page.page
    with run_server(settings) as server:
        sign_in(page, server.url, token)
        page.goto(f"{server.url}/#/jobs/{slow}")
        ranks = page.locator("#ranks tbody tr")
        expect(ranks).to_have_count(2)
        expect(ranks.nth(1)).to_have_class("slow")
        expect(ranks.nth(1).locator("td").first).to_have_text("1 (slow)")
        # dp=2: rank 1 is data-parallel replica 1 of stage 0, tp 0; both on node f00dfeed.
        cells = ranks.nth(1).locator("td").all_inner_texts()
        assert cells[1:5] == ["0", "1", "0", "f00dfeed"], cells
        assert cells[6] == "150.0 MiB", cells  # what rank 1 holds
        expect(ranks.nth(0)).not_to_have_class("slow")
        bar = ranks.nth(1).locator(".parts")
        assert "communication 0.020 s" in (bar.get_attribute("aria-label") or "")
        expect(page.locator("#rank-heat tbody tr")).to_have_count(2)
        expect(page.locator("#rank-heat tbody tr").first.locator("td")).to_have_count(STEPS)
        shoot(page, screenshot_dir, "job-page-ranks")
        # Its gradient traffic per step, charted in MiB.
        expect(page.locator("#traffic-figure")).to_be_visible()
        expect(page.locator("#traffic-chart")).to_have_attribute("data-points", str(STEPS))
        expect(page.locator("#outer-steps")).to_have_text(
            "Local SGD: 3 outer steps (replicas averaged) by step 12."
        )
        expect(page.locator("#staleness")).to_be_hidden()
        page.goto(f"{server.url}/#/jobs/{fast}")
        expect(page.locator("#staleness")).to_have_text(
            f"Async: gradients 0.50 steps stale on average, at most 2, by step {STEPS}; "
            f"{STEPS} dropped as too stale in all."
        )
        expect(page.locator("#ranks tbody tr")).to_have_count(2)
        expect(page.locator("#ranks tbody tr.slow")).to_have_count(0)
        expect(page.locator("#traffic-figure")).to_be_hidden()  # it logged none
    assert sandboxed_page.outside == []


def test_a_resumed_job_draws_the_curve_it_continues_and_links_it(
    two_runs: tuple[Settings, str, list[str]], sandboxed_page: Sandboxed
) -> None:
    settings, token, (parent, _) = two_runs
    db = Database(settings.database_url)
    store = JobStore(db)
    alice = UserDirectory(db).ensure_user("alice")
    body = {**spec("continued", 0.01), "resume_from": {"job_id": parent, "step": 6}}
    child = store.create(alice, JobSpec.model_validate(body))[0].id
    store.record_progress(
        child,
        [
            MetricsEntry(step=s, values={"step": s, "loss": 3.0 - s / 100}, seq=s - 6)
            for s in range(7, STEPS + 1)
        ],
        after_seq=0,
    )
    db.dispose()
    page = sandboxed_page.page
    with run_server(settings) as server:
        sign_in(page, server.url, token)
        page.goto(f"{server.url}/#/jobs/{child}")
        link = page.locator("#parent-link")
        expect(link).to_have_text("Continues lr-low from its step 6 (its curve in grey).")
        legend = page.locator("#loss-chart .u-legend .u-series")
        expect(legend).to_have_count(4)  # step, train, validation, the parent's
        expect(legend.nth(3)).to_contain_text("lr-low (before)")
        # Steps 1-6 are the parent's, 7-12 its own: one curve over the whole run.
        expect(page.locator("#loss-chart")).to_have_attribute("data-points", str(STEPS))
        link.get_by_role("link", name="lr-low").click()
        expect(page.locator("#job-title")).to_have_text("lr-low")
        expect(page.locator("#parent-link")).to_be_hidden()
    assert sandboxed_page.outside == []
