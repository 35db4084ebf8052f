"""Client behaviour beyond the conformance table: bad input, batches, threads, connection loss."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest
from support import get_messages, message_count, wait_until

from ojs_kombu import BrokerConnectionError, Client, Job, RetryPolicy, ValidationError
from ojs_kombu.client import DEFAULT_PUBLISH_TIMEOUT
from tools.schema import validate_job


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


def test_enqueue_many_with_a_job_json_cannot_carry_keeps_the_others(client, names):
    # A job copied without validation may hold a value JSON cannot carry: its encode (done as the
    # batch is published) fails with a typed error for that job alone, after the jobs before it.
    broken = Job.create("a.b", [2], queue="mixed").model_copy(update={"args": [{1, 2}]})
    jobs = [Job.create("a.b", [1], queue="mixed"), broken, Job.create("a.b", [3], queue="mixed")]
    results = client.enqueue_many(jobs)
    assert [r.ok for r in results] == [True, False, True]
    assert isinstance(results[1].error, ValidationError) and "cannot be encoded as JSON" in str(results[1].error)
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


class DelayedProxy:
    """A local port that refuses connections for ``opens_after`` seconds (a broker that is down),
    then forwards every connection to ``target`` (the broker is back)."""

    def __init__(self, target: tuple[str, int], opens_after: float):
        self.target = target
        self.opens_after = opens_after
        self.port = _free_port()
        self.opened_at: float | None = None
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.started_at = time.monotonic()
        self._thread.start()

    def _serve(self) -> None:
        if self._stop.wait(self.opens_after):
            return
        with socket.create_server(("127.0.0.1", self.port)) as listener:
            self.opened_at = time.monotonic()
            listener.settimeout(0.1)
            while not self._stop.is_set():
                try:
                    downstream, _ = listener.accept()
                except TimeoutError:
                    continue
                upstream = socket.create_connection(self.target)
                self._sockets += [downstream, upstream]
                for source, sink in ((downstream, upstream), (upstream, downstream)):
                    threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self._sockets:
            sock.close()


SECRET = "s3cret-not-in-messages"


def test_enqueue_with_the_broker_down_gives_up_within_the_budget():
    client = Client(f"amqp://guest:{SECRET}@127.0.0.1:{_free_port()}//")
    started = time.monotonic()
    with pytest.raises(BrokerConnectionError) as info:
        client.enqueue("a.b", [1])
    elapsed = time.monotonic() - started
    # It keeps trying (back-off ~1 s, ~2 s, then what is left) until the budget is spent, not ~31 s.
    assert DEFAULT_PUBLISH_TIMEOUT - 0.5 <= elapsed < DEFAULT_PUBLISH_TIMEOUT + 2.0
    assert SECRET not in str(info.value) and "guest:***@127.0.0.1" in str(info.value)
    assert "attempts" in str(info.value)


@pytest.mark.parametrize(
    "options,low,high",
    [
        pytest.param({"publish_timeout": 1.0}, 0.9, 2.5, id="publish_timeout"),
        pytest.param({"connect_retries": 0}, 0.0, 0.5, id="connect_retries-0"),
        pytest.param({"connect_retries": 2, "publish_timeout": None}, 0.75 + 1.5, 5.0, id="connect_retries-2"),
    ],
)
def test_publish_timeout_and_connect_retries_bound_the_retries(options, low, high):
    client = Client(f"amqp://guest:guest@127.0.0.1:{_free_port()}//", **options)
    started = time.monotonic()
    with pytest.raises(BrokerConnectionError):
        client.enqueue("a.b", [1])
    assert low <= time.monotonic() - started < high


def test_a_broker_back_within_the_budget_still_gets_the_job(amqp_url, prefix, names):
    broker = urlsplit(amqp_url)
    proxy = DelayedProxy((broker.hostname or "127.0.0.1", broker.port or 5672), opens_after=1.5)
    try:
        with Client(f"amqp://guest:guest@127.0.0.1:{proxy.port}//", prefix=prefix) as client:
            job = client.enqueue("a.b", [1], queue="comeback")
            enqueued_at = time.monotonic()
    finally:
        proxy.close()
    assert proxy.opened_at is not None and enqueued_at > proxy.opened_at  # it had to wait for the broker
    assert enqueued_at - proxy.started_at < DEFAULT_PUBLISH_TIMEOUT
    [(_, properties, _)] = get_messages(amqp_url, names.job_queue("comeback"), 1)
    assert properties.message_id == job.id


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
