"""The dead letters API of :class:`ojs_kombu.Client` against a real broker: list
(non-destructive, oldest first), replay (attempt reset, ``x-death*`` stripped,
by id or all), purge."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pika
import pytest
from support import get_messages, message_count, raw_channel, wait_until

from ojs_kombu import DeadLetter, Job, Names, RetryPolicy, Worker, current_job
from ojs_kombu.runtime.deadletter import ReplayProgress
from ojs_kombu.wire.codec import CONTENT_TYPE, encode
from ojs_kombu.wire.headers import Header


@contextmanager
def worker_starter(amqp_url: str, prefix: str, **options: Any) -> Iterator[Callable[..., Worker]]:
    """``start(**handlers)`` starts a worker on ``prefix`` (``Worker`` ``options`` added); all stopped on exit."""
    workers: list[Worker] = []

    def start(**handlers: Callable) -> Worker:
        worker = Worker(amqp_url, prefix=prefix, concurrency=2, grace_period=5, **options)
        for job_type, handler in handlers.items():
            worker.handler(job_type.replace("__", "."), handler)
        worker.start()
        assert worker.wait_until_ready(15)
        workers.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in workers:
            worker.stop(timeout=5)


@pytest.fixture
def start_worker(amqp_url: str, prefix: str) -> Iterator[Callable[..., Worker]]:
    """Start a worker on the test's prefix with the given handlers; stopped afterwards."""
    with worker_starter(amqp_url, prefix) as start:
        yield start


def publish_garbage(amqp_url: str, names: Names, message_id: str, *, exchange: str) -> None:
    """A message that is not an OJS job, routed with key ``default`` through ``exchange``."""
    with raw_channel(amqp_url) as channel:
        channel.confirm_delivery()
        channel.basic_publish(
            exchange,
            "default",
            b"this is not an OJS job",
            pika.BasicProperties(content_type=CONTENT_TYPE, message_id=message_id, delivery_mode=2),
            mandatory=True,
        )


def dead_letter_jobs(amqp_url: str, names: Names, count: int) -> list[Job]:
    """``count`` jobs put straight into ``ojs.queue.dlx.default`` (through the dead letter exchange)."""
    jobs = [Job.create("bulk.job", [i]) for i in range(count)]
    with raw_channel(amqp_url) as channel:
        channel.confirm_delivery()
        for job in jobs:
            message = encode(job)
            properties = pika.BasicProperties(headers=message.headers, **message.properties)
            channel.basic_publish(names.dead_letter_exchange, "default", message.body, properties, mandatory=True)
    return jobs


def test_dead_letters_lists_oldest_first_without_removing(amqp_url, client, names, start_worker):
    dead_letter_queue = names.dead_letter_queue("default")

    def doomed() -> None:
        raise DeadLetter("poison")

    start_worker(doomed__job=doomed)
    nacked = client.enqueue("doomed.job", [])
    wait_until(lambda: message_count(amqp_url, dead_letter_queue) == 1, timeout=15, message="1 dead letter")
    publish_garbage(amqp_url, names, "garbage-1", exchange=names.direct_exchange)
    wait_until(lambda: message_count(amqp_url, dead_letter_queue) == 2, timeout=15, message="2 dead letters")
    unknown = client.enqueue("unknown.type", [1])
    wait_until(lambda: message_count(amqp_url, dead_letter_queue) == 3, timeout=15, message="3 dead letters")

    entries = client.dead_letters("default", limit=10)
    assert [e.message_id for e in entries] == [nacked.id, "garbage-1", unknown.id]  # oldest first
    assert message_count(amqp_url, dead_letter_queue) == 3  # listing removed nothing
    assert [e.message_id for e in client.dead_letters("default", limit=10)] == [e.message_id for e in entries]
    assert [e.message_id for e in client.dead_letters("default", limit=2)] == [nacked.id, "garbage-1"]

    first, garbage, unknown_entry = entries
    # Basic.Nack (the binding's FAIL): RabbitMQ records why; the message itself is unchanged.
    assert first.job.id == nacked.id and first.job.type == "doomed.job"
    assert first.reason == "rejected" and first.death_count == 1
    # Messages no handler can run are republished with the reason in x-ojs-error-*.
    assert garbage.job is None and garbage.decode_error.startswith("decode_error")
    assert garbage.reason == "republished" and garbage.error_code == "decode_error"
    assert garbage.error_message.startswith("body is not JSON")
    assert unknown_entry.job.id == unknown.id and unknown_entry.job.args == [1]
    assert unknown_entry.error_code == "unknown_type" and "unknown.type" in unknown_entry.error_message


def test_replay_resets_the_attempt_strips_x_death_and_honours_ids_and_limit(amqp_url, client, names, start_worker):
    dead_letter_queue = names.dead_letter_queue("default")
    failing = threading.Event()
    failing.set()
    attempts: dict[str, list[int]] = {}

    def flaky(_: int) -> None:
        job = current_job()
        attempts.setdefault(job.id, []).append(job.attempt)
        if failing.is_set():
            raise RuntimeError("not yet")

    first_worker = start_worker(flaky__job=flaky)
    policy = RetryPolicy(max_attempts=2, initial_interval="PT0.1S", jitter=False)
    jobs = [client.enqueue("flaky.job", [i], retry=policy) for i in range(3)]
    wait_until(lambda: message_count(amqp_url, dead_letter_queue) == 3, timeout=20, message="3 dead letters")
    first_worker.stop(timeout=5)
    assert all(attempts[job.id] == [1, 2] for job in jobs)
    publish_garbage(amqp_url, names, "garbage-2", exchange=names.dead_letter_exchange)

    # ids=: only the selected job goes back; the others stay in the DLQ, in order.
    before = [e.message_id for e in client.dead_letters("default")]
    remaining = [i for i in before if i != jobs[1].id]
    assert client.replay_dead_letters("default", ids=[jobs[1].id.upper()]) == [jobs[1].id]
    assert [e.message_id for e in client.dead_letters("default")] == remaining
    [(method, properties, body)] = get_messages(amqp_url, names.job_queue("default"), 1)
    assert properties.message_id == jobs[1].id and method.redelivered is False
    assert properties.headers[Header.ATTEMPT] == 1
    assert not [k for k in properties.headers if "death" in k or k in (Header.ERROR_CODE, Header.ERROR_MESSAGE)]
    replayed = Job.from_json(body)
    assert replayed.attempt == 0 and replayed.meta["ojs.replay_count"] == 1

    # limit= and then everything: the worker runs each replayed job as attempt 1 again.
    failing.clear()
    start_worker(flaky__job=flaky)
    one, other, _ = remaining
    assert client.replay_dead_letters("default", limit=1) == [one]  # the oldest
    assert client.replay_dead_letters("default") == [other]  # the garbage is not a job: it stays
    assert {one, other} == {jobs[0].id, jobs[2].id}
    wait_until(lambda: all(len(attempts[i]) == 3 for i in (one, other)), timeout=15, message="replays ran")
    assert attempts[one] == attempts[other] == [1, 2, 1]
    [garbage] = client.dead_letters("default")
    assert garbage.message_id == "garbage-2" and garbage.job is None

    assert client.purge_dead_letters("default") == 1
    assert message_count(amqp_url, dead_letter_queue) == 0
    assert client.purge_dead_letters("default") == 0


def test_replay_by_id_holds_a_bounded_window_and_keeps_the_order(amqp_url, client, names):
    total, window = 300, 10
    dead_letter_queue = names.dead_letter_queue("default")
    client.declare_queue("default")
    jobs = dead_letter_jobs(amqp_url, names, total)
    assert message_count(amqp_url, dead_letter_queue) == total
    chosen = [jobs[i].id for i in (0, 77, 150, 222, total - 1)]  # the last one: the scan must pass everything

    # What the replay holds unacked, as it counts it, once per window ...
    reports: list[ReplayProgress] = []
    # ... and the exact ready count of a passive declare, sampled while the replay runs: a letter held
    # unacked is not ready, and a passed-over letter is back (at the tail) before it is acked.
    samples: list[tuple[float, int]] = []
    sampling, done = threading.Event(), threading.Event()

    def sample() -> None:
        with raw_channel(amqp_url) as channel:
            while not done.is_set():
                ready = channel.queue_declare(dead_letter_queue, passive=True).method.message_count
                samples.append((time.monotonic(), ready))
                sampling.set()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert sampling.wait(10)
    started = time.monotonic()
    try:
        replayed = client.replay_dead_letters("default", ids=chosen, window=window, progress=reports.append)
    finally:
        ended = time.monotonic()
        done.set()
        sampler.join(10)

    assert replayed == chosen
    assert max(r.held for r in reports) == window and sum(r.held for r in reports) == total
    assert reports[-1] == ReplayProgress(total, total, len(chosen) - 1, total - len(chosen), held=window)
    during = [ready for at, ready in samples if started <= at <= ended]
    assert len(during) >= 5, "the sampler did not watch the replay"
    assert min(during) >= total - len(chosen) - window, min(during)
    # The letters left behind are all there, in their order, and the chosen ones are in the job queue.
    left = [e.message_id for e in client.dead_letters("default", limit=total)]
    assert left == [job.id for job in jobs if job.id not in chosen]
    received = get_messages(amqp_url, names.job_queue("default"), len(chosen))
    assert [p.message_id for _, p, _ in received] == chosen


def test_replay_with_a_limit_stops_at_it_unless_letters_were_passed_over(amqp_url, client, names):
    client.declare_queue("default")
    jobs = dead_letter_jobs(amqp_url, names, 30)
    reports: list[ReplayProgress] = []
    # Nothing passed over: the scan ends with the limit, the rest is not touched.
    assert client.replay_dead_letters("default", limit=3, window=10, progress=reports.append) == [
        job.id for job in jobs[:3]
    ]
    assert [r.scanned for r in reports] == [3]
    assert [e.message_id for e in client.dead_letters("default", limit=50)] == [job.id for job in jobs[3:]]
    # A letter passed over first (not a job): the scan goes round the whole queue to keep the order.
    client.purge_dead_letters("default")
    publish_garbage(amqp_url, names, "garbage-3", exchange=names.dead_letter_exchange)
    jobs = dead_letter_jobs(amqp_url, names, 30)
    reports.clear()
    assert client.replay_dead_letters("default", limit=2, window=10, progress=reports.append) == [
        job.id for job in jobs[:2]
    ]
    assert reports[-1].scanned == 31 and reports[-1].passed_over == 29
    assert [e.message_id for e in client.dead_letters("default", limit=50)] == ["garbage-3"] + [
        job.id for job in jobs[2:]
    ]


def test_purge_by_ids_removes_exactly_those_and_keeps_the_order(amqp_url, client, names):
    client.declare_queue("default")
    dead_letter_queue = names.dead_letter_queue("default")
    publish_garbage(amqp_url, names, "garbage-4", exchange=names.dead_letter_exchange)
    jobs = dead_letter_jobs(amqp_url, names, 40)
    chosen = {jobs[i].id for i in (0, 5, 17, 39)} | {"GARBAGE-4"}  # any case; a non-job letter by message_id
    before = [e.message_id for e in client.dead_letters("default", limit=100)]

    assert client.purge_dead_letters("default", ids=chosen, window=7) == 5
    left = [e.message_id for e in client.dead_letters("default", limit=100)]
    assert left == [i for i in before if i.lower() not in {c.lower() for c in chosen}]
    assert message_count(amqp_url, dead_letter_queue) == 36
    # Ids that are not there, or none at all: nothing is removed, the order stays.
    assert client.purge_dead_letters("default", ids=[jobs[0].id, "no-such-id"]) == 0
    assert client.purge_dead_letters("default", ids=[]) == 0
    assert [e.message_id for e in client.dead_letters("default", limit=100)] == left
    assert get_messages(amqp_url, names.job_queue("default"), 1, timeout=0.2) == []  # nothing was replayed
