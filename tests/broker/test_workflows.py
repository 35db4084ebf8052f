"""Workflows end to end on a real broker with real Workers (ojs-workflows.md, issue 31 item 1)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from ojs_kombu import AsyncClient, Client, Job, RetryPolicy, WorkflowInfo, batch, chain, current_job, group
from ojs_kombu.errors import WorkflowStateError
from ojs_kombu.runtime.workflow import fan_in_ids


@pytest.fixture
def worker_factory(worker_factory):
    """The broker tests' factory, without sweep jobs (``workflow_retention=None``) unless a test asks:
    a sweep job declares the test prefix's scheduling cascade, ~1 s more per test to delete afterwards.
    The sweep is tested in test_dramatiq_worker.py (the Worker's Settler) and test_transport_settle.py."""

    def make(queues=("default",), **options):
        options.setdefault("workflow_retention", None)
        return worker_factory(queues, **options)

    return make


def test_chain_of_three_passes_results_step_to_step(client: Client, worker_factory):
    worker = worker_factory(("wf",), concurrency=2)
    seen: list[dict[str, Any]] = []

    @worker.handler("step.run")
    def step(index: int) -> dict[str, int]:
        seen.append(current_job().parent_results)
        return {"step": index, "total": sum(r["step"] for r in current_job().parent_results.values()) + index}

    worker.start()
    w = chain(*(Job.create("step.run", [i], queue="wf") for i in range(3)), name="three")
    workflow_id = client.enqueue_workflow(w)
    assert workflow_id == w.id
    wait_until(lambda: client.workflow(workflow_id).state == "completed", timeout=20, message="the chain completed")
    assert seen == [
        {},
        {"0": {"step": 0, "total": 0}},
        {"0": {"step": 0, "total": 0}, "1": {"step": 1, "total": 1}},
    ]
    info = client.workflow(workflow_id)
    assert [s.state for s in info.steps] == ["completed"] * 3
    assert info.result == {"step": 2, "total": 3}
    assert (info.job_count, info.completed_count, info.failed_count) == (3, 3, 0)
    assert info.to_dict()["state"] == "completed"


def test_group_then_batch_callback_sees_every_result(client: Client, worker_factory):
    worker = worker_factory(("wf", "cb"), concurrency=8)
    callbacks: list[dict[str, Any]] = []
    lock = threading.Lock()

    @worker.handler("square")
    def square(n: int) -> int:
        return n * n

    @worker.handler("report")
    def report() -> int:
        with lock:
            callbacks.append(current_job().parent_results)
        return len(current_job().parent_results)

    worker.start()
    w = chain(
        group([Job.create("square", [i], queue="wf") for i in range(20)]),
        batch(
            [Job.create("square", [i], queue="wf") for i in range(20, 40)],
            on_complete=Job.create("report", [], queue="cb"),
        ),
    )
    client.enqueue_workflow(w)
    wait_until(lambda: client.workflow(w.id).state == "completed", timeout=30, message="the workflow completed")
    assert callbacks == [{str(i): (i + 20) ** 2 for i in range(20)}]
    info = client.workflow(w.id)
    assert info.step(0, 19).result == 361
    assert info.completed_count == 40


def test_a_failing_member_fires_on_failure_and_on_complete(client: Client, worker_factory):
    worker = worker_factory(("wf",), concurrency=4)
    fired: list[tuple[str, dict[str, Any]]] = []

    @worker.handler("member")
    def member(n: int) -> int:
        if n == 3:
            raise ValueError("member 3 fails")
        return n

    @worker.handler("callback")
    def callback(name: str) -> None:
        fired.append((name, current_job().parent_results))

    worker.start()
    w = batch(
        [Job.create("member", [i], queue="wf", retry=RetryPolicy(max_attempts=1)) for i in range(5)],
        on_complete=Job.create("callback", ["complete"], queue="wf"),
        on_success=Job.create("callback", ["success"], queue="wf"),
        on_failure=Job.create("callback", ["failure"], queue="wf"),
    )
    client.enqueue_workflow(w)
    wait_until(lambda: client.workflow(w.id).state == "completed", timeout=20, message="the batch ended")
    assert sorted(name for name, _ in fired) == ["complete", "failure"]
    results = fired[0][1]
    assert [results[str(i)] for i in (0, 1, 2, 4)] == [0, 1, 2, 4]
    assert results["3"]["error"]["message"] == "member 3 fails"
    info = client.workflow(w.id)
    assert info.step(3).state == "failed"
    assert info.step("on_success").state == "cancelled"
    assert info.failed_count == 1
    assert info.errors[0]["job_id"] == w.jobs[3].id


def test_a_failed_chain_step_stops_the_chain(client: Client, worker_factory):
    worker = worker_factory(("wf",), concurrency=2)
    ran: list[int] = []

    @worker.handler("step")
    def step(n: int) -> int:
        ran.append(n)
        if n == 1:
            raise RuntimeError("step 1 fails")
        return n

    worker.start()
    w = chain(*(Job.create("step", [i], queue="wf", retry=RetryPolicy(max_attempts=1)) for i in range(3)))
    client.enqueue_workflow(w)
    wait_until(lambda: client.workflow(w.id).state == "failed", timeout=20, message="the chain failed")
    assert ran == [0, 1]
    assert [s.state for s in client.workflow(w.id).steps] == ["completed", "failed", "cancelled"]


def test_members_keep_their_retry_policy_and_count_once(client: Client, worker_factory):
    worker = worker_factory(("wf",), concurrency=4)
    attempts: Counter[int] = Counter()
    callbacks: list[dict[str, Any]] = []

    @worker.handler("flaky")
    def flaky(n: int) -> int:
        attempts[n] += 1
        if n % 2 == 0 and current_job().attempt == 1:
            raise ConnectionError("first attempt fails")
        return n

    @worker.handler("done")
    def done() -> None:
        callbacks.append(current_job().parent_results)

    worker.start()
    retry = RetryPolicy(max_attempts=3, initial_interval="PT0.1S")
    w = batch(
        [Job.create("flaky", [i], queue="wf", retry=retry) for i in range(6)],
        on_success=Job.create("done", [], queue="wf"),
    )
    client.enqueue_workflow(w)
    wait_until(lambda: client.workflow(w.id).state == "completed", timeout=30, message="the batch completed")
    assert callbacks == [{str(i): i for i in range(6)}]
    assert attempts == Counter({0: 2, 2: 2, 4: 2, 1: 1, 3: 1, 5: 1})


WORKFLOW_WORKER = Path(__file__).resolve().parent.parent / "helpers" / "workflow_worker.py"


def test_drill_sigkill_a_worker_mid_batch_callback_runs_once_with_every_result(
    amqp_url: str, prefix: str, client: Client, names, management, tmp_path: Path
):
    """Issue 31's drill: 200 members on two worker processes, one SIGKILLed after ~50 completed."""
    log = tmp_path / "events.log"
    stderr = open(tmp_path / "workers.stderr", "ab")  # closed in finally
    processes: list[subprocess.Popen] = []

    def spawn() -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, str(WORKFLOW_WORKER), "--prefix", prefix, "--log", str(log), "--concurrency", "4"],
            env={**os.environ, "OJS_AMQP_URL": amqp_url},
            stdout=stderr,
            stderr=stderr,
        )
        processes.append(process)
        return process

    def lines(kind: str) -> list[list[str]]:
        if not log.exists():
            return []
        return [line.split(" ", 2) for line in log.read_text().splitlines() if line.startswith(kind + " ")]

    try:
        victim, survivor = spawn(), spawn()
        w = batch(
            [Job.create("member", [i], queue="wf") for i in range(200)],
            on_complete=Job.create("callback", [], queue="cb"),
        )
        client.enqueue_workflow(w)
        wait_until(lambda: len(lines("done")) >= 50, timeout=60, message="50 members done")
        victim.kill()
        victim.wait()
        done_before_kill = len(lines("done"))
        wait_until(lambda: client.workflow(w.id).state == "completed", timeout=120, message="the batch completed")
        for queue in ("wf", "cb"):  # nothing left to run, nothing unacknowledged: no second callback can come
            wait_until(
                lambda q=queue: (management.queue(names.job_queue(q)) or {}).get("messages", 1) == 0,
                timeout=30,
                message=f"{queue} drained",
            )
        callbacks = lines("callback")
        assert len(callbacks) == 1, callbacks
        assert json.loads(callbacks[0][2]) == {str(i): {"n": i, "square": i * i} for i in range(200)}
        assert {int(n) for _, n, _ in lines("done")} == set(range(200))
        assert 50 <= done_before_kill < 200
        print(f"drill: killed after {done_before_kill} members done; {len(lines('done'))} runs in all")
        assert survivor.poll() is None
        info = client.workflow(w.id)
        assert info.completed_count == 200 and info.step("on_complete").state == "completed"
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        stderr.close()


def test_async_client_enqueues_and_reads_a_workflow(amqp_url: str, prefix: str, worker_factory):
    worker = worker_factory(("wf",), concurrency=2)
    worker.handler("step.run", lambda n: n + 1)
    worker.start()
    w = chain(Job.create("step.run", [1], queue="wf"), Job.create("step.run", [2], queue="wf"))

    async def run() -> WorkflowInfo:
        async with AsyncClient(amqp_url, prefix=prefix) as aclient:
            assert await aclient.enqueue_workflow(w) == w.id
            deadline = time.monotonic() + 20
            while (info := await aclient.workflow(w.id)).state != "completed" and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # awaiting the condition
            return info

    info = asyncio.run(run())
    assert info.state == "completed" and info.result == 3


def test_a_cancelled_member_counts_as_failed(client: Client, worker_factory):
    worker = worker_factory(("wf",), concurrency=2)
    fired: list[dict[str, Any]] = []
    worker.handler("member", lambda n: n)
    worker.handler("alert", lambda: fired.append(current_job().parent_results))
    w = batch([Job.create("member", [i], queue="wf") for i in range(2)], on_failure=Job.create("alert", [], queue="wf"))
    client.enqueue_workflow(w)
    client.cancel(w.jobs[1].id, queue="wf")  # before any worker runs it
    worker.start()
    wait_until(lambda: client.workflow(w.id).state == "completed", timeout=20, message="the batch ended")
    assert fired == [{"0": 0, "1": {"error": {"code": "cancelled", "message": "the job was cancelled"}}}]
    assert client.workflow(w.id).step(1).state == "failed"


def test_cancel_workflow_drops_pending_jobs_cancels_the_running_one_and_never_runs_the_rest(
    client: Client, worker_factory, names
):
    worker = worker_factory(("wf",), concurrency=1)
    ran: list[int] = []
    started, stopped = threading.Event(), threading.Event()

    def block() -> None:
        job = current_job()
        started.set()
        try:
            while not job.cancelled.wait(0.05):
                pass
        finally:  # Cancelled is raised in the handler (cancel_running="interrupt")
            stopped.set()

    worker.handler("block", block)
    worker.handler("count", ran.append)
    job = lambda kind, *args: Job.create(kind, list(args), queue="wf")  # noqa: E731
    w = chain(batch([job("block"), job("count", 1), job("count", 2)], on_complete=job("count", 99)), job("count", 3))
    done = chain(job("count", 7))
    client.enqueue_workflow(w)
    client.enqueue_workflow(done)
    worker.start()
    assert started.wait(20)  # one at a time: the other members wait in the queue behind it

    info = client.cancel_workflow(w.id)
    assert info.state == "cancelled"
    assert {s.state for s in info.steps} == {"cancelled"}  # the running member and the jobs never run
    assert info.to_dict()["metadata"]["cancelled_at"] == info.completed_at is not None
    assert stopped.wait(10)  # the running member got the normal cancel
    fan_ins = [names.fan_in_stream(i) for i in fan_in_ids(w)]
    wait_until(lambda: set(client.queue_counts(fan_ins).values()) == {None}, timeout=20,
               message="the workflow carried to its end: its fan-ins deleted")  # fmt: skip
    wait_until(lambda: client.workflow(done.id).state == "completed", timeout=20, message="the other workflow ran")
    assert ran == [7]  # members 1 and 2 dropped; on_complete and the chain's next step never enqueued
    assert client.queue_counts([names.job_queue("wf")])[names.job_queue("wf")].ready == 0
    after = client.workflow(w.id)
    assert (after.state, after.failed_count, after.errors) == ("cancelled", 0, ())
    assert {s.state for s in after.steps} == {"cancelled"}
    for ended in (w.id, done.id):  # the spec's 409
        with pytest.raises(WorkflowStateError) as refused:
            client.cancel_workflow(ended)
        assert refused.value.current == client.workflow(ended).state and refused.value.requested == "cancelled"
