"""``ojs_dramatiq.cron``: an actor's message as an OJS cron job, fired by ``ojs-amqp cron run``, run by a Dramatiq worker."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import dramatiq
import pytest
from dramatiq.middleware import CurrentMessage
from support import wait_until

from ojs_dramatiq import cron, cron_job
from ojs_kombu import Client, ValidationError
from ojs_kombu.model.cron import tick_job_id

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
CHILD = "import sys; from ojs_kombu.cli import main; sys.exit(main())"


def test_the_template_is_the_message_the_broker_sends(ojs_broker):
    @dramatiq.actor(queue_name="high_priority", max_retries=2, time_limit=30_000)
    def report(kind, *, fmt="pdf"):
        pass

    definition = cron_job(report, "0 9 * * MON-FRI", "daily", name="daily-report", kwargs={"fmt": "csv"})
    job = ojs_broker.job_for(report.message_with_options(args=("daily",), kwargs={"fmt": "csv"}))
    assert (definition.type, definition.args, definition.queue) == (job.type, job.args, "high-priority")
    assert definition.options["meta"]["kwargs"] == {"fmt": "csv"}
    assert definition.options["meta"]["dramatiq"] == {
        "actor_name": "report"
    }  # no message_id: each tick's is its job id
    assert definition.options["retry"]["max_attempts"] == 3
    assert definition.options["timeout"] == 30
    with pytest.raises(ValidationError) as refused:
        cron_job(report, "61 * * * *", name="bad")
    assert refused.value.field == "cron"


def test_ojs_amqp_cron_run_fires_a_dramatiq_actor(ojs_broker, start_worker, amqp_url, prefix):
    calls: list[tuple[str, str, str]] = []
    lock = threading.Lock()

    @dramatiq.actor(queue_name="periodic")
    def tick(label, *, times=1):
        message = CurrentMessage.get_current_message()
        with lock:
            calls.append((label * times, message.message_id, message.actor_name))

    ojs_broker.add_middleware(CurrentMessage())
    registered = cron(tick, "* * * * * *", "x", name="dramatiq-tick", kwargs={"times": 2})
    assert registered.next_run_at is not None
    start_worker()
    environ = {**os.environ, "OJS_AMQP_URL": amqp_url, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, "cron", "run", "--prefix", prefix, "--log-level", "warning"],
        env=environ,
        text=True,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: len(calls) >= 2, 30, message="two ticks run by the actor")
    finally:
        child.terminate()
        _, stderr = child.communicate(timeout=20)
    assert child.returncode == 0, stderr
    with lock:
        seen = list(calls)
    assert all(call[0] == "xx" and call[2] == "tick" for call in seen)
    ids = [call[1] for call in seen]
    assert len(set(ids)) == len(ids)  # each tick ran once
    for message_id in ids:  # the tick's job id: derived from the cron name and the scheduled second
        scheduled = datetime.fromtimestamp(int(message_id[:8] + message_id[9:13], 16) / 1000, UTC)
        assert scheduled.microsecond == 0
        assert message_id == tick_job_id("dramatiq-tick", scheduled)
    with Client(amqp_url, prefix=prefix) as client:
        (found,) = [c for c in client.crons() if c.name == "dramatiq-tick"]
        assert found.run_count >= 2
