"""The control plane with real Dramatiq workers (issue 11): ``OjsBroker.cancel`` before and while
running, cooperative cancels, pause and resume, and the lifecycle events of the adapter."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import dramatiq
import pytest
from frameworks import dramatiq_worker, global_ojs_broker
from support import message_count, raw_channel, wait_until
from test_dramatiq_worker import Recorder

from ojs_dramatiq import OjsBroker, OjsRunning, current_cancelled, job_id_for
from ojs_kombu import Cancelled, Client, OjsError, ValidationError
from ojs_kombu.observability.metrics import METRICS
from ojs_kombu.runtime.lifecycle import JobEvent
from ojs_kombu.runtime.settle import Settler

pytestmark = pytest.mark.timeout(120)


def cancelled_count(queue: str, state: str) -> float:
    return METRICS.jobs_cancelled.labels(queue, state)._value.get()


def consumers(amqp_url: str, queue: str) -> int:
    """Consumers of ``queue`` right now (passive declare, exact)."""
    with raw_channel(amqp_url) as channel:
        return channel.queue_declare(queue, passive=True).method.consumer_count


def assert_nothing_left(broker: OjsBroker, queue_name: str) -> None:
    """Nothing of ``queue_name`` is ready, retrying, scheduled, dead-lettered or in flight (exact counts)."""
    wait_until(
        lambda: broker.get_queue_message_counts(queue_name) == (0, 0, 0) and broker.in_flight(queue_name) == 0,
        20,
        message=f"nothing left of {queue_name}",
    )


class Seen(dramatiq.Middleware):
    """Records the id of every message a worker thread takes (``before_process_message``).

    Added before ``OjsRunning``, so it also sees the messages that one skips: a message cancelled
    before it was delivered must be dropped on delivery, before any Dramatiq middleware sees it.
    """

    def __init__(self, broker: OjsBroker):
        self.ids: list[str] = []
        broker.add_middleware(self, before=OjsRunning)

    def before_process_message(self, broker, message):
        self.ids.append(message.message_id)


@pytest.fixture
def other_broker(amqp_url: str, prefix: str) -> Iterator[OjsBroker]:
    """A second OjsBroker on the same prefix: another worker process, as far as the broker can tell."""
    broker = OjsBroker(amqp_url, prefix=prefix)
    yield broker
    broker.close()


def test_cancel_validates_before_publishing(ojs_broker):
    with pytest.raises(ValidationError):
        ojs_broker.cancel("", queue_name="default")
    with pytest.raises(ValidationError):
        ojs_broker.cancel("4f1c0c7e-1b1e-4a8a-9a52-0f6f0d1e2a3b", queue_name="control.default")
    with pytest.raises(ValidationError):
        ojs_broker.pause("retry.x")


def test_a_queued_message_cancelled_with_two_workers_consuming_never_runs(ojs_broker, other_broker, amqp_url, names):
    release, ran = threading.Event(), Recorder()

    def define(broker: OjsBroker) -> tuple[dramatiq.Actor, dramatiq.Actor]:
        def block():
            ran.add("block")
            release.wait(30)

        def work(label):
            ran.add(label)

        return dramatiq.actor(block, broker=broker), dramatiq.actor(work, broker=broker)

    block, work = define(ojs_broker)
    define(other_broker)
    seen = [Seen(ojs_broker), Seen(other_broker)]
    # One thread each and Dramatiq's prefetch of 2 per thread: four blockers fill both workers.
    with dramatiq_worker(ojs_broker, worker_threads=1), dramatiq_worker(other_broker, worker_threads=1):
        for _ in range(4):
            block.send()
        ran.wait(2)
        wait_until(lambda: message_count(amqp_url, names.job_queue("default")) == 0, message="blockers taken")
        target = work.send("target")
        before = cancelled_count("default", "pending")
        ojs_broker.cancel(target.message_id, queue_name="default")
        wait_until(
            lambda: all(b.cancellations.is_cancelled(target.message_id) for b in (ojs_broker, other_broker)),
            message="both workers know the cancel",
        )
        work.send("sentinel")
        release.set()
        wait_until(lambda: "sentinel" in ran.calls, message="the sentinel message")
        wait_until(lambda: cancelled_count("default", "pending") == before + 1, message="the cancelled one dropped")
        assert "target" not in ran.calls
        assert all(target.message_id not in s.ids for s in seen)
        assert_nothing_left(ojs_broker, "default")


def test_a_message_cancelled_by_its_ojs_job_id_never_runs(ojs_broker, start_worker, client: Client):
    """Any OJS producer may cancel: ``Client.cancel`` names the job id, not the Dramatiq message id."""
    ran = Recorder()

    @dramatiq.actor(queue_name="by-job-id")
    def work(label):
        ran.add(label)

    seen = Seen(ojs_broker)
    target = work.send("target")
    client.cancel(job_id_for(target.message_id, target.message_timestamp), queue="by-job-id")
    work.send("sentinel")
    start_worker()
    assert ran.wait(1) == ["sentinel"]
    assert_nothing_left(ojs_broker, "by-job-id")
    assert ran.calls == ["sentinel"]
    assert target.message_id not in seen.ids


def test_a_delayed_message_cancelled_never_runs_on_a_worker_started_after(ojs_broker, start_worker):
    ran = Recorder()

    @dramatiq.actor(queue_name="later")
    def later(label):
        ran.add(label)

    seen = Seen(ojs_broker)
    target = later.send_with_options(args=("target",), delay=5000)
    later.send_with_options(args=("sentinel",), delay=5500)
    ojs_broker.cancel(target.message_id, queue_name="later")
    before = cancelled_count("later", "pending")
    start_worker()
    assert ran.wait(1, timeout=30) == ["sentinel"]
    assert cancelled_count("later", "pending") == before + 1  # dropped when due, before the sentinel ran
    assert_nothing_left(ojs_broker, "later")
    assert ran.calls == ["sentinel"]
    assert target.message_id not in seen.ids


def test_a_message_waiting_in_a_retry_queue_and_cancelled_does_not_run_again(ojs_broker, start_worker):
    ran = Recorder()

    @dramatiq.actor(queue_name="flaky", max_retries=3, min_backoff=2000, max_backoff=4000)
    def flaky():
        ran.add(time.monotonic())
        raise RuntimeError("fail on purpose")

    seen = Seen(ojs_broker)
    start_worker()
    before = cancelled_count("flaky", "pending")
    message = flaky.send()
    ran.wait(1)
    # Cancel once the first attempt is settled and the message waits in its retry queue (a cancel
    # during the attempt would be a cancel of a running message: the next test).
    wait_until(lambda: ojs_broker.get_queue_message_counts("flaky") == (0, 1, 0), 20, message="the retry waiting")
    ojs_broker.cancel(message.message_id, queue_name="flaky")
    wait_until(lambda: cancelled_count("flaky", "pending") == before + 1, 20, message="the retry dropped")
    assert len(ran.calls) == 1
    assert seen.ids == [message.message_id]  # the first attempt only
    assert_nothing_left(ojs_broker, "flaky")


class BlockingHandler(logging.Handler):
    """Holds Dramatiq's "Failed to process message" error log (written between the actor's raise and
    the after-hooks) until released, and tells when it started holding."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.holding, self.unblock = threading.Event(), threading.Event()

    def emit(self, record):
        if "Failed to process message" in record.getMessage():
            self.holding.set()
            self.unblock.wait(30)


def test_a_cancel_while_dramatiq_logs_the_actors_failure_does_not_kill_the_worker_thread(ojs_broker, start_worker):
    """Dramatiq formats and logs the actor's exception before the after-hooks run: a cancel read then
    must not raise in Dramatiq's own code (the thread would die and the message never be settled).
    The message is settled as cancelled (no retry), and the same single thread runs the next one."""
    ran = Recorder()

    @dramatiq.actor(queue_name="window", max_retries=3, min_backoff=100, max_backoff=100)
    def fails():
        ran.add("fails")
        raise RuntimeError("fail on purpose")

    @dramatiq.actor(queue_name="window")
    def after():
        ran.add("after")

    handler = BlockingHandler()
    dramatiq_logger = logging.getLogger("dramatiq")
    dramatiq_logger.addHandler(handler)
    try:
        before = cancelled_count("window", "running")
        start_worker(worker_threads=1)
        message = fails.send()
        assert handler.holding.wait(20), "Dramatiq never logged the failure"
        ojs_broker.cancel(message.message_id, queue_name="window")
        # The reader has the cancel (its event is set) while the thread is still held in the logging.
        wait_until(lambda: ojs_broker.cancellations.is_cancelled(message.message_id), 10, message="the cancel read")
        handler.unblock.set()
        wait_until(lambda: cancelled_count("window", "running") == before + 1, 20, message="settled cancelled")
        after.send()
        assert ran.wait(2) == ["fails", "after"]  # the one worker thread survived; no retry of fails
    finally:
        handler.unblock.set()
        dramatiq_logger.removeHandler(handler)
    assert_nothing_left(ojs_broker, "window")


def test_a_prefetched_message_cancelled_before_a_thread_takes_it_never_runs(ojs_broker, start_worker, amqp_url, names):
    """Delivered already (Dramatiq's prefetch buffer) when the cancel arrives: skipped, acked."""
    release, ran = threading.Event(), Recorder()

    @dramatiq.actor(queue_name="buffered")
    def block():
        ran.add("block")
        release.wait(30)

    @dramatiq.actor(queue_name="buffered")
    def work(label):
        ran.add(label)

    start_worker(worker_threads=1)  # prefetch 2: the blocker runs, the target waits in the worker
    block.send()
    ran.wait(1)
    target = work.send("target")
    wait_until(lambda: ojs_broker.in_flight("buffered") == 2, message="the target prefetched")
    before = cancelled_count("buffered", "pending")
    ojs_broker.cancel(target.message_id, queue_name="buffered")
    wait_until(lambda: ojs_broker.cancellations.is_cancelled(target.message_id), message="the cancel read")
    work.send("sentinel")
    release.set()
    wait_until(lambda: "sentinel" in ran.calls, message="the sentinel message")
    assert cancelled_count("buffered", "pending") == before + 1
    assert "target" not in ran.calls
    assert_nothing_left(ojs_broker, "buffered")
    assert message_count(amqp_url, names.dead_letter_queue("buffered")) == 0


def test_a_busy_actor_is_interrupted_within_a_second_and_the_worker_goes_on(ojs_broker, start_worker, caplog):
    caplog.set_level(logging.INFO, logger="dramatiq")
    started, interrupted, ran, events = threading.Event(), Recorder(), Recorder(), Recorder()
    ojs_broker.lifecycle.subscribe(events.add)
    exhausted = Recorder()

    @dramatiq.actor(queue_name="busy")
    def on_exhausted(message_data, retry_info):
        exhausted.add(message_data["message_id"])

    @dramatiq.actor(queue_name="busy", max_retries=3, min_backoff=100, on_retry_exhausted=on_exhausted.actor_name)
    def busy():
        n = 0
        try:  # started.set() inside: the interruption may land in it
            started.set()
            while True:
                n += 1
        except Cancelled:
            interrupted.add(time.monotonic())
            raise

    @dramatiq.actor(queue_name="busy")
    def work(label):
        ran.add(label)

    start_worker(worker_threads=1)
    before = cancelled_count("busy", "running")
    message = busy.send()
    assert started.wait(10)
    cancelled_at = time.monotonic()
    ojs_broker.cancel(message.message_id, queue_name="busy")
    (interrupted_at,) = interrupted.wait(1, timeout=5)
    assert interrupted_at - cancelled_at < 1.0
    started.clear()
    work.send("after")  # the same (only) worker thread runs it
    assert ran.wait(1) == ["after"]
    assert cancelled_count("busy", "running") == before + 1
    # Never retried: a second attempt (backoff 100-200 ms) would set `started` again.
    assert not started.wait(1.5)
    assert_nothing_left(ojs_broker, "busy")
    assert exhausted.calls == []
    busy_events = [e.event for e in events.calls if isinstance(e, JobEvent) and e.job_type == "busy"]
    assert busy_events == ["started", "cancelled"]
    # Dramatiq's worker logs the interruption as expected (INFO), not as an unhandled exception (ERROR).
    about = [r for r in caplog.records if r.name.startswith("dramatiq.worker") and "busy()" in r.getMessage()]
    assert any(r.levelno == logging.INFO and "expected exception Cancelled" in r.getMessage() for r in about)
    assert not [r for r in about if r.levelno >= logging.ERROR]


def test_a_retries_middleware_added_later_does_not_retry_a_cancelled_message(amqp_url, prefix):
    """``OjsRunning`` stays last whatever is added after the broker is made (its after-hook must run first)."""
    started, ran = threading.Event(), Recorder()
    with global_ojs_broker(amqp_url, prefix, middleware=[]) as broker:
        broker.add_middleware(dramatiq.middleware.Retries(max_retries=3, min_backoff=100, max_backoff=200))
        assert isinstance(broker.middleware[-1], OjsRunning)

        @dramatiq.actor(queue_name="late-retries")
        def busy():
            try:
                started.set()
                while True:
                    pass
            except Cancelled:
                ran.add("interrupted")
                raise

        with dramatiq_worker(broker, worker_threads=1):
            assert isinstance(broker.middleware[-1], OjsRunning)  # after the worker's own middleware too
            before = cancelled_count("late-retries", "running"), cancelled_count("late-retries", "pending")
            message = busy.send()
            assert started.wait(10)
            started.clear()
            broker.cancel(message.message_id, queue_name="late-retries")
            assert ran.wait(1, timeout=5) == ["interrupted"]
            assert not started.wait(1.0), "retried"  # a retry would run after 100-200 ms
            assert_nothing_left(broker, "late-retries")
            # Acked where it ran; not published to a retry queue first (and dropped from there).
            after = cancelled_count("late-retries", "running"), cancelled_count("late-retries", "pending")
            assert after == (before[0] + 1, before[1])


def test_a_cooperative_actor_sees_its_cancelled_event_within_a_second(amqp_url, prefix):
    """The actor stops by raising: the message is acked all the same, and ``Retries`` (out of
    retries here) neither dead-letters it nor sends ``on_retry_exhausted``."""
    started, seen, exhausted = threading.Event(), Recorder(), Recorder()
    with global_ojs_broker(amqp_url, prefix, cancel_running="cooperative") as broker:

        @dramatiq.actor(queue_name="polite")
        def on_exhausted(message_data, retry_info):
            exhausted.add(message_data["message_id"])

        @dramatiq.actor(queue_name="polite", max_retries=0, on_retry_exhausted=on_exhausted.actor_name)
        def polite():
            cancelled = current_cancelled()
            started.set()
            while not cancelled.wait(0.01):
                pass
            seen.add(time.monotonic())
            raise RuntimeError("stopping: cancelled")

        with dramatiq_worker(broker, worker_threads=1):
            before = cancelled_count("polite", "running")
            message = polite.send()
            assert started.wait(10)
            cancelled_at = time.monotonic()
            broker.cancel(message.message_id, queue_name="polite")
            (seen_at,) = seen.wait(1, timeout=5)
            assert seen_at - cancelled_at < 1.0
            wait_until(lambda: cancelled_count("polite", "running") == before + 1, message="counted as cancelled")
            assert_nothing_left(broker, "polite")
            assert exhausted.calls == []


def test_current_cancelled_outside_an_actor_raises():
    with pytest.raises(OjsError):
        current_cancelled()


def test_pause_stops_deliveries_and_resume_restarts_them(ojs_broker, start_worker, amqp_url, names):
    ran = Recorder()

    @dramatiq.actor(queue_name="pausable")
    def work(label):
        ran.add(label)

    start_worker()
    job_queue = names.job_queue("pausable")
    work.send("before")
    assert ran.wait(1) == ["before"]
    assert consumers(amqp_url, job_queue) == 1

    ojs_broker.pause("pausable")
    paused_at = time.monotonic()
    wait_until(lambda: consumers(amqp_url, job_queue) == 0, timeout=1.0, message="Basic.Cancel of the consumer")
    assert time.monotonic() - paused_at < 1.0
    assert "pausable" in ojs_broker.paused

    for n in range(3):
        work.send(n)
    # Proving an absence needs a window; every check in it is exact.
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert message_count(amqp_url, job_queue) == 3 and consumers(amqp_url, job_queue) == 0
        assert ran.calls == ["before"]
        time.sleep(0.1)

    ojs_broker.resume("pausable")
    assert sorted(ran.wait(4)[1:]) == [0, 1, 2]
    assert "pausable" not in ojs_broker.paused
    assert_nothing_left(ojs_broker, "pausable")


def test_a_pause_holds_for_a_worker_started_later(ojs_broker, start_worker, amqp_url, names):
    ran = Recorder()

    @dramatiq.actor(queue_name="held")
    def work(label):
        ran.add(label)

    ojs_broker.pause("held")
    work.send("waits")
    worker = start_worker()
    wait_until(lambda: "held" in ojs_broker.paused, message="the pause replayed")
    deadline = time.monotonic() + 1.0  # a window to prove an absence; every check in it is exact
    while time.monotonic() < deadline:
        assert message_count(amqp_url, names.job_queue("held")) == 1 and ran.calls == []
        assert consumers(amqp_url, names.job_queue("held")) == 0
        time.sleep(0.1)
    assert worker.consumers.keys() == {"held"}
    ojs_broker.resume("held")
    assert ran.wait(1) == ["waits"]


def test_lifecycle_events_of_successes_and_failures(ojs_broker, start_worker):
    events = Recorder()
    ojs_broker.lifecycle.subscribe(events.add)

    @dramatiq.actor(queue_name="events")
    def fine():
        pass

    @dramatiq.actor(queue_name="events", max_retries=0)
    def broken():
        raise ValueError("broken on purpose")

    start_worker()
    ok = fine.send()
    bad = broken.send()
    calls: list[JobEvent] = events.wait(5)
    by_type: Callable[[str], list[str]] = lambda t: [e.event for e in calls if e.job_type == t]  # noqa: E731
    assert by_type("fine") == ["started", "succeeded"]
    assert by_type("broken") == ["started", "failed", "dead-lettered"]
    failed = next(e for e in calls if e.event == "failed")
    assert failed.error == {"code": "handler_error", "type": "ValueError", "message": "broken on purpose"}
    assert {e.job_id for e in calls} == {
        job_id_for(ok.message_id, ok.message_timestamp),
        job_id_for(bad.message_id, bad.message_timestamp),
    }
    assert {e.worker_id for e in calls} == {ojs_broker.lifecycle.worker_id}
    assert all(e.attempt == 1 for e in calls)


def test_a_retried_message_is_settled_by_the_settler_with_its_events_and_result(ojs_broker, start_worker, monkeypatch):
    results = Recorder()
    succeed = Settler.succeed

    def spy(self: Settler, delivery, job, attempt, result=None) -> None:
        results.add(result)
        succeed(self, delivery, job, attempt, result)

    monkeypatch.setattr(Settler, "succeed", spy)
    events = Recorder()
    ojs_broker.lifecycle.subscribe(events.add)
    tries: list[int] = []

    @dramatiq.actor(queue_name="events", max_retries=1, min_backoff=10, max_backoff=10)
    def flaky():
        tries.append(1)
        if len(tries) == 1:
            raise ValueError("once")
        return {"tries": len(tries)}

    start_worker()
    flaky.send()
    calls: list[JobEvent] = events.wait(5)
    assert [(e.event, e.attempt) for e in calls] == [
        ("started", 1),
        ("failed", 1),
        ("retried", 1),
        ("started", 2),
        ("succeeded", 2),
    ]
    assert calls[1].error == {"code": "handler_error", "type": "ValueError", "message": "once"}
    assert results.wait(1) == [{"tries": 2}]
