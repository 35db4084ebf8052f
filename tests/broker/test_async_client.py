"""AsyncClient (issue 29, item 7) against a real broker: enqueues that never block the event loop,
coalesced into batches; control and dead letters; typed errors; closing with calls pending.

pytest-asyncio is not a dependency: each test drives its own loop with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pika
import pytest
from support import message_count, raw_channel, wait_until

from ojs_kombu import (
    AsyncClient,
    BrokerConnectionError,
    Client,
    ClientClosedError,
    Job,
    UnroutableError,
    ValidationError,
)
from ojs_kombu.wire.codec import encode


class StallMonitor:
    """Sleeps 1 ms in a loop on the event loop and records the largest gap between its wake-ups."""

    def __init__(self) -> None:
        self.largest = 0.0
        self.wakeups = 0
        self._stop = False

    async def run(self) -> None:
        last = time.perf_counter()
        while not self._stop:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.largest = max(self.largest, now - last)
            self.wakeups += 1
            last = now

    def stop(self) -> None:
        self._stop = True


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(coro_fn())  # type: ignore[arg-type]


def test_500_gathered_enqueues_keep_the_loop_responsive_and_are_batched(amqp_url, prefix, names, monkeypatch):
    """The loop's largest stall during a 500-job gather stays under 50 ms, best of up to 3 rounds.

    Why rounds: on this shared 2-core machine an idle event loop alone, with no library code,
    showed 72 and 86 ms gaps in 20 s (the OS does not schedule the thread: load average ~3).
    A round lasts ~50 ms, so one such gap now and then falls inside it.  An implementation
    that blocked the loop fails every round: the gather's 500 first steps run in one loop
    iteration, so 500 synchronous publishes would stall it for hundreds of ms each time.
    """
    batches: list[int] = []
    enqueue_many = Client.enqueue_many

    def counting(self: Client, jobs: Any) -> Any:
        jobs = list(jobs)
        batches.append(len(jobs))
        return enqueue_many(self, jobs)

    monkeypatch.setattr(Client, "enqueue_many", counting)

    async def gather_500(client: AsyncClient) -> tuple[list[Job], StallMonitor]:
        monitor = StallMonitor()
        watching = asyncio.create_task(monitor.run())
        await asyncio.sleep(0.01)
        jobs = await asyncio.gather(*(client.enqueue("bulk.job", [i]) for i in range(500)))
        await asyncio.sleep(0.01)
        monitor.stop()
        await watching
        return jobs, monitor

    async def scenario() -> tuple[list[list[Job]], list[StallMonitor]]:
        async with AsyncClient(amqp_url, prefix=prefix) as client:
            await client.declare_queue("default")
            rounds: list[list[Job]] = []
            monitors: list[StallMonitor] = []
            while len(rounds) < 3 and not any(m.largest < 0.050 for m in monitors):
                batches.clear()
                jobs, monitor = await gather_500(client)
                rounds.append(jobs)
                monitors.append(monitor)
            return rounds, monitors

    rounds, monitors = run(scenario)
    for jobs in rounds:
        assert [job.args for job in jobs] == [[i] for i in range(500)]
        assert len({job.id for job in jobs}) == 500
    expected = 500 * len(rounds)
    wait_until(
        lambda: message_count(amqp_url, names.job_queue("default")) == expected, message=f"{expected} jobs queued"
    )
    assert all(m.wakeups > 10 for m in monitors)
    stalls = [round(m.largest * 1000, 1) for m in monitors]
    assert min(stalls) < 50, f"the event loop stalled (ms, per round): {stalls}"
    assert sum(batches) == 500  # the last round's
    assert len(batches) < 100, f"enqueues were not coalesced: {len(batches)} batches"


def test_each_gathered_caller_gets_its_own_job_or_its_own_typed_error(amqp_url, prefix, names):
    async def scenario() -> list[Any]:
        async with AsyncClient(amqp_url, prefix=prefix, declare=False) as client:
            await client.declare_queue("good")
            bad = Job.model_construct(**{**Job.create("x", []).model_dump(), "queue": "UPPER"})
            calls = [
                client.enqueue("a.job", [1], queue="good"),
                client.enqueue("a.job", [2], queue="nowhere"),  # not declared: unroutable
                client.enqueue_job(bad),
                client.enqueue("a.job", [3], queue="good"),
            ]
            return await asyncio.gather(*calls, return_exceptions=True)

    first, unroutable, invalid, last = run(scenario)
    assert isinstance(first, Job) and first.args == [1]
    assert isinstance(unroutable, UnroutableError)
    assert isinstance(invalid, ValidationError)
    assert isinstance(last, Job) and last.args == [3]
    assert message_count(amqp_url, names.job_queue("good")) == 2


def test_a_bad_argument_raises_validation_error_before_any_io(amqp_url, prefix):
    async def scenario() -> None:
        async with AsyncClient(amqp_url, prefix=prefix) as client:
            with pytest.raises(ValidationError):
                await client.enqueue("Not A Type", [])
            with pytest.raises(ValidationError):
                await client.cancel(str(uuid.uuid4()), queue="UPPER")
            with pytest.raises(ValidationError):
                await client.info(str(uuid.uuid4()), queue="default", timeout=0)

    run(scenario)


def test_enqueue_many_returns_one_result_per_job(amqp_url, prefix, names):
    async def scenario() -> list[Any]:
        async with AsyncClient(amqp_url, prefix=prefix) as client:
            return await client.enqueue_many([Job.create("a.job", [i]) for i in range(20)])

    results = run(scenario)
    assert [r.ok for r in results] == [True] * 20
    assert [r.job.args for r in results] == [[i] for i in range(20)]
    wait_until(lambda: message_count(amqp_url, names.job_queue("default")) == 20, message="20 jobs")


def test_an_unreachable_broker_is_a_broker_connection_error(prefix):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def scenario() -> None:
        async with AsyncClient(f"amqp://guest:guest@127.0.0.1:{port}//", prefix=prefix, publish_timeout=0.5) as client:
            results = await asyncio.gather(*(client.enqueue("a.job", [i]) for i in range(3)), return_exceptions=True)
            assert all(isinstance(r, BrokerConnectionError) for r in results), results

    run(scenario)


def test_cancel_round_trip_a_cancelled_job_never_runs(amqp_url, prefix, names, worker_factory):
    async def scenario() -> tuple[Job, Job]:
        async with AsyncClient(amqp_url, prefix=prefix) as client:
            target = await client.enqueue("work", [])
            await client.cancel(target.id, queue="default")
            sentinel = await client.enqueue("work", [])
            return target, sentinel

    target, sentinel = run(scenario)
    ran: list[str] = []
    worker = worker_factory()

    def work() -> None:
        from ojs_kombu import current_job

        ran.append(current_job().id)

    worker.handler("work", work)
    worker.start()
    wait_until(lambda: sentinel.id in ran, message="the sentinel job")
    assert target.id not in ran
    assert message_count(amqp_url, names.job_queue("default")) == 0


def test_info_round_trip_answers_a_finished_job(amqp_url, prefix, worker_factory):
    done = threading.Event()
    worker = worker_factory()
    worker.handler("work", done.set)
    worker.start()
    assert worker.wait_until_ready(15)

    async def scenario() -> tuple[Any, Any]:
        async with AsyncClient(amqp_url, prefix=prefix) as client:
            job = await client.enqueue("work", [])
            await asyncio.to_thread(done.wait, 15)
            await asyncio.to_thread(
                wait_until, lambda: (i := worker.activity.lookup(job.id)) is not None and i.state == "completed"
            )
            known = await client.info(job.id, queue="default", timeout=2.0)
            unknown = await client.info(str(uuid.uuid4()), queue="default", timeout=0.5)
            return known, unknown

    known, unknown = run(scenario)
    assert known is not None and known.state == "completed" and known.worker_id == worker.worker_id
    assert unknown is None


def test_dead_letters_round_trip_lists_without_removing(amqp_url, prefix, names, client):
    client.declare_queue("default")
    jobs = [Job.create("dead.job", [i]) for i in range(3)]
    with raw_channel(amqp_url) as channel:
        channel.confirm_delivery()
        for job in jobs:
            message = encode(job)
            properties = pika.BasicProperties(headers=message.headers, **message.properties)
            channel.basic_publish(names.dead_letter_exchange, "default", message.body, properties, mandatory=True)

    async def scenario() -> tuple[list[Any], list[Any]]:
        async with AsyncClient(amqp_url, prefix=prefix) as aclient:
            return await aclient.dead_letters("default"), await aclient.dead_letters("default", limit=1)

    everything, first = run(scenario)
    assert [e.message_id for e in everything] == [job.id for job in jobs]
    assert [e.message_id for e in first] == [jobs[0].id]
    assert message_count(amqp_url, names.dead_letter_queue("default")) == 3


def test_closing_fails_waiting_calls_and_lets_the_running_one_finish(amqp_url, prefix, names):
    async def scenario() -> tuple[Any, list[Any], float]:
        client = AsyncClient(amqp_url, prefix=prefix)
        await client.open()
        await client.declare_queue("default")
        # INFO on an unknown job holds the I/O thread for its whole timeout; the enqueues wait behind it.
        running = asyncio.create_task(client.info(str(uuid.uuid4()), queue="default", timeout=1.0))
        await asyncio.sleep(0.2)
        waiting = [asyncio.create_task(client.enqueue("a.job", [i])) for i in range(5)]
        await asyncio.sleep(0.05)
        began = time.monotonic()
        await client.aclose()
        took = time.monotonic() - began
        outcomes = await asyncio.gather(*waiting, return_exceptions=True)
        with pytest.raises(ClientClosedError):
            await client.enqueue("a.job", [])
        await client.aclose()  # idempotent
        return await running, outcomes, took

    info, outcomes, took = run(scenario)
    assert info is None  # the running call finished normally
    assert all(isinstance(o, ClientClosedError) for o in outcomes), outcomes
    assert took < 2.0
    assert message_count(amqp_url, names.job_queue("default")) == 0  # the waiting jobs were not published


def test_closing_never_hangs_on_a_call_that_outlasts_close_timeout(amqp_url, prefix):
    async def scenario() -> tuple[BaseException | None, float]:
        client = AsyncClient(amqp_url, prefix=prefix, close_timeout=0.2)
        await client.open()
        running = asyncio.create_task(client.info(str(uuid.uuid4()), queue="default", timeout=3.0))
        await asyncio.sleep(0.3)
        began = time.monotonic()
        await client.aclose()
        took = time.monotonic() - began
        try:
            await running
        except ClientClosedError as exc:
            return exc, took
        return None, took

    error, took = run(scenario)
    assert isinstance(error, ClientClosedError)
    assert took < 1.0


def test_a_client_that_is_not_open_refuses_calls(amqp_url):
    async def scenario() -> None:
        client = AsyncClient(amqp_url)
        with pytest.raises(ClientClosedError):
            await client.enqueue("a.job", [])
        await client.aclose()
        with pytest.raises(ClientClosedError):
            await client.enqueue("a.job", [])

    run(scenario)


def test_bad_options_are_validation_errors(amqp_url):
    with pytest.raises(ValidationError):
        AsyncClient(amqp_url, max_batch=0)
    with pytest.raises(ValidationError):
        AsyncClient(amqp_url, close_timeout=0)

    async def scenario() -> None:
        client = AsyncClient(amqp_url, publish_timeout=-1)
        with pytest.raises(ValidationError):
            await client.open()
        with pytest.raises(ClientClosedError):
            await client.enqueue("a.job", [])

    run(scenario)
