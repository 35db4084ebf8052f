"""Batch consumption (issue 31 item 2, seed 002) on a real broker with a real Worker: batches of at
most ``size`` (or what arrived within ``timeout``), one ``Basic.Ack(multiple=True)`` per batch, a
failed member retried or dead-lettered alone, a cancelled member never passed, and nothing lost
when a worker dies mid-batch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support import message_count, wait_until

from ojs_kombu import BatchItemFailed, Client, Job, RetryPolicy, ValidationError
from ojs_kombu.runtime.lifecycle import JobEvent

WORKER_SCRIPT = Path(__file__).resolve().parent.parent / "helpers" / "worker_process.py"


def _drained(client: Client, names, worker) -> bool:
    """Nothing ready in the job queue and nothing the worker's channel has not settled."""
    return message_count(client.url, names.job_queue("default")) == 0 and not worker.consumer.settling.outstanding


def test_250_jobs_run_in_batches_of_at_most_100_each_acked_with_one_multiple_ack(client, names, worker_factory):
    batches: list[list[int]] = []
    worker = worker_factory(concurrency=4)

    @worker.batch_handler("sum", size=100, timeout=1.0)
    def run(jobs: list[Job]) -> None:
        batches.append([job.args[0] for job in jobs])

    client.declare_queue("default")
    assert all(r.ok for r in client.enqueue_many([Job.create("sum", [i]) for i in range(250)]))
    assert worker.consumer.prefetch == 104  # concurrency + one full batch
    worker.start()
    assert worker.wait_until_ready(15)
    wait_until(lambda: sum(map(len, batches)) == 250, timeout=20, message="250 jobs run")
    wait_until(lambda: _drained(client, names, worker), timeout=10, message="every job acked")

    assert sorted(i for batch in batches for i in batch) == list(range(250))
    assert all(len(batch) <= 100 for batch in batches)
    assert [len(b) for b in batches].count(100) >= 2, [len(b) for b in batches]
    settling = worker.consumer.settling
    # Every batch one Basic.Ack(multiple=True), unless its tags were not contiguous (then acked one by one).
    assert settling.multiple_acks + settling.single_ack_batches == len(batches)
    assert settling.multiple_acks >= 2


def test_the_timeout_flushes_a_partial_batch(client, names, worker_factory):
    batches: list[tuple[float, int]] = []
    worker = worker_factory()

    @worker.batch_handler("part", size=100, timeout=0.3)
    def run(jobs: list[Job]) -> None:
        batches.append((time.monotonic(), len(jobs)))

    worker.start()
    assert worker.wait_until_ready(15)
    client.declare_queue("default")
    sent = time.monotonic()
    assert all(r.ok for r in client.enqueue_many([Job.create("part", [i]) for i in range(7)]))
    wait_until(lambda: sum(n for _, n in batches) == 7, timeout=10, message="7 jobs run")
    assert batches[0][1] == 7 and len(batches) == 1
    assert 0.25 <= batches[0][0] - sent < 3.0  # flushed by the timeout, not by the size
    wait_until(lambda: _drained(client, names, worker), timeout=10, message="every job acked")
    assert worker.consumer.settling.multiple_acks == 1


def test_a_failed_member_is_retried_alone_and_then_succeeds(client, names, worker_factory):
    seen: list[tuple[int, int]] = []  # (arg, attempt)
    events: list[JobEvent] = []
    worker = worker_factory()
    worker.lifecycle.subscribe(events.append)

    @worker.batch_handler("flaky", size=10, timeout=0.3)
    def run(jobs: list[Job]) -> None:
        seen.extend((job.args[0], job.attempt) for job in jobs)
        for index, job in enumerate(jobs):
            if job.args[0] == 3 and job.attempt == 1:
                raise BatchItemFailed(index, RuntimeError("member 3 fails once"))

    worker.start()
    assert worker.wait_until_ready(15)
    retry = RetryPolicy(max_attempts=2, initial_interval="PT0.5S", jitter=False)
    jobs = [Job.create("flaky", [i], retry=retry) for i in range(5)]
    client.declare_queue("default")
    assert all(r.ok for r in client.enqueue_many(jobs))
    wait_until(lambda: len(seen) == 6, timeout=15, message=f"6 runs, got {seen}")
    wait_until(lambda: _drained(client, names, worker), timeout=10, message="every job acked")

    assert sorted(seen) == sorted([(i, 1) for i in range(5)] + [(3, 2)])
    three = jobs[3].id
    assert [(e.event, e.attempt) for e in events if e.job_id == three] == [
        ("started", 1),
        ("failed", 1),
        ("retried", 1),
        ("started", 2),
        ("succeeded", 2),
    ]
    assert sorted(e.job_id for e in events if e.event == "succeeded") == sorted(j.id for j in jobs)
    assert message_count(client.url, names.dead_letter_queue("default")) == 0


def test_a_member_failed_in_the_returned_list_is_dead_lettered_with_its_final_failure(client, names, worker_factory):
    worker = worker_factory()
    ran: list[int] = []

    @worker.batch_handler("items", size=10, timeout=0.3)
    def run(jobs: list[Job]) -> list[object]:
        ran.extend(job.args[0] for job in jobs)
        return [ValueError(f"bad {job.args[0]}") if job.args[0] == 1 else job.args[0] * 2 for job in jobs]

    worker.start()
    assert worker.wait_until_ready(15)
    jobs = [Job.create("items", [i], retry=RetryPolicy(max_attempts=1)) for i in range(3)]
    client.declare_queue("default")
    assert all(r.ok for r in client.enqueue_many(jobs))
    dead_letter_queue = names.dead_letter_queue("default")
    wait_until(lambda: message_count(client.url, dead_letter_queue) == 1, timeout=15, message="1 dead letter")
    wait_until(lambda: _drained(client, names, worker), timeout=10, message="every job settled")
    assert sorted(ran) == [0, 1, 2]
    (entry,) = client.dead_letters("default")
    assert entry.message_id == jobs[1].id
    assert (entry.error_code, entry.error_message) == ("handler_error", "bad 1")


def test_a_whole_batch_failure_fails_each_member_by_its_own_policy(client, names, worker_factory):
    runs: list[tuple[str, int]] = []
    worker = worker_factory()

    @worker.batch_handler("whole", size=10, timeout=0.3)
    def run(jobs: list[Job]) -> None:
        runs.extend((job.id, job.attempt) for job in jobs)
        if any(job.attempt == 1 for job in jobs):
            raise RuntimeError("the whole batch fails")

    worker.start()
    assert worker.wait_until_ready(15)
    once = Job.create("whole", [0], retry=RetryPolicy(max_attempts=1))
    twice = [Job.create("whole", [i], retry=RetryPolicy(max_attempts=2, initial_interval="PT0.5S")) for i in (1, 2)]
    client.declare_queue("default")
    assert all(r.ok for r in client.enqueue_many([once, *twice]))
    dead_letter_queue = names.dead_letter_queue("default")
    wait_until(lambda: len(runs) == 5, timeout=15, message=f"5 runs, got {runs}")
    wait_until(lambda: message_count(client.url, dead_letter_queue) == 1, timeout=15, message="1 dead letter")
    wait_until(lambda: _drained(client, names, worker), timeout=10, message="every job settled")
    assert sorted(runs) == sorted([(once.id, 1)] + [(j.id, a) for j in twice for a in (1, 2)])
    (entry,) = client.dead_letters("default")
    assert (entry.message_id, entry.error_message) == (once.id, "the whole batch fails")


def test_a_cancelled_member_is_not_passed_to_the_handler(client, names, worker_factory):
    passed: list[str] = []
    events: list[JobEvent] = []
    worker = worker_factory()
    worker.lifecycle.subscribe(events.append)

    @worker.batch_handler("cancel", size=10, timeout=0.5)
    def run(jobs: list[Job]) -> None:
        passed.extend(job.id for job in jobs)

    jobs = [Job.create("cancel", [i]) for i in range(5)]
    client.declare_queue("default")
    assert all(r.ok for r in client.enqueue_many(jobs))
    client.cancel(jobs[2].id, queue="default")
    worker.start()
    assert worker.wait_until_ready(15)
    wait_until(lambda: len(passed) == 4, timeout=15, message=f"4 passed, got {passed}")
    wait_until(lambda: _drained(client, names, worker), timeout=10, message="every job settled")
    assert jobs[2].id not in passed
    assert [e.event for e in events if e.job_id == jobs[2].id] == ["cancelled"]


def test_a_batch_handler_is_validated():
    from ojs_kombu import Worker

    worker = Worker(queues=["default"])
    with pytest.raises(ValidationError):
        worker.batch_handler("x", size=0)
    with pytest.raises(ValidationError):
        worker.batch_handler("x", timeout=0)

    async def coroutine(jobs: list[Job]) -> None:
        pass

    with pytest.raises(ValidationError):
        worker.batch_handler("x")(coroutine)


def test_a_graceful_stop_runs_the_batch_in_collection(client, names, worker_factory):
    batches: list[int] = []
    worker = worker_factory()

    @worker.batch_handler("stop", size=100, timeout=30.0)
    def run(jobs: list[Job]) -> None:
        batches.append(len(jobs))

    worker.start()
    assert worker.wait_until_ready(15)
    client.declare_queue("default")
    assert all(r.ok for r in client.enqueue_many([Job.create("stop", [i]) for i in range(5)]))
    # Joined the batch: a delivery not judged yet when the worker drains is handed back unstarted (as a
    # plain handler's), so `unsettled` (counted on arrival) would not do.
    batchers = worker.processing.batching.batchers
    wait_until(lambda: "stop" in batchers and batchers["stop"].held == 5, timeout=10, message="5 jobs collected")
    began = time.monotonic()
    worker.stop()
    assert time.monotonic() - began < 5  # not the 30 s timeout
    assert batches == [5]
    assert message_count(client.url, names.job_queue("default")) == 0


def test_a_worker_killed_mid_batch_loses_no_job(client, names, worker_factory, amqp_url, prefix, tmp_path):
    log = tmp_path / "events.log"
    stderr = open(tmp_path / "worker.stderr", "ab")
    child = subprocess.Popen(
        [sys.executable, str(WORKER_SCRIPT), "--prefix", prefix, "--log", str(log), "--sleep", "30"],
        env={**os.environ, "OJS_AMQP_URL": amqp_url},
        stdout=stderr,
        stderr=stderr,
    )
    try:
        retry = RetryPolicy(max_attempts=3, initial_interval="PT0.5S", jitter=False)
        jobs = [Job.create("batch.slow", [i], retry=retry) for i in range(20)]
        client.declare_queue("default")
        assert all(r.ok for r in client.enqueue_many(jobs))
        wait_until(
            lambda: log.exists() and log.read_text().count("batch ") == 20,
            timeout=20,
            message="the child's batch started",
        )
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        stderr.close()
    assert "batch-end" not in log.read_text()

    done: list[tuple[str, int]] = []
    worker = worker_factory()
    lock = threading.Lock()

    @worker.batch_handler("batch.slow", size=50, timeout=0.3)
    def rerun(batch: list[Job]) -> None:
        with lock:
            done.extend((job.id, job.attempt) for job in batch)

    worker.start()
    assert worker.wait_until_ready(15)
    wait_until(lambda: len(done) == 20, timeout=20, message=f"20 jobs rerun, got {len(done)}")
    wait_until(lambda: _drained(client, names, worker), timeout=10, message="every job acked")
    # Each redelivery counted the lost attempt (worker_lost), then ran again: attempt 2.
    assert sorted(done) == sorted((job.id, 2) for job in jobs)
    assert message_count(client.url, names.dead_letter_queue("default")) == 0


def test_a_batch_interleaved_with_a_plain_handlers_deliveries_is_acked_one_by_one(client, names, worker_factory):
    batches: list[int] = []
    plain: list[int] = []
    release = threading.Event()
    worker = worker_factory(concurrency=2)

    @worker.batch_handler("mixed.batch", size=10, timeout=0.5)
    def run(jobs: list[Job]) -> None:
        batches.append(len(jobs))

    @worker.handler("mixed.plain")
    def slow(i: int) -> None:
        plain.append(i)
        release.wait(10)  # outstanding while the batch around it is acked

    jobs = [Job.create("mixed.plain" if i == 3 else "mixed.batch", [i]) for i in range(8)]
    client.declare_queue("default")
    assert all(r.ok for r in client.enqueue_many(jobs))
    worker.start()
    assert worker.wait_until_ready(15)
    wait_until(lambda: sum(batches) == 7, timeout=15, message=f"7 batch jobs, got {batches}")
    settling = worker.consumer.settling
    # A multiple ack would have acked the plain job's delivery too (its later ack: a channel error).
    wait_until(lambda: len(settling.outstanding) == 1, timeout=10, message="the batch acked")
    assert settling.single_ack_batches >= 1
    release.set()
    wait_until(lambda: _drained(client, names, worker), timeout=10, message="every job acked")
    assert plain == [3]
    assert worker.consumer.reconnections == 0  # no channel error
