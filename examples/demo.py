"""The main demo: enqueue OJS jobs and run them end to end on RabbitMQ.

    make demo            # provisions a broker when $OJS_AMQP_URL is not set

It enqueues a few jobs with :class:`ojs_kombu.Client` and runs them with an
in-process :class:`ojs_kombu.Worker`:

* ``email.send`` succeeds at once;
* ``report.build`` fails once, goes through the broker's retry queue and succeeds;
* ``reminder.send`` is scheduled two seconds ahead and runs no earlier;
* ``payment.charge`` always fails and ends in the dead letter queue, from
  which the demo lists and replays it.

All entities live under a random prefix and are deleted at the end.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import timedelta

from ojs_kombu import Client, RetryPolicy, Worker, current_job

done = threading.Event()
log: list[str] = []


def say(text: str) -> None:
    print(text, flush=True)
    log.append(text)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    prefix = f"demo{uuid.uuid4().hex[:8]}"
    worker = Worker(queues=["default", "reports"], concurrency=4, prefix=prefix, grace_period=5)
    started = time.monotonic()
    finished: set[str] = set()

    @worker.handler("email.send")
    def send_email(address: str, template: str, *, lang: str = "en") -> None:
        say(f"  email.send    to {address} ({template}, {lang})")
        finished.add("email")

    @worker.handler("report.build")
    def build_report(report_id: int) -> None:
        job = current_job()
        if job.attempt == 1:
            say(f"  report.build  attempt {job.attempt}: failing on purpose")
            raise ConnectionError("warehouse not reachable")
        say(f"  report.build  attempt {job.attempt}: built report {report_id}")
        finished.add("report")

    @worker.handler("reminder.send")
    def send_reminder(user: str) -> None:
        say(f"  reminder.send for {user} after {time.monotonic() - started:.2f}s (scheduled at +2s)")
        finished.add("reminder")

    @worker.handler("payment.charge")
    def charge(amount: int) -> None:
        raise ValueError(f"card declined for {amount}")

    with Client(prefix=prefix) as client:
        print(f"broker: {client!r}")
        with worker:
            say("enqueueing 4 jobs")
            client.enqueue("email.send", ["ada@example.com", "welcome"], kwargs={"lang": "fr"})
            client.enqueue(
                "report.build", [42], queue="reports", retry=RetryPolicy(initial_interval="PT0.5S", jitter=False)
            )
            client.enqueue("reminder.send", ["grace"], scheduled_at=timedelta(seconds=2))
            charge_job = client.enqueue(
                "payment.charge", [1999], retry=RetryPolicy(max_attempts=2, initial_interval="PT0.2S")
            )
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (
                finished >= {"email", "report", "reminder"} and client.dead_letters("default")
            ):
                time.sleep(0.1)
            [dead] = client.dead_letters("default")
            say(
                f"dead letter: {dead.job.type} {dead.job.id == charge_job.id and 'id matches'} "
                f"reason={dead.reason} last error={dead.job.error.message if dead.job.error else None!r}"
            )
            replayed = client.replay_dead_letters("default")
            say(f"replayed {len(replayed)} job(s) from the dead letter queue")
        removed = worker.teardown() + client.teardown()
        say(f"done in {time.monotonic() - started:.1f}s; removed {removed} demo entities")
    missing = {"email", "report", "reminder"} - finished
    if missing:
        raise SystemExit(f"demo failed: {sorted(missing)} did not run")


if __name__ == "__main__":
    main()
