"""Through Dramatiq, a dead letter says why it died: the final failure, in every ``dead_letter_mode``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dramatiq
import pytest
from frameworks import dramatiq_worker_starter, global_ojs_broker
from support import message_count, wait_until

from ojs_kombu import Client
from ojs_kombu.runtime.deadletter import DeadLetterFilter

pytestmark = pytest.mark.timeout(120)


class Blocked(Exception):
    """Listed in the actor's ``throws``: the message fails at once, no retry."""


@pytest.mark.parametrize("mode", ["nack", "republish"])
def test_the_letters_show_the_last_failure(mode, amqp_url, prefix, names):
    runs: list[int] = []
    with global_ojs_broker(amqp_url, prefix, dead_letter_mode=mode) as broker:

        @dramatiq.actor(queue_name="ff", max_retries=2, min_backoff=10, max_backoff=20)
        def flaky() -> None:
            runs.append(1)
            raise RuntimeError(f"fail #{len(runs)}")

        @dramatiq.actor(queue_name="ff", max_retries=5, throws=(Blocked,))
        def blocked() -> None:
            raise Blocked("customer 100 is blocked")

        since = datetime.now(UTC)
        flaky_message = flaky.send()
        with dramatiq_worker_starter(broker) as start:
            start()
            wait_until(lambda: message_count(amqp_url, names.dead_letter_queue("ff")) == 1, 30, message="flaky")
            blocked_message = blocked.send()
            wait_until(lambda: message_count(amqp_url, names.dead_letter_queue("ff")) == 2, 30, message="blocked")
        with Client(amqp_url, prefix=prefix) as client:
            first, second = client.dead_letters("ff")
            by_message_id = client.dead_letters("ff", select=DeadLetterFilter.of(ids=[flaky_message.message_id]))

    assert len(runs) == 3
    for entry in (first, second):
        assert entry.failed_at is not None and since - timedelta(seconds=2) <= entry.failed_at
        assert entry.reason == ("rejected" if mode == "nack" else "republished")
    assert [e.letter_id for e in by_message_id] == [first.letter_id]  # the letter of flaky_message
    assert (first.attempt, first.error_type, first.error_message) == (3, "RuntimeError", "fail #3")
    assert first.error_code == "handler_error"
    assert (second.attempt, second.error_type, second.error_message) == (1, "Blocked", "customer 100 is blocked")
    assert second.job is not None and blocked_message.message_id != flaky_message.message_id
