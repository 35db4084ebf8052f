"""A dead letter says why it died: the final failure (error, code, message, attempt, time) in every mode.

``dead_letter_mode="nack"`` (the binding's ``Basic.Nack``: the letter is the delivered message, whose
envelope tells the previous attempt's error) records the final failure in the queue's control stream
before the nack, and the readers join it; ``"republish"`` carries it in the letter itself.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pika
import pytest
from click.testing import CliRunner
from support import message_count, raw_channel, wait_until

from ojs_kombu import DeadLetter, Job, RetryPolicy, Worker, current_job
from ojs_kombu.cli import main
from ojs_kombu.policy.retry import Failure, record_failure
from ojs_kombu.runtime.deadletter import DeadLetterEntry
from ojs_kombu.runtime.settle import failed_message
from ojs_kombu.wire.codec import encode

MODES = ["nack", "republish"]
FAST = RetryPolicy(max_attempts=3, initial_interval="PT0.05S", jitter=False)


def invoke(*argv: str) -> tuple[int, str]:
    with CliRunner().isolation() as (out, _, _):
        code = main(list(argv))
    return code, out.getvalue().decode()


def one_letter(client, amqp_url: str, names, count: int = 1) -> DeadLetterEntry:
    dead_letter_queue = names.dead_letter_queue("default")
    wait_until(lambda: message_count(amqp_url, dead_letter_queue) == count, timeout=20, message=f"{count} letter(s)")
    entries = client.dead_letters("default")
    assert len(entries) == count
    return entries[-1]


def assert_recent(when: datetime | None, since: datetime) -> None:
    assert when is not None and when.tzinfo is not None
    assert since - timedelta(seconds=2) <= when <= datetime.now(UTC) + timedelta(seconds=2)


@pytest.mark.parametrize("mode", MODES)
def test_the_third_failure_is_the_letters(mode, amqp_url, client, names, worker_factory):
    worker: Worker = worker_factory(dead_letter_mode=mode, concurrency=2)

    @worker.handler("flaky.job")
    def flaky() -> None:
        raise RuntimeError(f"fail #{current_job().attempt}")

    worker.start()
    assert worker.wait_until_ready(15)
    since = datetime.now(UTC)
    job = client.enqueue("flaky.job", [], retry=FAST)
    entry = one_letter(client, amqp_url, names)

    assert entry.job is not None and entry.job.id == job.id
    assert entry.error_message == "fail #3"
    assert entry.error_code == "handler_error" and entry.error_type == "RuntimeError"
    assert entry.attempt == 3
    assert_recent(entry.failed_at, since)
    assert entry.reason == ("rejected" if mode == "nack" else "republished")
    if mode == "nack":  # still the binding's Basic.Nack: RabbitMQ's x-death, one death
        assert entry.headers["x-death"][0]["reason"] == "rejected"
    # The earlier failures stay in the history.
    assert [e["message"] for e in entry.job.errors or []][:2] == ["fail #1", "fail #2"]


@pytest.mark.parametrize("mode", MODES)
def test_dead_letter_raised_says_its_message(mode, amqp_url, client, names, worker_factory):
    worker: Worker = worker_factory(dead_letter_mode=mode)

    @worker.handler("blocked.job")
    def blocked() -> None:
        raise DeadLetter("customer 100 is blocked")

    worker.start()
    assert worker.wait_until_ready(15)
    since = datetime.now(UTC)
    job = client.enqueue("blocked.job", [])
    entry = one_letter(client, amqp_url, names)

    assert entry.job is not None and entry.job.id == job.id
    assert (entry.error_code, entry.error_type, entry.error_message) == (
        "handler_error",
        "DeadLetter",
        "customer 100 is blocked",
    )
    assert entry.attempt == 1
    assert_recent(entry.failed_at, since)

    # The CLI shows the same (dlq show, dlq list).
    common = ["--url", amqp_url, "--prefix", names.prefix]
    code, out = invoke("dlq", "show", "default", job.id, "--json", *common)
    assert code == 0, out
    document = json.loads(out.strip().splitlines()[-1])
    assert document["error_message"] == "customer 100 is blocked" and document["error_code"] == "handler_error"
    assert document["error_type"] == "DeadLetter" and document["attempt"] == 1 and document["failed_at"]
    code, out = invoke("dlq", "list", "default", *common)
    assert code == 0 and "customer 100 is blocked" in out


def test_a_replayed_job_that_dies_again_shows_its_new_failure(amqp_url, client, names, worker_factory):
    """The record of a nacked letter is keyed by id, attempt and replay count: a second death at the
    same attempt shows the second failure, never the first."""
    second_life = threading.Event()
    worker: Worker = worker_factory(dead_letter_mode="nack")

    @worker.handler("doomed.job")
    def doomed() -> None:
        raise DeadLetter("second life" if second_life.is_set() else "first life")

    worker.start()
    assert worker.wait_until_ready(15)
    job = client.enqueue("doomed.job", [])
    assert one_letter(client, amqp_url, names).error_message == "first life"
    second_life.set()
    assert client.replay_dead_letters("default") == [job.id]
    entry = one_letter(client, amqp_url, names)
    assert entry.error_message == "second life" and entry.attempt == 1
    # A filter on the error sees the joined failure too.
    select: Callable[[DeadLetterEntry], bool] = lambda e: e.error_message == "second life"  # noqa: E731
    assert [e.letter_id for e in client.dead_letters("default", select=select)] == [job.id]


def test_a_letter_nacked_without_a_record_does_not_show_the_previous_error(amqp_url, client, names):
    """A letter nacked by another consumer (the seed's pika example) has no record: its envelope's
    error is the attempt before, so the final error is unknown rather than wrong; attempt and time
    are the nack's, and the earlier error stays in the history."""
    client.declare_queue("default")
    first = Job.create("flaky.job", [])
    retried = record_failure(first, 1, Failure("handler_error", "RuntimeError", "fail #1"))
    message = failed_message(encode(first), retried, Failure("handler_error", "RuntimeError", "fail #1"))
    since = datetime.now(UTC)
    with raw_channel(amqp_url) as channel:
        channel.confirm_delivery()
        properties = pika.BasicProperties(headers=message.headers, **message.properties)
        channel.basic_publish(names.direct_exchange, "default", message.body, properties, mandatory=True)
        method = None
        while method is None:
            method, _, _ = channel.basic_get(names.job_queue("default"), auto_ack=False)
        channel.basic_nack(method.delivery_tag, requeue=False)  # attempt 2 failed: why, nobody recorded
    entry = one_letter(client, amqp_url, names)
    assert entry.reason == "rejected" and entry.attempt == 2
    assert entry.error_code is None and entry.error_message is None and entry.error_type is None
    assert_recent(entry.failed_at, since)
    assert entry.job is not None and [e["message"] for e in entry.job.errors or []] == ["fail #1"]


def test_a_death_republished_twice_is_listed_and_replayed_once(amqp_url, client, names, worker_factory):
    """A crash between a republished letter's publish and its ack leaves a second letter of the same
    death (same job id, attempt, replay count): listed once, replayed once, both removed."""
    runs: list[str] = []
    failing = threading.Event()
    failing.set()
    worker: Worker = worker_factory(dead_letter_mode="republish")

    @worker.handler("doomed.job")
    def doomed() -> None:
        runs.append(current_job().id)
        if failing.is_set():
            raise DeadLetter("blocked")

    worker.start()
    assert worker.wait_until_ready(15)
    job = client.enqueue("doomed.job", [])
    one_letter(client, amqp_url, names)
    dead_letter_queue = names.dead_letter_queue("default")
    with raw_channel(amqp_url) as channel:  # the second letter the crash would leave
        channel.confirm_delivery()
        method, properties, body = channel.basic_get(dead_letter_queue, auto_ack=False)
        channel.basic_publish(names.dead_letter_exchange, "default", body, properties, mandatory=True)
        channel.basic_nack(method.delivery_tag, requeue=True)
    wait_until(lambda: message_count(amqp_url, dead_letter_queue) == 2, message="two letters of one death")

    (entry,) = client.dead_letters("default")
    assert entry.letter_id == job.id and entry.error_message == "blocked"
    failing.clear()
    assert client.replay_dead_letters("default") == [job.id]
    wait_until(lambda: len(runs) == 2, message="the replayed job ran")
    assert message_count(amqp_url, dead_letter_queue) == 0
    worker.stop(timeout=5)
    assert runs == [job.id, job.id]  # once dead, once replayed: not twice
