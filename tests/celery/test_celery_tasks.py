"""A real Celery worker on the real broker, over the ``ojs://`` transport (issue 4, Show list)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from celery import chain, chord, group, signals
from celery.exceptions import ChordError, Reject, TaskRevokedError
from celery.worker import state as worker_state
from support import get_messages, message_count, slow_first_call, total_messages, wait_until

from ojs_kombu.amqp.topology import Topology
from ojs_kombu.model.ids import JOB_ID_RE
from ojs_kombu.policy.schedule import LEVELS
from tools.schema import validate_job

pytestmark = pytest.mark.broker


class Recorder:
    """What tasks saw, shared between the worker threads and the test."""

    def __init__(self):
        self.calls: list[dict] = []
        self.lock = threading.Lock()

    def add(self, **seen) -> None:
        with self.lock:
            self.calls.append({**seen, "at": time.monotonic()})

    def __len__(self) -> int:
        return len(self.calls)


def raw_job_messages(amqp_url, queue_name, count=1):
    """Take ``count`` messages off an AMQP queue (test-side inspection with pika)."""
    return get_messages(amqp_url, queue_name, count, timeout=10)


def test_kwargs_unicode_and_wire_format(celery_app, worker_factory, amqp_url, names):
    seen = Recorder()

    @celery_app.task(max_retries=4)
    def greet(name, *, greeting="hello", punctuation="!"):
        seen.add(name=name, greeting=greeting)
        return f"{greeting}, {name}{punctuation}"

    # Nothing consumes yet: inspect the envelope on the wire.
    result = greet.apply_async(("Zoë 🐍",), {"greeting": "grüß dich"}, priority=3)
    [(method, properties, body)] = raw_job_messages(amqp_url, names.job_queue("celery"))
    envelope = json.loads(body)
    validate_job(envelope)
    assert envelope["id"] == result.id == properties.message_id
    assert envelope["type"] == "test_celery_tasks.greet" == properties.type
    assert envelope["args"] == ["Zoë 🐍"]
    assert envelope["meta"]["kwargs"] == {"greeting": "grüß dich"}
    assert envelope["meta"]["celery"]["task"] == "test_celery_tasks.greet"
    assert envelope["priority"] == 3 and properties.priority == 3
    assert properties.content_type == "application/openjobspec+json" and properties.app_id == "ojs"
    assert properties.headers["x-ojs-attempt"] == 1 and properties.headers["x-ojs-max-attempts"] == 5
    assert properties.headers["x-ojs-queue"] == "celery" and method.routing_key == "celery"

    with worker_factory(celery_app):
        result = greet.delay("Zoë 🐍", greeting="grüß dich")
        assert result.get(timeout=20) == "grüß dich, Zoë 🐍!"
        assert greet.apply_async(("José",), {"punctuation": "?"}).get(timeout=20) == "hello, José?"


def test_the_pool_gets_the_payload_the_transport_decoded(celery_app, worker_factory):
    """A job delivery reaches the pool as ``[args, kwargs, embed]``, with no content type to decode
    it by (``ojs_celery.Request``); the task still runs with its arguments."""
    handed: list[tuple[object, object]] = []

    @celery_app.task
    def add(a, b, *, scale=1):
        return (a + b) * scale

    def received(request, **_):
        handed.append((request.content_type, request.body))

    signals.task_received.connect(received, weak=False)
    try:
        with worker_factory(celery_app):
            assert add.delay(2, 3, scale=10).get(timeout=20) == 50
    finally:
        signals.task_received.disconnect(received)
    [(content_type, body)] = handed
    assert content_type is None
    assert isinstance(body, list) and body[:2] == [[2, 3], {"scale": 10}]


def test_camel_case_task_name_round_trips(celery_app, worker_factory, amqp_url, names):
    @celery_app.task(name="Reports.BuildPDF")
    def build_pdf(report_id):
        return f"report-{report_id}.pdf"

    build_pdf.delay(7)
    [(_, properties, body)] = raw_job_messages(amqp_url, names.job_queue("celery"))
    envelope = json.loads(body)
    validate_job(envelope)
    assert envelope["type"] == "reports.build_pdf"
    assert envelope["meta"]["celery"]["task"] == "Reports.BuildPDF"
    with worker_factory(celery_app):
        assert build_pdf.delay(42).get(timeout=20) == "report-42.pdf"


def test_self_retry_countdown_goes_through_the_retry_queue(celery_app, worker_factory, management, names):
    seen = Recorder()

    @celery_app.task(bind=True, max_retries=3)
    def flaky(self):
        seen.add(retries=self.request.retries, attempt=(self.request.headers or {}).get("x-ojs-attempt"))
        if self.request.retries < 2:
            raise self.retry(countdown=0.5, exc=ConnectionError(f"try {self.request.retries}"))
        return "done"

    with worker_factory(celery_app):
        assert flaky.delay().get(timeout=30) == "done"
    assert [c["retries"] for c in seen.calls] == [0, 1, 2]
    assert [c["attempt"] for c in seen.calls] == [1, 2, 3]
    gaps = [b["at"] - a["at"] for a, b in zip(seen.calls, seen.calls[1:], strict=False)]
    assert all(gap >= 0.5 for gap in gaps), gaps  # never early
    retry_queue = management.queue(names.retry_queue("celery", 500))
    assert retry_queue is not None and retry_queue["arguments"]["x-message-ttl"] == 500
    assert retry_queue["arguments"]["x-dead-letter-exchange"] == names.direct_exchange


def test_retry_carries_error_headers_trace_context_and_a_user_given_id(celery_app, worker_factory, amqp_url, names):
    ran = Recorder()

    @celery_app.task(bind=True, max_retries=3)
    def call_upstream(self):
        ran.add(retries=self.request.retries)
        try:
            raise ValueError("upstream said no")
        except ValueError as exc:
            raise self.retry(countdown=30, exc=exc) from exc  # parks the retry in ojs.queue.retry.celery.30000

    with worker_factory(celery_app):
        call_upstream.apply_async(task_id="order-42", headers={"traceparent": TRACEPARENT})
        [(_, properties, body)] = raw_job_messages(amqp_url, names.retry_queue("celery", 30000))
    envelope = json.loads(body)
    validate_job(envelope)
    assert properties.headers["x-ojs-attempt"] == 2 and envelope["attempt"] == 1
    assert properties.headers["x-ojs-max-attempts"] == 4
    assert properties.headers["x-ojs-error-message"] == "upstream said no"
    assert properties.headers["x-ojs-error-code"] == "handler_error"
    assert envelope["error"]["type"] == "ValueError" and envelope["errors"][0]["attempt"] == 1
    assert properties.headers["x-ojs-trace-id"] == TRACEPARENT == envelope["meta"]["traceparent"]
    assert envelope["meta"]["celery"]["id"] == "order-42"  # a user-given id round-trips...
    assert envelope["id"] != "order-42" and envelope["id"] == properties.message_id  # ...beside a UUIDv7


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_autoretry_with_backoff(celery_app, worker_factory, management, names):
    seen = Recorder()

    @celery_app.task(
        bind=True, autoretry_for=(KeyError,), retry_backoff=1, retry_jitter=False, retry_kwargs={"max_retries": 2}
    )
    def lookup(self, key):
        seen.add(retries=self.request.retries)
        if self.request.retries < 2:
            raise KeyError(key)
        return key

    with worker_factory(celery_app):
        assert lookup.delay("k").get(timeout=30) == "k"
    gaps = [b["at"] - a["at"] for a, b in zip(seen.calls, seen.calls[1:], strict=False)]
    assert gaps[0] >= 1.0 and gaps[1] >= 2.0, gaps  # backoff 1 s, then 2 s
    for delay in (1000, 2000):
        assert management.queue(names.retry_queue("celery", delay)) is not None


def test_exhausted_retries_go_to_the_dead_letter_queue(celery_app, worker_factory, amqp_url, names):
    @celery_app.task(bind=True, max_retries=1)
    def doomed(self):
        raise self.retry(countdown=0.1, exc=RuntimeError(f"attempt {self.request.retries + 1}"))

    with worker_factory(celery_app):
        result = doomed.delay()
        with pytest.raises(RuntimeError):
            result.get(timeout=30)
        [(_, properties, body)] = raw_job_messages(amqp_url, names.dead_letter_queue("celery"))
    envelope = json.loads(body)
    assert envelope["id"] == result.id
    assert properties.headers["x-ojs-attempt"] == 2
    assert properties.headers["x-death"][0]["reason"] == "rejected"  # a real Basic.Nack
    assert envelope["errors"][0]["message"] == "attempt 1"


def test_reject(celery_app, worker_factory, amqp_url, names):
    seen = Recorder()

    @celery_app.task(bind=True)
    def reject_for_good(self):
        raise Reject("no thanks", requeue=False)

    @celery_app.task(bind=True)
    def reject_then_succeed(self):
        seen.add(redelivered=self.request.delivery_info.get("redelivered"), retries=self.request.retries)
        if not self.request.delivery_info.get("redelivered"):
            raise Reject("later", requeue=True)
        return "second pass"

    with worker_factory(celery_app):
        result = reject_for_good.delay()
        with pytest.raises(Reject):
            result.get(timeout=20)
        [(_, properties, _)] = raw_job_messages(amqp_url, names.dead_letter_queue("celery"))
        assert properties.headers["x-death"][0]["reason"] == "rejected"
        # requeue=True never requeues: a counted attempt through the retry queue.
        assert reject_then_succeed.delay().get(timeout=30) == "second pass"
    assert [(c["redelivered"], c["retries"]) for c in seen.calls] == [(False, 0), (True, 1)]


def test_countdown_is_never_early_and_nothing_waits_unacked(celery_app, worker_factory, amqp_url, names):
    seen = Recorder()

    @celery_app.task
    def later(sent_at):
        seen.add(sent_at=sent_at, ran_at=time.time())
        return "ran"

    cascade = [names.schedule_queue(level) for level in range(LEVELS)]  # lowest first: see total_messages
    with worker_factory(celery_app):
        start = time.time()
        result = later.apply_async((start,), countdown=6)
        eta_result = later.apply_async((start,), eta=datetime.now(UTC) + timedelta(seconds=6))
        # Both wait *ready* in the broker's scheduling cascade (exact counts, not the management
        # API's lagging statistics): not delivered, so not held unacked by any worker.
        wait_until(lambda: total_messages(amqp_url, cascade) == 2, timeout=5, message="both jobs in the cascade")
        assert message_count(amqp_url, names.job_queue("celery")) == 0
        assert len(seen) == 0
        assert not worker_state.reserved_requests  # not held in the worker's memory
        assert result.get(timeout=20) == "ran" and eta_result.get(timeout=20) == "ran"
    assert len(seen) == 2
    for call in seen.calls:
        assert call["ran_at"] - call["sent_at"] >= 6.0


def test_an_eta_is_on_time_however_long_the_cascade_takes_to_declare(celery_app, worker_factory, monkeypatch):
    """The producer measures an ETA's delay after it has declared the cascade (made 1.5 s slower
    here: a fresh cascade takes up to ~1 s on a loaded RabbitMQ 4.3), not before."""
    seen = Recorder()

    @celery_app.task
    def later():
        seen.add(ran_at=time.time())

    declarations = slow_first_call(monkeypatch, Topology, "ensure_scheduling", 1.5)
    with worker_factory(celery_app):
        eta = datetime.now(UTC) + timedelta(seconds=3)
        later.apply_async(eta=eta).get(timeout=20)
    assert declarations and declarations[0] >= 1.5  # the scenario: the publish waited for it
    late = seen.calls[0]["ran_at"] - eta.timestamp()
    assert 0 <= late < 0.75, late


def test_a_retry_is_on_time_however_long_its_retry_queue_takes_to_declare(celery_app, worker_factory, monkeypatch):
    """A retry's ladder step is chosen for the time left until its ETA once its queue is declared
    (made 0.8 s slower here): the 1 s countdown does not become 1.8 s."""
    seen = Recorder()

    @celery_app.task(bind=True, max_retries=1)
    def flaky(self):
        seen.add(retries=self.request.retries)
        if self.request.retries == 0:
            raise self.retry(countdown=1, exc=RuntimeError("once"))
        return "ok"

    declarations = slow_first_call(monkeypatch, Topology, "ensure_retry_queue", 0.8)
    with worker_factory(celery_app):
        assert flaky.delay().get(timeout=20) == "ok"
    assert declarations and declarations[0] >= 0.8
    gap = seen.calls[1]["at"] - seen.calls[0]["at"]
    assert 1.0 - 0.01 <= gap < 1.4, gap


def test_expires(celery_app, worker_factory):
    release = threading.Event()

    @celery_app.task
    def block():
        release.wait(10)

    @celery_app.task
    def add(x, y):
        return x + y

    with worker_factory(celery_app, concurrency=1):
        block.delay()
        expired = add.apply_async((1, 1), expires=1)
        time.sleep(1.5)
        release.set()
        with pytest.raises(TaskRevokedError):
            expired.get(timeout=20)
        assert add.apply_async((2, 2), expires=60).get(timeout=20) == 4


def test_chain_group_and_link_error(celery_app, worker_factory):
    errors = Recorder()

    @celery_app.task
    def add(x, y):
        return x + y

    @celery_app.task
    def mul(x, y):
        return x * y

    @celery_app.task
    def explode(x):
        raise ValueError(f"cannot handle {x}")

    @celery_app.task
    def on_error(request, exc, traceback):
        errors.add(task_id=request.id, exc=str(exc))

    with worker_factory(celery_app):
        assert chain(add.s(1, 2), mul.s(10), add.s(5)).delay().get(timeout=30) == 35
        assert group(add.s(i, i) for i in range(5)).delay().get(timeout=30) == [0, 2, 4, 6, 8]
        failing = explode.apply_async((3,), link_error=on_error.s())
        with pytest.raises(ValueError):
            failing.get(timeout=20)
        wait_until(lambda: len(errors) == 1, timeout=20, message="the errback")
    assert errors.calls[0]["task_id"] == failing.id and "cannot handle 3" in errors.calls[0]["exc"]


def test_chain_and_group_members_get_uuid7_ids_and_run(celery_app, worker_factory):
    ran = Recorder()

    @celery_app.task(bind=True)
    def add(self, x, y):
        ran.add(task_id=self.request.id)
        return x + y

    @celery_app.task(bind=True)
    def mul(self, x, y):
        ran.add(task_id=self.request.id)
        return x * y

    with worker_factory(celery_app):
        result = chain(add.s(1, 2), mul.s(10)).delay()
        assert result.get(timeout=30) == 30
        members = [result.parent.id, result.id]
        grouped = group(add.s(i, i) for i in range(2)).delay()
        assert grouped.get(timeout=30) == [0, 2]
    ids = [*members, *(r.id for r in grouped.results), grouped.id]
    assert all(JOB_ID_RE.fullmatch(i) and uuid.UUID(i).version == 7 for i in ids), ids
    assert sorted(c["task_id"] for c in ran.calls) == sorted(ids[:4])  # the ids the tasks ran under


def test_chords_with_the_redis_result_backend(celery_redis_app, worker_factory):
    app = celery_redis_app

    @app.task(name="chords.add")
    def add(x, y):
        return x + y

    @app.task(name="chords.total")
    def total(values):
        return sum(values)

    @app.task(name="chords.explode")
    def explode(x):
        raise ValueError(f"cannot handle {x}")

    with worker_factory(app):
        assert chord(add.s(i, i) for i in range(5))(total.s()).get(timeout=30) == 20
        # A group followed by a task inside a chain is upgraded to a chord.
        assert chain(add.s(1, 1), group(add.s(1), add.s(2)), total.s()).delay().get(timeout=30) == 7
        # A failing header task fails the body with a ChordError naming the cause.
        body = chord([add.s(1, 1), explode.s(3)])(total.s())
        error = body.get(timeout=30, propagate=False)
        assert body.state == "FAILURE" and isinstance(error, ChordError) and "cannot handle 3" in str(error)


def test_priority(celery_app, worker_factory, management, names):
    celery_app.conf.task_queue_max_priority = 10
    order = Recorder()

    @celery_app.task
    def record(label):
        order.add(label=label)

    for label, priority in (("low", 1), ("high", 9), ("mid", 5)):
        record.apply_async((label,), priority=priority)
    queue = management.queue(names.job_queue("celery"))
    assert queue["arguments"]["x-max-priority"] == 10
    with worker_factory(celery_app, concurrency=1):
        wait_until(lambda: len(order) == 3, timeout=20, message="three tasks")
    assert [c["label"] for c in order.calls] == ["high", "mid", "low"]
