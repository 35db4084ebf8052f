"""The ``ojs://`` path's bookkeeping: job deliveries counted like the Worker's, queue maps not kept forever."""

from __future__ import annotations

import gc
import uuid

import kombu
from prometheus_client import REGISTRY
from support import ojs_url, wait_until

import ojs_celery  # noqa: F401  registers the Celery codec: the jobs below reach kombu as Celery task messages
from ojs_kombu import Client
from ojs_kombu.transport.queues import live_prefixes

COUNTERS = ("consumed", "acked", "nacked")


def _counts(queue: str) -> dict[str, float]:
    return {
        name: REGISTRY.get_sample_value(f"ojs_amqp_messages_{name}_total", {"queue": queue}) or 0.0 for name in COUNTERS
    }


def test_job_deliveries_are_counted_consumed_acked_and_nacked(amqp_url, prefix):
    """Three jobs through a kombu consumer on ``ojs://``: one acked, one rejected (Basic.Nack), one
    requeued (a failed attempt: republished to its retry queue by the Settler, then acked)."""
    queue_name = f"m{uuid.uuid4().hex[:10]}"
    with Client(amqp_url, prefix=prefix) as client:
        for i in range(3):
            client.enqueue("metrics.probe", [i], queue=queue_name)
    before = _counts(queue_name)

    def delta() -> dict[str, float]:
        now = _counts(queue_name)
        return {name: now[name] - before[name] for name in COUNTERS}

    received: list = []
    with kombu.Connection(ojs_url(amqp_url), transport_options={"prefix": prefix}) as conn:
        queue = kombu.Queue(queue_name, durable=True)

        def drain_until(predicate, message: str) -> None:
            def step() -> bool:
                try:
                    conn.drain_events(timeout=0.05)
                except TimeoutError:
                    pass
                return predicate()

            wait_until(step, timeout=10, interval=0, message=message)

        with kombu.Consumer(conn.channel(), [queue], callbacks=[lambda body, m: received.append(m)]):
            drain_until(lambda: len(received) == 3, "three job deliveries")
            received[0].ack()
            received[1].reject()
            received[2].requeue()
            drain_until(lambda: delta()["acked"] == 2, "the requeued job's republish to be confirmed and acked")
    assert delta() == {"consumed": 3, "acked": 2, "nacked": 1}


def test_queue_maps_live_only_as_long_as_their_connections(amqp_url):
    """One map per prefix, held by the connections (transports) that use it: not one per prefix forever."""
    tag = uuid.uuid4().hex[:8]
    prefixes = {f"gc{tag}{i}" for i in range(5)}
    conns = [kombu.Connection(ojs_url(amqp_url), transport_options={"prefix": p}) for p in sorted(prefixes)]
    for conn in conns:
        conn.connect()
    assert prefixes <= set(live_prefixes())
    for conn in conns:
        conn.release()
    del conns, conn
    gc.collect()
    assert not prefixes & set(live_prefixes())
