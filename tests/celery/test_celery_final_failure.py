"""Through Celery (``ojs://``), a dead letter says why it died: the task's last exception, its attempt
and time, recorded before the ``Basic.Nack`` (the transport's one dead-letter mode)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from support import message_count, wait_until

pytestmark = pytest.mark.timeout(120)


def test_the_letter_of_an_exhausted_task_shows_its_last_exception(celery_app, worker_factory, client, amqp_url, names):
    @celery_app.task(name="final.flaky", bind=True, max_retries=2, default_retry_delay=0.05)
    def flaky(self):
        try:
            raise RuntimeError(f"fail #{self.request.retries + 1}")
        except RuntimeError as exc:
            raise self.retry(exc=exc) from None

    @celery_app.task(name="final.blocked")
    def blocked():
        raise PermissionError("customer 100 is blocked")

    since = datetime.now(UTC)
    with worker_factory(celery_app):
        exhausted = flaky.delay()
        with pytest.raises(RuntimeError, match="fail #3"):
            exhausted.get(timeout=30)
        refused = blocked.delay()
        with pytest.raises(PermissionError):
            refused.get(timeout=30)
        wait_until(lambda: message_count(amqp_url, names.dead_letter_queue("celery")) == 2, 20, message="2 letters")
    letters = {entry.letter_id: entry for entry in client.dead_letters("celery")}

    first, second = letters[exhausted.id], letters[refused.id]
    assert first.reason == "rejected" and second.reason == "rejected"  # still Basic.Nack
    assert (first.attempt, first.error_type, first.error_message) == (3, "RuntimeError", "fail #3")
    assert (second.attempt, second.error_type, second.error_message) == (
        1,
        "PermissionError",
        "customer 100 is blocked",
    )
    for entry in (first, second):
        assert entry.error_code == "handler_error"
        assert entry.failed_at is not None and since - timedelta(seconds=2) <= entry.failed_at <= datetime.now(UTC)
