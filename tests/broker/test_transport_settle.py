"""Jobs the ``ojs://`` channel settles itself (through the runtime's Settler) and never hands to the framework."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import kombu
import pika
import pytest
from prometheus_client import REGISTRY
from support import get_messages, message_count, ojs_url, raw_channel, slow_first_call, wait_until

import ojs_celery  # noqa: F401  registers the Celery codec: the jobs below reach kombu as Celery task messages
from ojs_kombu import Client
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import Names
from ojs_kombu.policy.schedule import Cascade
from ojs_kombu.runtime.consumer import Delivery
from ojs_kombu.runtime.settle import Settler
from ojs_kombu.transport import EARLY_TOLERANCE_MS
from ojs_kombu.wire.codec import encode


def _drain(conn: kombu.Connection, seconds: float) -> None:
    """Read the connection for ``seconds`` (the confirms of the channel's republishes arrive this way)."""
    try:
        conn.drain_events(timeout=seconds)
    except TimeoutError:
        pass


def test_an_invalid_envelope_goes_to_the_dead_letter_queue_with_its_error_code(amqp_url, prefix, names):
    queue_name = f"inv{uuid.uuid4().hex[:8]}"
    received: list = []
    with kombu.Connection(ojs_url(amqp_url), transport_options={"prefix": prefix}) as conn:
        queue = kombu.Queue(queue_name, durable=True)
        with kombu.Consumer(conn.channel(), [queue], callbacks=[lambda body, m: received.append(m)]):
            with raw_channel(amqp_url) as channel:
                channel.basic_publish(
                    names.direct_exchange,
                    queue_name,
                    b'{"id": "not a job"}',
                    pika.BasicProperties(content_type="application/openjobspec+json", message_id="bad-1"),
                )
            dead = []

            def dead_lettered() -> bool:
                _drain(conn, 0.05)
                dead.extend(get_messages(amqp_url, names.dead_letter_queue(queue_name), 1, timeout=0.05))
                return bool(dead)

            wait_until(dead_lettered, timeout=10, interval=0, message="the invalid envelope in the DLQ")
    assert received == []
    _, properties, body = dead[0]
    assert body == b'{"id": "not a job"}'
    assert properties.headers["x-ojs-error-code"]
    assert properties.message_id == "bad-1"


def test_a_due_sweep_job_redelivered_deletes_its_workflows_stream_and_cancel_marker_unseen_by_the_framework(
    amqp_url, prefix, names, management
):
    from ojs_kombu import chain
    from ojs_kombu.errors import NotFoundError
    from ojs_kombu.runtime.workflow import sweep_job

    queue_name = f"sw{uuid.uuid4().hex[:8]}"
    with Client(amqp_url, prefix=prefix) as client:
        w = chain(Job.create("step.run", [1], queue=queue_name))
        client.enqueue_workflow(w)
        client.cancel_workflow(w.id)  # declares its cancel marker
        get_messages(amqp_url, names.job_queue(queue_name), 1)  # the workflow's job, out of the way
        sweep = encode(sweep_job(w.id, queue_name, 0))
        with raw_channel(amqp_url) as channel:
            channel.queue_declare(names.workflow_cancel_queue(w.id), passive=True)  # it exists
            channel.basic_publish(
                names.direct_exchange,
                queue_name,
                sweep.body,
                pika.BasicProperties(**sweep.properties, headers=sweep.headers),
            )
        # Taken and not acked: the broker requeues it flagged redelivered (its consumer died), which
        # counts no lost attempt for a sweep job (retried or dead-lettered, it would be seen).
        get_messages(amqp_url, names.job_queue(queue_name), 1, ack=False)
        received: list = []
        with kombu.Connection(ojs_url(amqp_url), transport_options={"prefix": prefix}) as conn:
            queue = kombu.Queue(queue_name, durable=True)
            with kombu.Consumer(conn.channel(), [queue], callbacks=[lambda body, m: received.append(m)]):

                def swept() -> bool:
                    _drain(conn, 0.05)
                    try:
                        client.workflow(w.id)
                    except NotFoundError:
                        return True
                    return False

                wait_until(swept, timeout=10, interval=0, message="the workflow's record stream deleted")
                _drain(conn, 0.1)  # the ack
        assert received == []
        assert message_count(amqp_url, names.job_queue(queue_name)) == 0
        assert message_count(amqp_url, names.dead_letter_queue(queue_name)) == 0
        assert management.queues(names.retry_queue(queue_name, 0)[:-1]) == []  # no attempt counted: not retried
        with raw_channel(amqp_url) as channel, pytest.raises(pika.exceptions.ChannelClosedByBroker):
            channel.queue_declare(names.workflow_cancel_queue(w.id), passive=True)


def test_a_job_delivered_without_a_task_codec_is_refused_loudly_and_kept(amqp_url, prefix, names, monkeypatch):
    """No ``codec`` option, none registered and none installed (no adapter imported, no entry
    point): the delivery raises ``LookupError`` out of the event loop; the job is neither handed on
    nor dead-lettered, and the broker requeues it when the connection closes."""
    monkeypatch.setattr("ojs_kombu.transport.settings._REGISTERED", [])
    monkeypatch.setattr("ojs_kombu.transport.settings.CODEC_ENTRY_POINTS", "ojs_kombu.codecs.none-in-this-test")
    queue_name = f"nc{uuid.uuid4().hex[:8]}"
    with Client(amqp_url, prefix=prefix) as client:
        client.enqueue("no.codec", [1], queue=queue_name)
    received: list = []
    with kombu.Connection(ojs_url(amqp_url), transport_options={"prefix": prefix}) as conn:
        with kombu.Consumer(conn.channel(), [kombu.Queue(queue_name, durable=True)], callbacks=[received.append]):
            with pytest.raises(LookupError, match="no task codec"):
                conn.drain_events(timeout=10)
    assert received == []
    wait_until(
        lambda: message_count(amqp_url, names.job_queue(queue_name)) == 1, timeout=10, message="the job requeued"
    )
    assert message_count(amqp_url, names.dead_letter_queue(queue_name)) == 0


def test_a_redelivered_job_counts_a_lost_worker_and_is_not_run_again(amqp_url, prefix, names):
    """The first consumer dies holding the job; the broker redelivers it (``redelivered``): with one
    attempt allowed, the Settler dead-letters it instead of handing it to the framework again."""
    queue_name = f"rd{uuid.uuid4().hex[:8]}"
    with Client(amqp_url, prefix=prefix) as client:
        job = client.enqueue("lost.worker", [1], queue=queue_name, retry={"max_attempts": 1})
    queue = kombu.Queue(queue_name, durable=True)
    first: list = []
    with kombu.Connection(ojs_url(amqp_url), transport_options={"prefix": prefix}) as conn:
        with kombu.Consumer(conn.channel(), [queue], callbacks=[lambda body, m: first.append(m)]):
            wait_until(lambda: _drain(conn, 0.05) or first, timeout=10, interval=0, message="the first delivery")
    # closed without an ack: the broker requeues it, flagged redelivered
    second: list = []
    with kombu.Connection(ojs_url(amqp_url), transport_options={"prefix": prefix}) as conn:
        with kombu.Consumer(conn.channel(), [queue], callbacks=[lambda body, m: second.append(m)]):
            dead = []

            def dead_lettered() -> bool:
                _drain(conn, 0.05)
                dead.extend(get_messages(amqp_url, names.dead_letter_queue(queue_name), 1, timeout=0.05))
                return bool(dead)

            wait_until(dead_lettered, timeout=10, interval=0, message="the redelivered job in the DLQ")
    assert second == []
    _, properties, _ = dead[0]
    assert properties.message_id == job.id


def test_a_job_delayed_again_is_on_time_however_long_its_cascade_takes_to_declare(amqp_url, prefix, names, monkeypatch):
    """The channel delays an early job again through the Worker's Settler, over its own Settlement:
    the delay is measured after the cascade is declared (made 1.5 s slower here), not before."""
    queue_name = f"early{uuid.uuid4().hex[:8]}"
    received: list[float] = []

    def receive(body, message) -> None:
        received.append(time.time())
        message.ack()

    with kombu.Connection(ojs_url(amqp_url), transport_options={"prefix": prefix}) as conn:
        channel = conn.channel()
        declarations = slow_first_call(monkeypatch, channel.ojs.topology, "ensure_scheduling", 1.5)
        with kombu.Consumer(channel, [kombu.Queue(queue_name, durable=True)], callbacks=[receive]):
            job = Job.create("early.job", [], queue=queue_name, scheduled_at=timedelta(seconds=3))
            message = encode(job)
            with raw_channel(amqp_url) as raw:  # straight into the job queue, 3 s early
                raw.basic_publish(
                    names.direct_exchange,
                    queue_name,
                    message.body,
                    pika.BasicProperties(
                        content_type=message.properties["content_type"], message_id=job.id, headers=message.headers
                    ),
                )
            wait_until(lambda: _drain(conn, 0.05) or received, timeout=15, interval=0, message="the job")
    due = job.scheduled_datetime.timestamp()
    assert declarations and declarations[0] >= 1.5  # the scenario: the re-delay waited for it
    assert due <= received[0] < due + 0.75, received[0] - due


# -- the Settler's parameters for the transport (pure logic: a recording Settlement, no broker) -------


class RecordingSettlement:
    """A :class:`~ojs_kombu.runtime.settle.Settlement` that records what the Settler asks of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def ack(self, delivery: Delivery) -> None:
        self.calls.append(("ack", ""))

    def nack(self, delivery: Delivery, record=None, prepare=None) -> None:
        self.calls.append(("nack", ""))

    def republish(self, delivery, destination, queue, prepare=None) -> None:
        _, exchange, _ = destination() if callable(destination) else destination
        self.calls.append(("republish", exchange))


def _delivery(job: Job) -> Delivery:
    message = encode(job)
    return Delivery(
        message.body, dict(message.properties), dict(message.headers), 1, False, "", job.queue, job.queue, 0
    )


def _settler(**options) -> tuple[Settler, RecordingSettlement]:
    names = Names("unit")
    recorder = RecordingSettlement()
    return Settler(recorder, names, Topology(names), Cascade(names), **options), recorder


@pytest.mark.parametrize(("tolerance_ms", "runs"), [(0, False), (EARLY_TOLERANCE_MS, True)])
def test_a_slightly_early_job_is_run_within_the_tolerance(tolerance_ms, runs):
    """The transport leaves a job less than 1 s early to Celery (which waits for the ETA); the Worker does not."""
    job = Job.create("early.job", [], queue="q", scheduled_at=timedelta(milliseconds=500))
    settler, recorder = _settler(early_tolerance_ms=tolerance_ms)
    assert (settler.triage(_delivery(job)) is not None) is runs
    assert [kind for kind, _ in recorder.calls] == ([] if runs else ["republish"])  # into the cascade


def test_a_job_early_beyond_the_tolerance_goes_back_into_the_cascade():
    job = Job.create("early.job", [], queue="q", scheduled_at=timedelta(minutes=5))
    settler, recorder = _settler(early_tolerance_ms=EARLY_TOLERANCE_MS)
    assert settler.triage(_delivery(job)) is None
    assert [kind for kind, _ in recorder.calls] == ["republish"]


@pytest.mark.parametrize(("discard", "expected"), [(True, [("ack", "")]), (False, [])])
def test_an_expired_job_is_discarded_unless_left_to_the_framework(discard, expected):
    job = Job.create("late.job", [], queue="q", expires_at="2000-01-01T00:00:00.000Z")
    settler, recorder = _settler(discard_expired=discard)
    assert (settler.triage(_delivery(job)) is None) is discard
    assert recorder.calls == expected


@pytest.mark.parametrize(
    ("requeue", "code"), [("reject", "requeued"), ("nack", "requeued"), ("nack multiple", "worker_lost")]
)
def test_a_job_given_back_with_requeue_every_time_ends_in_its_dlq_after_its_attempts(
    amqp_url, prefix, names, requeue, code
):
    """A consumer on ``ojs://`` that gives a job back with ``requeue=True`` every time sees it
    ``max_attempts`` times, then the job is in its DLQ (reason ``rejected``), on every version.
    ``reject`` / ``basic_nack`` of one job are failed attempts (``requeued``), never broker requeues;
    a ``multiple`` nack reaches the broker, and the job, back ``redelivered``, counts a lost attempt
    (``worker_lost``).  Neither relies on the broker counting the return: RabbitMQ 4.3 does not
    count a nack's (docs/cluster.md#the-delivery-limit)."""
    queue_name = f"rq{uuid.uuid4().hex[:8]}"
    retry = {"max_attempts": 3, "initial_interval": "PT0.1S", "backoff_coefficient": 1.0, "jitter": False}
    with Client(amqp_url, prefix=prefix, queue_type="quorum") as client:
        job = client.enqueue("given.back", [1], queue=queue_name, retry=retry)
    attempts: list[int] = []

    def give_back(body, message) -> None:
        attempts.append(message.headers["retries"])
        if requeue == "reject":
            message.requeue()  # kombu: Basic.Reject(requeue=True)
        else:
            message.channel.basic_nack(message.delivery_tag, multiple=requeue == "nack multiple", requeue=True)

    queue = kombu.Queue(queue_name, durable=True)
    dead: list = []
    with kombu.Connection(ojs_url(amqp_url), transport_options={"prefix": prefix, "queue_type": "quorum"}) as conn:
        with kombu.Consumer(conn.channel(), [queue], callbacks=[give_back]):

            def dead_lettered() -> bool:
                _drain(conn, 0.05)
                dead.extend(get_messages(amqp_url, names.dead_letter_queue(queue_name), 1, timeout=0.05))
                return bool(dead)

            wait_until(dead_lettered, timeout=20, interval=0, message="the job in its DLQ")
    assert attempts == [0, 1, 2]  # Celery's retries; a redelivery is settled before the framework sees it
    _, properties, _ = dead[0]
    assert properties.message_id == job.id
    assert properties.headers["x-death"][0]["reason"] == "rejected"  # dead-lettered by the library, not the limit
    assert properties.headers["x-ojs-attempt"] == 3  # the third attempt, dead-lettered when it failed too
    assert properties.headers["x-ojs-error-code"] == code  # the previous attempt's failure


@pytest.mark.parametrize("second", ["basic_reject", "basic_nack"])
def test_a_second_requeue_of_a_job_counts_no_attempt_and_sends_nothing(amqp_url, prefix, names, second):
    """The first ``basic_reject(requeue=True)`` settles the job (retry queue, then ack); a second
    requeue of the same tag is ignored, not a ``Basic.Reject`` of a tag the transport acks (406)."""
    queue_name = f"rr{uuid.uuid4().hex[:8]}"
    retry_queue = names.retry_queue(queue_name, 60_000)
    with Client(amqp_url, prefix=prefix) as client:
        retry = {"max_attempts": 3, "initial_interval": "PT1M", "jitter": False}
        client.enqueue("given.back", [1], queue=queue_name, retry=retry)
    received: list = []

    def acked() -> float:
        return REGISTRY.get_sample_value("ojs_amqp_messages_acked_total", {"queue": queue_name}) or 0.0

    with kombu.Connection(ojs_url(amqp_url), transport_options={"prefix": prefix}) as conn:
        channel = conn.channel()
        with kombu.Consumer(
            channel, [kombu.Queue(queue_name, durable=True)], callbacks=[lambda b, m: received.append(m)]
        ):
            wait_until(lambda: _drain(conn, 0.05) or received, timeout=10, interval=0, message="the delivery")
            channel.basic_reject(received[0].delivery_tag, requeue=True)
            getattr(channel, second)(received[0].delivery_tag, requeue=True)  # before: 406, unknown delivery tag
            wait_until(lambda: _drain(conn, 0.05) or acked() == 1, message="the retry confirmed, the job acked")
            channel.basic_qos(0, 10, False)  # a round trip: it fails if the broker closed the channel
    assert message_count(amqp_url, names.job_queue(queue_name)) == 0  # acked, not requeued
    assert message_count(amqp_url, retry_queue) == 1  # one retry ...
    [(_, properties, _)] = get_messages(amqp_url, retry_queue, 1)
    assert properties.headers["x-ojs-attempt"] == 2  # ... of one failed attempt
