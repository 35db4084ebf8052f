"""The Worker settles every outcome through its Settler (DESIGN §22), the handler's return value
reaching the success outcome (what dedupe and workflow fan-ins build on)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from support import wait_until

from ojs_kombu import Client, RetryPolicy, current_job
from ojs_kombu.runtime.lifecycle import JobEvent
from ojs_kombu.runtime.settle import Settler


@pytest.fixture
def outcomes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, Any]]:
    """``(outcome, job id, detail)`` of every Settler.succeed / cancel / fail_attempt call, as they
    happen; each call then settles as it would (the real method runs)."""
    calls: list[tuple[str, str, Any]] = []
    succeed, cancel, fail_attempt = Settler.succeed, Settler.cancel, Settler.fail_attempt

    def spy_succeed(self: Settler, delivery: Any, job: Any, attempt: int, result: Any = None) -> None:
        calls.append(("succeed", job.id, result))
        succeed(self, delivery, job, attempt, result)

    def spy_cancel(self: Settler, delivery: Any, job: Any, attempt: int, state: Any) -> None:
        calls.append(("cancel", job.id, state))
        cancel(self, delivery, job, attempt, state)

    def spy_fail_attempt(self: Settler, delivery: Any, job: Any, attempt: int, failure: Any, decision: Any) -> None:
        calls.append(("fail_attempt", job.id, decision.outcome.value))
        fail_attempt(self, delivery, job, attempt, failure, decision)

    monkeypatch.setattr(Settler, "succeed", spy_succeed)
    monkeypatch.setattr(Settler, "cancel", spy_cancel)
    monkeypatch.setattr(Settler, "fail_attempt", spy_fail_attempt)
    return calls


def test_every_outcome_of_a_run_is_one_settler_call_with_its_events(client: Client, worker_factory, outcomes) -> None:
    release, running = threading.Event(), threading.Event()
    worker = worker_factory(queues=("settle",), concurrency=4)
    events: list[JobEvent] = []
    worker.lifecycle.subscribe(events.append)

    @worker.handler("settle.plain")
    def plain(x: int) -> dict[str, int]:
        return {"doubled": 2 * x}

    @worker.handler("settle.coroutine")
    async def coroutine(x: int) -> list[int]:
        await asyncio.sleep(0)
        return [x, x]

    @worker.handler("settle.broken")
    def broken() -> None:
        raise ValueError("broken on purpose")

    @worker.handler("settle.held")
    def held() -> None:
        running.set()
        while not current_job().cancelled.is_set() and not release.is_set():
            release.wait(0.01)

    worker.start()
    assert worker.wait_until_ready()
    a = client.enqueue("settle.plain", [21], queue="settle")
    b = client.enqueue("settle.coroutine", [3], queue="settle")
    c = client.enqueue("settle.broken", [], queue="settle", retry=RetryPolicy(max_attempts=1))
    d = client.enqueue("settle.held", [], queue="settle")
    assert running.wait(10), "the held job never started"
    client.cancel(d.id, queue="settle")
    wait_until(lambda: len(outcomes) == 4, 15, message=f"four outcomes, got {outcomes}")
    release.set()
    assert sorted(outcomes) == sorted(
        [
            ("succeed", a.id, {"doubled": 42}),
            ("succeed", b.id, [3, 3]),
            ("fail_attempt", c.id, "dead_letter"),
            ("cancel", d.id, "running"),
        ]
    )
    by_job = {j.id: [e.event for e in events if e.job_id == j.id] for j in (a, b, c, d)}
    assert by_job == {
        a.id: ["started", "succeeded"],
        b.id: ["started", "succeeded"],
        c.id: ["started", "failed", "dead-lettered"],
        d.id: ["started", "cancelled"],
    }
