"""Quorum queues end to end on the shared node (DESIGN §16, docs/cluster.md).

A representative subset of the Worker conformance tests (retries, scheduling,
re-delaying, dead-lettering) runs again here with ``queue_type="quorum"``: the
module overrides the ``client`` and ``worker_factory`` fixtures, and the test
functions are the conformance module's own, collected a second time.  The rest
checks what only quorum has: the arguments of every entity, mixed set-ups and
the delivery limit.
"""

from __future__ import annotations

import functools
import logging
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import kombu
import pytest
import test_dead_letters as dead_letters
import test_worker_conformance as conformance
from support import get_messages, message_count, pika_url, rabbitmq_version, raw_channel, wait_until

from ojs_kombu import Client, RetryPolicy, Worker
from ojs_kombu.errors import TopologyConflictError, ValidationError
from ojs_kombu.model.naming import Names
from ojs_kombu.policy.schedule import LEVELS
from ojs_kombu.wire.entities import DEAD_LETTER_DELIVERY_LIMIT, DEFAULT_DELIVERY_LIMIT, QUORUM_ARGUMENTS, QueueOptions


@pytest.fixture
def client(amqp_url: str, prefix: str) -> Iterator[Client]:
    """The conformance tests' Client, with quorum queues."""
    with Client(amqp_url, prefix=prefix, queue_type="quorum") as c:
        yield c


@pytest.fixture
def worker_factory(worker_factory: Callable[..., Worker]) -> Callable[..., Worker]:
    """The conformance tests' workers, with quorum queues."""
    return functools.partial(worker_factory, queue_type="quorum")


# The conformance tests, collected again under the quorum fixtures above.
test_terminal_failure_is_a_nack_into_the_dlq = conformance.test_amqp_009_terminal_failure_is_a_nack_into_the_dlq
test_exponential_retry_through_retry_queues = (
    conformance.test_amqp_017_018_rtr_001_exponential_retry_through_retry_queues
)
test_attempts_one_to_three_then_terminal = conformance.test_rtr_002_013_attempts_one_to_three_then_terminal
test_dead_letter_keeps_its_error = conformance.test_rtr_007_dead_letter_keeps_its_error
test_scheduled_job_not_delivered_before_its_time = (
    conformance.test_amqp_022_del_002_scheduled_job_not_delivered_before_its_time
)
test_short_delay = conformance.test_del_003_short_delay
test_early_delivery_is_delayed_again = conformance.test_early_delivery_is_delayed_again
test_a_job_delayed_again_is_on_time_however_long_its_cascade_takes_to_declare = (
    conformance.test_a_job_delayed_again_is_on_time_however_long_its_cascade_takes_to_declare
)
test_a_retry_is_on_time_however_long_its_retry_queue_takes_to_declare = (
    conformance.test_a_retry_is_on_time_however_long_its_retry_queue_takes_to_declare
)
test_dead_letters_lists_oldest_first_without_removing = (
    dead_letters.test_dead_letters_lists_oldest_first_without_removing
)
test_replay = dead_letters.test_replay_resets_the_attempt_strips_x_death_and_honours_ids_and_limit
test_replay_by_id = dead_letters.test_replay_by_id_holds_a_bounded_window_and_keeps_the_order
test_replay_with_a_limit = dead_letters.test_replay_with_a_limit_stops_at_it_unless_letters_were_passed_over
# Not test_purge_by_ids_removes_exactly_those_and_keeps_the_order: on a quorum DLQ, RabbitMQ 3.10
# returns the letters a browse held (dead_letters(), 41 of them there) in another order.


@pytest.fixture
def start_worker(amqp_url: str, prefix: str) -> Iterator[Callable[..., Worker]]:
    """The dead letter tests' workers (``test_dead_letters.start_worker``), with quorum queues."""
    with dead_letters.worker_starter(amqp_url, prefix, queue_type="quorum") as start:
        yield start


def quorum_queue(management: Any, name: str) -> dict[str, Any]:
    """The management API's view of ``name``, checked to be a durable quorum queue with at-least-once."""
    queue = wait_until(lambda: management.queue(name), timeout=10, message=f"queue {name}")
    assert queue["type"] == "quorum", name
    assert queue["durable"] is True and queue["auto_delete"] is False and queue["exclusive"] is False
    for key, value in QUORUM_ARGUMENTS.items():
        assert queue["arguments"].get(key) == value, (name, queue["arguments"])
    return queue


def test_every_entity_a_job_passes_through_is_quorum(client, worker_factory, management, names):
    """A retried job, a scheduled job and a dead letter: job queue, DLQ, retry queue, every cascade level."""
    ran: list[str] = []

    def handler(kind: str) -> None:
        ran.append(kind)
        if kind == "dead" or (kind == "retry" and ran.count("retry") == 1):
            raise RuntimeError(kind)

    worker = worker_factory()
    worker.handler("q.job", handler)
    worker.start()
    assert worker.wait_until_ready()
    client.enqueue("q.job", ["retry"], retry=RetryPolicy(max_attempts=2, initial_interval="PT0.2S", jitter=False))
    client.enqueue("q.job", ["scheduled"], scheduled_at=timedelta(seconds=1))
    client.enqueue("q.job", ["dead"], retry=RetryPolicy(max_attempts=1))
    wait_until(lambda: sorted(ran) == ["dead", "retry", "retry", "scheduled"], timeout=15, message="every job")
    assert len(get_messages(client.url, names.dead_letter_queue("default"), 1, timeout=10)) == 1

    job_queue = quorum_queue(management, names.job_queue("default"))
    assert job_queue["arguments"] == {
        **QUORUM_ARGUMENTS,
        "x-dead-letter-exchange": names.dead_letter_exchange,
        "x-dead-letter-routing-key": "default",
        "x-delivery-limit": DEFAULT_DELIVERY_LIMIT,
    }
    assert quorum_queue(management, names.dead_letter_queue("default"))["arguments"] == {
        **QUORUM_ARGUMENTS,
        "x-delivery-limit": DEAD_LETTER_DELIVERY_LIMIT,  # browsing a DLQ returns its letters: no limit
    }
    assert quorum_queue(management, names.retry_queue("default", 200))["arguments"] == {
        **QUORUM_ARGUMENTS,
        "x-dead-letter-exchange": names.direct_exchange,
        "x-dead-letter-routing-key": "default",
        "x-message-ttl": 200,
    }
    for level in range(LEVELS):
        arguments = quorum_queue(management, names.schedule_queue(level))["arguments"]
        assert arguments["x-message-ttl"] == 2**level
    # The control and events planes stay streams.
    assert management.queue(names.control_queue("default"))["type"] == "stream"


def test_quorum_refuses_what_would_lose_at_least_once():
    """x-max-priority, drop-head and reject-publish-dlx on quorum are refused before anything is declared."""
    with pytest.raises(ValidationError, match="x-max-priority"):
        QueueOptions(queue_type="quorum", max_priority=10)
    for overflow in ("drop-head", "reject-publish-dlx"):
        with pytest.raises(ValidationError, match="at-least-once"):
            QueueOptions(queue_type="quorum", overflow=overflow)  # type: ignore[arg-type]
    assert QueueOptions(queue_type="quorum", overflow="reject-publish").arguments()["x-overflow"] == "reject-publish"


def declare_classic_cascade(amqp_url: str, prefix: str) -> None:
    """The cascade as a classic deployment declared it before quorum became the default for delays."""
    with Client(amqp_url, prefix=prefix, queue_options=QueueOptions(delay_queue_type=None)) as classic:
        classic.declare_queue("classic", scheduling=True)


def test_a_classic_deployment_waits_in_quorum_queues_and_names_an_old_classic_cascade(
    amqp_url, prefix, names, management, caplog
):
    """The default (issue 30): classic job queue and DLQ, quorum retry queues and cascade levels with
    at-least-once hops.  Over a classic cascade declared before that default, the same Client uses
    it as it is, with one warning naming it and what is lost, never re-declaring it."""
    with Client(amqp_url, prefix=prefix) as client:
        client.declare_queue("fresh", scheduling=True)
        with kombu.Connection(amqp_url) as connection:
            client.topology.ensure_retry_queue(connection.connection, "fresh", 1000)
    assert management.queue(names.job_queue("fresh"))["type"] == "classic"
    assert management.queue(names.dead_letter_queue("fresh"))["type"] == "classic"
    assert quorum_queue(management, names.retry_queue("fresh", 1000))["arguments"] == {
        **QUORUM_ARGUMENTS,
        "x-dead-letter-exchange": names.direct_exchange,
        "x-dead-letter-routing-key": "fresh",
        "x-message-ttl": 1000,
    }
    for level in range(LEVELS):
        assert quorum_queue(management, names.schedule_queue(level))["arguments"]["x-message-ttl"] == 2**level

    old = f"{prefix}.old"  # deleted with the test's prefix
    declare_classic_cascade(amqp_url, old)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ojs_kombu.amqp.topology"), Client(amqp_url, prefix=old) as client:
        client.declare_queue("new", scheduling=True)
        assert len(client.topology.conflicts) == LEVELS
        assert {d.argument for d in client.topology.conflicts[0].differences} >= {"x-queue-type"}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "ojs_kombu.amqp.topology"]
    assert len(warnings) == 1
    assert Names(old).schedule_queue(0) in warnings[0].getMessage()
    assert "at-most-once" in warnings[0].getMessage()
    assert management.queue(Names(old).schedule_queue(0))["type"] == "classic"  # used as it is


def test_existing_classic_cascade_is_used_with_one_warning(amqp_url, prefix, names, worker_factory, management, caplog):
    """Mixed set-up: a classic user declared the shared cascade first; a quorum user schedules through it."""
    declare_classic_cascade(amqp_url, prefix)
    worker = worker_factory(queues=("fresh",))
    ran: list[float] = []
    worker.handler("q.job", lambda: ran.append(time.monotonic()))
    worker.start()
    assert worker.wait_until_ready()
    caplog.clear()
    with (
        caplog.at_level(logging.INFO, logger="ojs_kombu.amqp.topology"),
        Client(amqp_url, prefix=prefix, queue_type="quorum") as client,
    ):
        enqueued = time.monotonic()
        client.enqueue("q.job", queue="fresh", scheduled_at=timedelta(seconds=1))
        wait_until(lambda: ran, timeout=10, message="the scheduled job")
        assert 1.0 - 0.001 <= ran[0] - enqueued
        assert len(client.topology.conflicts) == LEVELS  # each level recorded ...
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "ojs_kombu.amqp.topology"]
    assert len(warnings) == 1  # ... but one warning for the cascade
    assert names.schedule_queue(0) in warnings[0].getMessage()
    assert "at-most-once" in warnings[0].getMessage()
    assert management.queue(names.schedule_queue(0))["type"] == "classic"  # used as it is
    assert quorum_queue(management, names.job_queue("fresh"))


def test_a_classic_user_meeting_a_quorum_cascade_uses_it_without_a_warning(amqp_url, prefix, names, caplog):
    """A classic user of before the quorum default (``delay_queue_type=None``) meets the quorum cascade."""
    with Client(amqp_url, prefix=prefix, queue_type="quorum") as quorum:
        quorum.declare_queue("q", scheduling=True)
    with (
        caplog.at_level(logging.INFO, logger="ojs_kombu.amqp.topology"),
        Client(amqp_url, prefix=prefix, queue_options=QueueOptions(delay_queue_type=None)) as classic,
    ):
        classic.declare_queue("c", scheduling=True)  # nothing is lost: INFO, not WARNING
        assert len(classic.topology.conflicts) == LEVELS
        # The same differences on every version (RabbitMQ 4.x names the absent x-queue-type 'classic').
        differing = {d.argument for d in classic.topology.conflicts[0].differences}
        assert differing == {"x-queue-type", "x-dead-letter-strategy", "x-overflow"}
    records = [r for r in caplog.records if r.name == "ojs_kombu.amqp.topology"]
    assert [r.levelno for r in records] == [logging.INFO]
    assert names.schedule_queue(0) in records[0].getMessage()


def test_existing_classic_cascade_raises_with_on_conflict_raise(amqp_url, prefix):
    declare_classic_cascade(amqp_url, prefix)
    with Client(amqp_url, prefix=prefix, queue_type="quorum", on_conflict="raise") as client:
        with pytest.raises(TopologyConflictError) as raised:
            client.enqueue("q.job", queue="fresh", scheduled_at=timedelta(seconds=1))
    assert raised.value.entity == Names(prefix).schedule_queue(0)  # the first level declared
    assert any(d.argument == "x-queue-type" for d in raised.value.differences)


# What counts towards x-delivery-limit, measured on each version (docs/cluster.md#the-delivery-limit):
# on 3.10.8 and 4.0.5 every return; on 4.3.6 every return but Basic.Nack(requeue=True), which
# raises x-acquired-count instead (rabbitmq-server#15387).
DELIVERY_LIMIT = 2

_HOLD_AND_DIE = """
import sys, time, pika
channel = pika.BlockingConnection(pika.URLParameters(sys.argv[1])).channel()
while channel.basic_get(sys.argv[2], auto_ack=False)[0] is None:
    time.sleep(0.02)
print("holding", flush=True)
time.sleep(60)  # killed here, the delivery unacked
"""


def _enqueue_under_a_limit(amqp_url: str, prefix: str) -> str:
    """One job on a quorum queue with ``x-delivery-limit=2``; returns its id."""
    options = QueueOptions(queue_type="quorum", delivery_limit=DELIVERY_LIMIT)
    with Client(amqp_url, prefix=prefix, queue_options=options) as client:
        return client.enqueue("q.job", [1]).id


def _next_delivery(amqp_url: str, channel: Any, names: Names) -> Any:
    """``Basic.Get`` the job from its queue; None once it is in its dead letter queue instead."""
    while True:
        method, _, _ = channel.basic_get(names.job_queue("default"), auto_ack=False)
        if method is not None:
            return method
        if message_count(amqp_url, names.dead_letter_queue("default")):
            return None
        time.sleep(0.02)


def _hold_and_die(amqp_url: str, names: Names) -> bool:
    """A process takes the job and is SIGKILLed holding it (no Close); False once the job is in its DLQ."""
    with subprocess.Popen(
        [sys.executable, "-c", _HOLD_AND_DIE, pika_url(amqp_url), names.job_queue("default")],
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdout is not None
        try:
            while not message_count(amqp_url, names.dead_letter_queue("default")):
                if select.select([holder.stdout], [], [], 0.05)[0]:
                    return holder.stdout.readline() == "holding\n"
                assert holder.poll() is None, "the holding process ended on its own"
            return False
        finally:
            holder.kill()


def _assert_dead_lettered_at_the_limit(amqp_url: str, names: Names, job_id: str) -> None:
    [(_, properties, _)] = get_messages(amqp_url, names.dead_letter_queue("default"), 1, timeout=10)
    assert properties.message_id == job_id
    assert properties.headers["x-death"][0]["reason"] == "delivery_limit"
    assert message_count(amqp_url, names.job_queue("default")) == 0


@pytest.mark.parametrize("death", ["channel closed", "connection closed", "process killed"])
def test_delivery_limit_dead_letters_a_job_whose_consumer_keeps_dying(amqp_url, prefix, names, death):
    """A delivery still held when its channel or connection goes away is a counted return on every
    version (3.10, 4.0, 4.3): a job that takes its consumer down each time ends in its DLQ at the
    limit, never dropped, never delivered forever.  (A Worker settles a redelivered job as a failed
    attempt first; the limit catches a job that brings the consumer down before that.)"""
    job_id = _enqueue_under_a_limit(amqp_url, prefix)
    deliveries = 0
    while deliveries <= DELIVERY_LIMIT + 1:  # a delivery past the limit would be counted, and fail
        if death == "process killed":
            if not _hold_and_die(amqp_url, names):
                break
        else:
            with raw_channel(amqp_url) as channel:
                if _next_delivery(amqp_url, channel, names) is None:
                    break
                if death == "channel closed":
                    channel.close()
                # "connection closed": raw_channel closes the connection, the delivery unacked
        deliveries += 1
    assert deliveries == DELIVERY_LIMIT + 1  # delivered once, returned twice within the limit
    _assert_dead_lettered_at_the_limit(amqp_url, names, job_id)


@pytest.mark.parametrize("method", ["reject", "nack"])
def test_explicit_requeues_count_towards_the_limit_except_nacks_on_4_3(amqp_url, management, prefix, names, method):
    """``Basic.Reject(requeue=True)`` counts on every version; ``Basic.Nack(requeue=True)`` on 3.10
    and 4.0, not on 4.3 (rabbitmq-server#15387), where a consumer nacking a job keeps it forever.
    The library never requeues a job, so it relies on neither (docs/cluster.md#the-delivery-limit)."""
    counted = method == "reject" or rabbitmq_version(management) < (4, 3)
    job_id = _enqueue_under_a_limit(amqp_url, prefix)
    followed = 4 * DELIVERY_LIMIT  # how many uncounted returns are followed before giving up
    returns = 0
    with raw_channel(amqp_url) as channel:
        while (delivery := _next_delivery(amqp_url, channel, names)) is not None:
            if returns == followed:
                channel.basic_ack(delivery.delivery_tag)
                break
            if method == "reject":
                channel.basic_reject(delivery.delivery_tag, requeue=True)
            else:
                channel.basic_nack(delivery.delivery_tag, requeue=True)
            returns += 1
    if counted:
        assert returns == DELIVERY_LIMIT + 1  # the return past the limit dead-lettered it
        _assert_dead_lettered_at_the_limit(amqp_url, names, job_id)
    else:
        assert returns == followed  # still delivered at four times the limit
        assert message_count(amqp_url, names.dead_letter_queue("default")) == 0
