"""Pipelined publishing (``ConfirmedPublisher.publish(..., flush=False)``): frames written in
batches still reach the queue complete and in order, confirmed, and counted once each."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import kombu
import pytest
from prometheus_client import REGISTRY
from support import get_messages

from ojs_kombu import Client, Job, ValidationError
from ojs_kombu.amqp.publish_buffer import FLUSH_BYTES
from ojs_kombu.amqp.publisher import ConfirmedPublisher
from ojs_kombu.wire.codec import encode


def published_total(queue: str) -> float:
    return REGISTRY.get_sample_value("ojs_amqp_messages_published_total", {"queue": queue}) or 0.0


def test_enqueue_many_over_several_windows_and_buffers_arrives_whole_in_order(amqp_url, prefix, names):
    count = 1200
    with Client(amqp_url, prefix=prefix, window=100) as client:
        jobs = [Job.create("bulk.job", [i, "x" * 300], queue="pipelined") for i in range(count)]
        assert sum(len(encode(job).body) for job in jobs) > 2 * FLUSH_BYTES  # several flushes by size
        before = published_total("pipelined")
        results = client.enqueue_many(jobs)
        assert [r.error for r in results] == [None] * count
        assert published_total("pipelined") - before == count
    delivered = get_messages(amqp_url, names.job_queue("pipelined"), count + 1, timeout=5)
    assert [props.message_id for _, props, _ in delivered] == [job.id for job in jobs]
    assert [body for _, _, body in delivered] == [encode(job).body for job in jobs]


def test_enqueue_many_sends_every_job_as_encode_does(client, amqp_url, names):
    # Jobs of several property keys, interleaved: most are framed from their key's properties.
    options: list[dict] = [
        {},
        {"priority": 3},
        {"tags": ["a", "b"]},
        {"retry": {"max_attempts": 2}},
        {"meta": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
    ]
    jobs = [Job.create("batch.kind", [i], queue="keys", **options[i % len(options)]) for i in range(60)]
    assert all(r.ok for r in client.enqueue_many(jobs))
    delivered = get_messages(amqp_url, names.job_queue("keys"), len(jobs))
    assert len(delivered) == len(jobs)
    for (_, properties, body), job in zip(delivered, jobs, strict=True):
        message = encode(job, app_id=client.app_id)
        assert body == message.body
        assert properties.headers == message.headers
        assert {name: getattr(properties, name) for name in message.properties} == message.properties


@pytest.fixture
def publisher(amqp_url: str, client: Client) -> Iterator[ConfirmedPublisher]:
    client.declare_queue("mixed")
    with kombu.Connection(amqp_url) as connection:
        connection.connect()
        confirmed = ConfirmedPublisher(connection.connection)
        yield confirmed
        confirmed.close()


def test_an_immediate_publish_goes_after_the_buffered_ones(publisher, names, amqp_url):
    jobs = [Job.create("mixed.job", [i], queue="mixed") for i in range(5)]
    tickets = [
        publisher.publish(
            encode(job),
            exchange=names.direct_exchange,
            routing_key="mixed",
            queue="mixed",
            job_id=job.id,
            flush=(i == 3),  # the fourth is written at once, the others buffered
        )
        for i, job in enumerate(jobs)
    ]
    publisher.wait_all(timeout=10)
    assert all(t.done and t.error is None for t in tickets)
    delivered = get_messages(amqp_url, names.job_queue("mixed"), 5)
    assert [props.message_id for _, props, _ in delivered] == [job.id for job in jobs]


def test_buffered_publishes_wait_for_a_flush_or_a_read_of_confirms(publisher, names, amqp_url):
    job = Job.create("mixed.job", [1], queue="mixed")
    ticket = publisher.publish(
        encode(job), exchange=names.direct_exchange, routing_key="mixed", queue="mixed", job_id=job.id, flush=False
    )
    assert get_messages(amqp_url, names.job_queue("mixed"), 1, timeout=0.3) == []  # still in our buffer
    publisher.wait([ticket], timeout=10)
    assert ticket.done and ticket.error is None
    assert [props.message_id for _, props, _ in get_messages(amqp_url, names.job_queue("mixed"), 1)] == [job.id]


def test_a_job_on_a_reserved_queue_is_refused_every_time(client, names):
    # from_json accepts reserved names (a received job may carry one); a producer may not use them.
    data = Job.create("a.b", [1], queue="fine").to_dict()
    reserved = Job.from_json({**data, "queue": "dlx.fine"})
    unhashable = Job.create("a.b", [1], queue="fine").model_copy(update={"queue": ["fine"]})
    for _ in range(2):  # valid names are remembered; refused ones never are
        results = client.enqueue_many([reserved, Job.create("a.b", [2], queue="fine"), unhashable])
        assert [type(r.error) for r in results] == [ValidationError, type(None), ValidationError]
        assert results[0].error is not None and results[0].error.field == "queue"


def test_a_large_batch_runs_without_collections_and_restores_the_collector(amqp_url, prefix):
    from ojs_kombu.client import GC_PAUSE_MIN_JOBS

    collections: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    with Client(amqp_url, prefix=prefix) as client:
        client.declare_queue("paused")
        jobs = [Job.create("bulk.job", [i], queue="paused") for i in range(2 * GC_PAUSE_MIN_JOBS)]
        assert gc.isenabled()
        # From a collection, so that the few allocations before the pause (the jobs' list, the
        # pause itself) cannot be the ones that reach the threshold of a young collection.
        gc.collect()
        gc.callbacks.append(count)
        try:
            results = client.enqueue_many(jobs)
        finally:
            gc.callbacks.remove(count)
        assert [r.error for r in results] == [None] * len(jobs)
        assert collections == []  # thousands of objects allocated, no collection scanned them
        assert gc.isenabled()
        # A broken batch restores it too: the connection refused, every job failed.
        with Client("amqp://guest:guest@127.0.0.1:1//", publish_timeout=0.2, connect_retries=0) as broken:
            failed = broken.enqueue_many(jobs)
        assert all(r.error is not None for r in failed)
        assert gc.isenabled()


def test_gc_pause_false_leaves_the_collector_alone(amqp_url, prefix):
    from ojs_kombu.client import GC_PAUSE_MIN_JOBS

    def sample_during(client: Client, jobs: list[Job]) -> set[bool]:
        """``gc.isenabled()`` as a thread sees it while ``jobs`` are enqueued."""
        seen: set[bool] = set()
        running = threading.Event()
        running.set()

        def sample() -> None:
            while running.is_set():
                seen.add(gc.isenabled())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            assert all(r.ok for r in client.enqueue_many(jobs))
        finally:
            running.clear()
            sampler.join(5)
        return seen

    jobs = [Job.create("bulk.job", [i], queue="unpaused") for i in range(5 * GC_PAUSE_MIN_JOBS)]
    with Client(amqp_url, prefix=prefix, gc_pause=False) as unpaused, Client(amqp_url, prefix=prefix) as paused:
        unpaused.declare_queue("unpaused")
        assert sample_during(unpaused, jobs) == {True}
        assert False in sample_during(paused, jobs)  # the contrast: the default pauses it
