"""``async def`` handlers in Worker (issue 29, item 7) against a real broker: one event loop, not a
thread per job; retries, dead letters, cancels and shutdown as for a plain handler."""

from __future__ import annotations

import asyncio
import threading
import time

from support import message_count, wait_until

from ojs_kombu import Client, Job, RetryPolicy, current_job


def test_200_sleeping_coroutines_finish_in_under_3_s_on_one_loop_thread(client, names, worker_factory):
    finished: list[int] = []
    wrong_job: list[int] = []
    threads: set[int] = set()
    running = peak = 0

    async def nap(index: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        threads.add(threading.get_ident())
        await asyncio.sleep(0.5)
        if current_job().args != [index]:  # each task sees its own job across the await
            wrong_job.append(index)
        running -= 1
        finished.append(index)

    before = threading.active_count()
    worker = worker_factory(concurrency=200)
    worker.handler("nap", nap)
    worker.start()
    assert worker.wait_until_ready(15)
    client.declare_queue("default")
    began = time.monotonic()
    assert all(r.ok for r in client.enqueue_many([Job.create("nap", [i]) for i in range(200)]))
    wait_until(lambda: len(finished) == 200, timeout=10, interval=0.01, message="200 jobs finished")
    took = time.monotonic() - began
    grown = threading.active_count() - before

    assert took < 3.0, f"200 jobs took {took:.2f} s"
    assert sorted(finished) == list(range(200))
    assert wrong_job == []
    assert len(threads) == 1  # every coroutine on the worker's one loop thread
    assert peak > 100, f"at most {peak} ran at once"
    assert grown < 15, f"the process grew by {grown} threads"
    wait_until(lambda: message_count(client.url, names.job_queue("default")) == 0, message="all acked")


def test_a_failing_coroutine_is_retried_then_dead_lettered_like_a_plain_handler(client, names, worker_factory):
    attempts: dict[str, list[int]] = {"async": [], "plain": []}

    async def fails_async() -> None:
        attempts["async"].append(current_job().attempt)
        await asyncio.sleep(0)
        raise RuntimeError("fails on purpose")

    def fails_plain() -> None:
        attempts["plain"].append(current_job().attempt)
        raise RuntimeError("fails on purpose")

    worker = worker_factory()
    worker.handler("fails.async", fails_async)
    worker.handler("fails.plain", fails_plain)
    worker.start()
    assert worker.wait_until_ready(15)
    retry = RetryPolicy(max_attempts=2, initial_interval="PT1S", jitter=False)
    jobs = {kind: client.enqueue(f"fails.{kind}", [], retry=retry) for kind in ("async", "plain")}
    dead_letter_queue = names.dead_letter_queue("default")
    wait_until(lambda: message_count(client.url, dead_letter_queue) == 2, timeout=15, message="2 dead letters")
    assert attempts == {"async": [1, 2], "plain": [1, 2]}
    entries = {entry.message_id: entry for entry in client.dead_letters("default")}

    def shape(job_id: str) -> tuple:
        entry = entries[job_id]
        assert entry.job is not None
        return (entry.error_code, entry.error_message, entry.death_count, [e["type"] for e in entry.job.errors])

    assert (
        shape(jobs["async"].id) == shape(jobs["plain"].id) == ("handler_error", "fails on purpose", 2, ["RuntimeError"])
    )


def test_a_running_coroutine_cancelled_gets_cancelled_error_and_is_acked(client, names, worker_factory):
    started = threading.Event()
    interrupted: list[str] = []

    async def long() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            interrupted.append(current_job().id)
            raise

    worker = worker_factory()
    worker.handler("long", long)
    worker.start()
    assert worker.wait_until_ready(15)
    job = client.enqueue("long", [])
    assert started.wait(10)
    client.cancel(job.id, queue="default")
    wait_until(lambda: interrupted == [job.id], timeout=5, message="the coroutine interrupted")
    wait_until(
        lambda: (i := worker.activity.lookup(job.id)) is not None and i.state == "cancelled", message="cancelled"
    )
    assert message_count(client.url, names.job_queue("default")) == 0
    assert message_count(client.url, names.dead_letter_queue("default")) == 0


def test_stop_waits_for_running_coroutines_within_the_grace_period(client, names, worker_factory):
    started: list[int] = []
    finished: list[int] = []

    async def work(index: int) -> None:
        started.append(index)
        await asyncio.sleep(1.0)
        finished.append(index)

    worker = worker_factory(grace_period=10)
    worker.handler("work", work)
    worker.start()
    assert worker.wait_until_ready(15)
    client.enqueue_many([Job.create("work", [i]) for i in range(3)])
    wait_until(lambda: len(started) == 3, message="3 coroutines running")
    worker.stop()
    assert sorted(finished) == [0, 1, 2]
    assert message_count(client.url, names.job_queue("default")) == 0  # all acked before the close
    assert message_count(client.url, names.dead_letter_queue("default")) == 0


def test_a_coroutine_outliving_the_grace_period_is_left_to_the_broker(amqp_url, prefix, names, worker_factory):
    started = threading.Event()

    async def forever() -> None:
        started.set()
        await asyncio.sleep(60)

    worker = worker_factory(grace_period=0.5)
    worker.handler("forever", forever)
    worker.start()
    assert worker.wait_until_ready(15)
    with Client(amqp_url, prefix=prefix) as client:
        client.enqueue("forever", [])
    assert started.wait(10)
    began = time.monotonic()
    worker.stop()
    assert time.monotonic() - began < 10
    # Unacked when the connection closed: back in its queue for another worker.
    wait_until(lambda: message_count(amqp_url, names.job_queue("default")) == 1, message="the job redelivered")
