"""Client behaviour beyond the conformance table: bad input, batches, threads, connection loss."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from support import get_messages, message_count, wait_until

from ojs_kombu import BrokerConnectionError, Client, Job, RetryPolicy, ValidationError
from ojs_kombu.testing.schema import validate_job


class NotJson:
    """A pickle-able object that is not JSON-native."""


BAD_ENQUEUE_ARGUMENTS = [
    ("type", dict(type="Not A Type")),
    ("type", dict(type="")),
    ("queue", dict(queue="UPPER")),
    ("queue", dict(queue="dlx.email")),
    ("queue", dict(queue="retry.email")),
    ("args", dict(args=[NotJson()])),
    ("args", dict(args=[math.nan])),
    ("args", dict(args=[{1, 2}])),
    ("args", dict(args=[b"bytes"])),
    ("args", dict(args=["x" * (1024 * 1024 + 10)])),
    ("kwargs", dict(kwargs={"when": datetime.now(UTC)})),
    ("meta", dict(meta={"obj": NotJson()})),
    ("timeout", dict(timeout=-1)),
    ("scheduled_at", dict(scheduled_at=datetime(2030, 1, 1))),  # naive
    ("expires_at", dict(expires_at="tomorrow")),
    ("retry", dict(retry={"max_attempts": -1})),
    ("retry", dict(retry={"backoff_coefficient": 0.5})),
    ("retry", dict(retry={"initial_interval": "PT10S", "max_interval": "PT1S"})),
    ("retry", dict(retry={"on_exhaustion": "explode"})),
    ("priority", dict(priority="high")),
    ("tags", dict(tags="not-a-list")),
]


@pytest.mark.parametrize(
    "field,bad", BAD_ENQUEUE_ARGUMENTS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD_ENQUEUE_ARGUMENTS)]
)
def test_bad_enqueue_argument_raises_validation_error_and_publishes_nothing(client, names, field, bad):
    client.declare_queue("email")
    options = dict(type="email.send", args=["a@example.com"], queue="email")
    options.update(bad)
    with pytest.raises(ValidationError) as info:
        client.enqueue(options.pop("type"), options.pop("args"), **options)
    assert info.value.field is not None and info.value.field.split(".")[0].split("[")[0] in (field, "args", "meta")
    assert message_count(client.url, names.job_queue("email")) == 0


def test_enqueue_many_pipelines_and_reports_each_job(client, names):
    jobs = [Job.create("report.build", [i], queue="reports") for i in range(500)]
    results = client.enqueue_many(jobs)
    assert len(results) == 500 and all(r.ok for r in results)
    assert [r.job.id for r in results] == [j.id for j in jobs]
    assert message_count(client.url, names.job_queue("reports")) == 500


def test_enqueue_many_with_an_oversized_job_keeps_the_others(client, names):
    # Job.create refuses oversized envelopes; a job grown after creation is caught at publish.
    grown = Job.create("a.b", [2], queue="mixed").model_copy(update={"args": ["x" * (1024 * 1024)]})
    jobs = [Job.create("a.b", [1], queue="mixed"), grown, Job.create("a.b", [3], queue="mixed")]
    results = client.enqueue_many(jobs)
    assert [r.ok for r in results] == [True, False, True]
    assert isinstance(results[1].error, ValidationError)
    assert message_count(client.url, names.job_queue("mixed")) == 2


def test_emitted_envelopes_validate_against_the_schema(client, names):
    variants = [
        dict(),
        dict(kwargs={"a": 1}, meta={"tenant_id": "acme"}, tags=["x"]),
        dict(retry=RetryPolicy(max_attempts=5, initial_interval=timedelta(seconds=2), on_exhaustion="dead_letter")),
        dict(priority=-10, timeout=30, expires_at=timedelta(hours=1)),
        dict(args=["日本語", {"nested": [1, 2.5, None, True]}]),
    ]
    for options in variants:
        args = options.pop("args", ["a"])
        client.enqueue("schema.check", args, queue="schema", **options)
    received = get_messages(client.url, names.job_queue("schema"), len(variants))
    assert len(received) == len(variants)
    for _, _, body in received:
        validate_job(json.loads(body))


def test_many_threads_share_one_client(client, names):
    errors = []

    def produce(n: int):
        try:
            for i in range(100):
                client.enqueue("thread.job", [n, i], queue="threads")
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert message_count(client.url, names.job_queue("threads")) == 800


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_broker_raises_after_backoff():
    client = Client(f"amqp://guest:guest@127.0.0.1:{_free_port()}//", connect_retries=2)
    started = time.monotonic()
    with pytest.raises(BrokerConnectionError) as info:
        client.enqueue("a.b", [1])
    elapsed = time.monotonic() - started
    # Two back-off sleeps: ~1 s and ~2 s, each ±25 %.
    assert 0.75 + 1.5 <= elapsed < 10
    assert "guest:guest" not in str(info.value)


def test_dropped_connection_is_reestablished(amqp_url, prefix, management, names):
    client = Client(amqp_url, prefix=prefix, connection_name=f"{prefix} dropped")
    client.enqueue("a.b", [1], queue="reconnect")
    ours = wait_until(
        lambda: [
            c
            for c in management.connections()
            if c.get("client_properties", {}).get("connection_name") == f"{prefix} dropped"
        ],
        message="our connection in the management API",
    )
    for connection in ours:
        management.close_connection(connection["name"])
    job = client.enqueue("a.b", [2], queue="reconnect")
    client.close()
    received = get_messages(amqp_url, names.job_queue("reconnect"), 2)
    assert [p.message_id for _, p, _ in received][-1] == job.id


def test_transport_aliases_are_registered():
    import kombu

    assert kombu.Connection("ojs://guest@localhost//").transport_cls == "ojs"
    assert type(kombu.Connection("ojs://guest@localhost//").transport).__name__ == "Transport"
    assert type(kombu.Connection("ojss://guest@localhost//").transport).__name__ == "SSLTransport"


def test_declare_queue_with_scheduling_declares_the_cascade(client, names, management):
    client.declare_queue("later", scheduling=True)
    cascade = client.cascade
    top = management.exchange(cascade.exchange(34))
    assert top is not None and top["type"] == "direct"
    assert top["arguments"] == {"alternate-exchange": cascade.exchange(33)}
    level = management.queue(cascade.queue(12))
    assert level is not None and level["arguments"]["x-message-ttl"] == 4096
    assert level["arguments"]["x-dead-letter-exchange"] == cascade.exchange(11)
    deliveries = management.bindings(source=cascade.delivery_exchange)
    assert [(b["destination"], b["routing_key"]) for b in deliveries] == [(names.job_queue("later"), "later")]
