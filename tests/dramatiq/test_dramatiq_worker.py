"""Real dramatiq.Worker on the real broker: sending, retries, dead letters, middleware, delays."""

from __future__ import annotations

import json
import threading
import time

import dramatiq
import pytest
from dramatiq.middleware import CurrentMessage
from support import get_messages, message_count, wait_until

from ojs_kombu.wire.codec import CONTENT_TYPE
from ojs_kombu.wire.headers import Header
from tools.schema import validate_job

pytestmark = pytest.mark.timeout(120)


class Recorder:
    """Collects calls from worker threads; ``wait(n)`` blocks until ``n`` calls were recorded."""

    def __init__(self):
        self.calls: list = []
        self._cond = threading.Condition()

    def add(self, item) -> None:
        with self._cond:
            self.calls.append(item)
            self._cond.notify_all()

    def wait(self, n: int, timeout: float = 30.0) -> list:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.calls) >= n, timeout), f"only {self.calls!r} after {timeout}s"
            return list(self.calls)


def assert_only_dead_letters_left(broker, queue_name: str, dead: int) -> None:
    """Nothing of ``queue_name`` is left to run: nothing ready, in a retry queue, scheduled or in
    flight in this process, and ``dead`` messages in its dead letter queue (exact counts, read
    until they say so).  A message that is only in its DLQ never runs again: no sleep shows more."""
    wait_until(
        lambda: broker.get_queue_message_counts(queue_name) == (0, 0, dead) and broker.in_flight(queue_name) == 0,
        20,
        message=f"only {dead} dead letter(s) left of {queue_name}",
    )


def current_retries() -> int:
    return CurrentMessage.get_current_message().options.get("retries", 0)


def test_args_and_kwargs_reach_the_actor_and_the_envelope_is_ojs(ojs_broker, start_worker, names, amqp_url):
    calls = Recorder()

    @dramatiq.actor(queue_name="args")
    def add(a, b, *, scale=1, label=None):
        calls.add((a, b, scale, label))

    # Inspected with Basic.Get + ack: a peek that requeues would mark it redelivered (a lost attempt).
    message = add.send_with_options(args=(1, [2, 3]), kwargs={"scale": 10, "label": "x"}, broker_priority=3)
    ((method, properties, body),) = get_messages(amqp_url, names.job_queue("args"), 1)
    envelope = json.loads(body)
    validate_job(envelope)
    assert properties.content_type == CONTENT_TYPE
    assert properties.message_id == envelope["id"] and properties.type == "add"
    assert properties.headers[Header.ATTEMPT] == 1 and properties.headers[Header.QUEUE] == "args"
    assert envelope["args"] == [1, [2, 3]]
    assert envelope["meta"]["kwargs"] == {"scale": 10, "label": "x"}
    assert envelope["meta"]["dramatiq"] == {
        "actor_name": "add",
        "message_id": message.message_id,
        "options": {"broker_priority": 3},
    }
    assert envelope["priority"] == 3 and envelope["queue"] == "args"
    assert envelope["created_at"].endswith("Z")
    assert envelope["retry"]["max_attempts"] == 21  # Dramatiq's default max_retries=20, plus the first run

    add.send_with_options(args=(1, [2, 3]), kwargs={"scale": 10, "label": "x"}, broker_priority=3)
    start_worker()
    assert calls.wait(1) == [(1, [2, 3], 10, "x")]
    ojs_broker.join("args", timeout=20_000)
    assert ojs_broker.get_queue_message_counts("args") == (0, 0, 0)


def test_camel_case_actor_name_round_trips(ojs_broker, start_worker, names, amqp_url):
    calls = Recorder()
    ojs_broker.add_middleware(CurrentMessage())

    @dramatiq.actor(actor_name="LegacyActor", queue_name="legacy")
    def legacy(x):
        calls.add((x, CurrentMessage.get_current_message().actor_name))

    legacy.send("hi")
    ((_, properties, body),) = get_messages(amqp_url, names.job_queue("legacy"), 1)
    envelope = json.loads(body)
    validate_job(envelope)
    assert envelope["type"] == "legacy_actor" and envelope["meta"]["dramatiq"]["actor_name"] == "LegacyActor"
    legacy.send("hi")
    start_worker()
    assert calls.wait(1) == [("hi", "LegacyActor")]


def test_retries_back_off_through_retry_queues(ojs_broker, start_worker, management, names):
    ojs_broker.add_middleware(CurrentMessage())
    calls = Recorder()

    @dramatiq.actor(queue_name="flaky", max_retries=3, min_backoff=200, max_backoff=2000)
    def flaky():
        retries = current_retries()
        calls.add((time.monotonic(), retries))
        if retries < 2:
            raise RuntimeError(f"failure {retries}")

    start_worker()
    flaky.send()
    runs = calls.wait(3)
    ojs_broker.join("flaky", timeout=20_000)
    assert [r for _, r in runs] == [0, 1, 2]
    # Dramatiq's backoff before retry n is 200 ms * 2**(n-1) * U[1, 2): never earlier than 200 ms, then 400 ms.
    assert runs[1][0] - runs[0][0] >= 0.2
    assert runs[2][0] - runs[1][0] >= 0.4
    retry_queues = [q["name"] for q in management.queues(names.retry_queue("flaky", 0)[:-1])]
    assert retry_queues, "the retries went through ojs.queue.retry.flaky.<ms>"
    assert ojs_broker.get_queue_message_counts("flaky") == (0, 0, 0)


def test_exhausted_retries_end_in_the_dead_letter_queue(ojs_broker, start_worker, names, amqp_url):
    calls = Recorder()
    exhausted = Recorder()

    @dramatiq.actor(queue_name="doomed")
    def on_exhausted(message_data, retry_info):
        exhausted.add((message_data["message_id"], retry_info))

    @dramatiq.actor(queue_name="doomed", max_retries=1, min_backoff=50, on_retry_exhausted=on_exhausted.actor_name)
    def doomed(n):
        calls.add(n)
        raise ValueError(f"boom {len(calls.calls)}")

    start_worker()
    message = doomed.send(7)
    assert calls.wait(2) == [7, 7]
    assert exhausted.wait(1) == [(message.message_id, {"retries": 1, "max_retries": 1})]
    assert_only_dead_letters_left(ojs_broker, "doomed", 1)
    ((_, properties, body),) = get_messages(amqp_url, names.dead_letter_queue("doomed"), 1)
    envelope = json.loads(body)
    validate_job(envelope)
    headers = properties.headers
    assert headers[Header.ATTEMPT] == 2 and headers[Header.MAX_ATTEMPTS] == 2
    assert headers[Header.ERROR_CODE] == "handler_error"
    assert headers["x-death"][0]["reason"] == "rejected"
    assert [e["message"] for e in envelope["errors"]] == ["boom 1"]
    assert envelope["meta"]["dramatiq"]["message_id"] == message.message_id
    assert calls.calls == [7, 7]


def test_throws_skips_the_retries(ojs_broker, start_worker, names, amqp_url):
    calls = Recorder()

    class Expected(Exception):
        pass

    @dramatiq.actor(queue_name="throws", throws=(Expected,), min_backoff=50)
    def thrower():
        calls.add(1)
        raise Expected("no retry")

    start_worker()
    thrower.send()
    calls.wait(1)
    assert_only_dead_letters_left(ojs_broker, "throws", 1)
    assert calls.calls == [1]


def test_time_limit_fails_the_attempt(ojs_broker, start_worker, names, amqp_url):
    calls = Recorder()
    outcomes = Recorder()

    @dramatiq.actor(queue_name="slow", time_limit=300, max_retries=0)
    def slow():
        calls.add(1)
        try:
            for _ in range(100):
                time.sleep(0.05)
        except BaseException as exc:
            outcomes.add(type(exc).__name__)
            raise

    start_worker()
    slow.send()
    assert outcomes.wait(1) == ["TimeLimitExceeded"]
    wait_until(lambda: message_count(amqp_url, names.dead_letter_queue("slow")) == 1, 20)
    assert calls.calls == [1]


def test_age_limit_drops_stale_messages_into_the_dlq(ojs_broker, start_worker):
    calls = Recorder()

    @dramatiq.actor(queue_name="aged")
    def aged(n):
        calls.add(n)

    # message_timestamp travels as created_at: made a second ago, the first is older than its 200 ms.
    stale = aged.message_with_options(args=(1,), max_age=200)
    ojs_broker.enqueue(stale.copy(message_timestamp=stale.message_timestamp - 1000))
    aged.send_with_options(args=(2,), max_age=60_000)
    start_worker()
    assert calls.wait(1) == [2]
    assert_only_dead_letters_left(ojs_broker, "aged", 1)
    assert calls.calls == [2]


def test_a_worker_consumes_without_declaring_the_scheduling_cascade(ojs_broker, start_worker, management, names):
    # Start-up: the job queue, its DLQ and the cascade's delivery binding, not the cascade's 35 levels
    # (~100 round trips); whoever schedules a job declares those first, and the job still arrives.
    calls = Recorder()

    @dramatiq.actor(queue_name="prompt")
    def prompt(sent):
        calls.add(time.time() - sent)

    start_worker()
    prompt.send(time.time())
    calls.wait(1)
    cascade = ojs_broker.cascade
    bindings = management.bindings(source=cascade.delivery_exchange, destination=names.job_queue("prompt"))
    assert [b["routing_key"] for b in bindings] == ["prompt"]
    assert all(management.queue(cascade.queue(level)) is None for level in (0, cascade.levels - 1))
    prompt.send_with_options(args=(time.time(),), delay=300)
    (_, waited) = calls.wait(2, timeout=20)
    assert waited >= 0.3
    assert management.queue(cascade.queue(0)) is not None


def test_delayed_message_is_never_early_and_never_held_unacked(ojs_broker, start_worker):
    calls = Recorder()

    @dramatiq.actor(queue_name="later")
    def later(sent):
        calls.add(time.time() - sent)

    worker = start_worker()
    sent = time.time()
    later.send_with_options(args=(sent,), delay=4000)
    # It waits *ready* in the broker's scheduling cascade (exact counts: passive declares, lowest
    # level first), so it is not delivered: no worker holds it unacked, none has it in flight.
    wait_until(lambda: ojs_broker.get_queue_message_counts("later") == (0, 1, 0), 3, message="the cascade")
    assert ojs_broker.in_flight("later") == 0
    assert not calls.calls, "ran before its delay"
    (waited,) = calls.wait(1, timeout=20)
    assert waited >= 4.0
    assert worker.consumers.keys() == {"later"}  # no .DQ consumer
    assert ojs_broker.get_declared_delay_queues() == set()


def test_dead_letter_mode_republish_records_the_final_error(amqp_url, prefix, names, start_worker):
    from ojs_dramatiq import OjsBroker

    broker = OjsBroker(amqp_url, prefix=prefix, dead_letter_mode="republish")

    @dramatiq.actor(broker=broker, queue_name="final", max_retries=0)
    def final():
        raise KeyError("the last straw")

    start_worker(broker)
    final.send()
    wait_until(lambda: message_count(amqp_url, names.dead_letter_queue("final")) == 1, 20)
    ((_, properties, body),) = get_messages(amqp_url, names.dead_letter_queue("final"), 1)
    envelope = json.loads(body)
    validate_job(envelope)
    assert properties.headers[Header.ERROR_CODE] == "handler_error"
    assert "the last straw" in properties.headers[Header.ERROR_MESSAGE]
    assert envelope["error"]["type"] == "KeyError" and envelope["attempt"] == 1
    assert "x-death" not in properties.headers
    broker.close()


def test_an_ended_workflows_record_stream_is_swept_and_the_actor_never_sees_the_sweep(
    ojs_broker, start_worker, client, names, amqp_url
):
    import kombu

    from ojs_kombu import Job, chain
    from ojs_kombu.amqp.topology import Topology
    from ojs_kombu.errors import NotFoundError
    from ojs_kombu.runtime.workflow import WorkflowHook
    from ojs_kombu.wire.codec import decode

    calls = Recorder()

    @dramatiq.actor(queue_name="swept")
    def step(n):
        calls.add(n)

    w = chain(Job.create("step", [1], queue="swept"))
    client.enqueue_workflow(w)
    # The test plays the worker that ran the workflow's one job, with a retention of 1 s.
    ((_, properties, body),) = get_messages(amqp_url, names.job_queue("swept"), 1)
    hook = WorkflowHook(lambda: kombu.Connection(amqp_url), Topology(names), sweep_after=1.0)
    try:
        hook.on_terminal(decode(body, {"message_id": properties.message_id}, properties.headers), "completed", 1)
    finally:
        hook.close()
    assert client.workflow(w.id).state == "completed"  # kept until its sweep job is due
    assert message_count(amqp_url, names.job_queue("swept")) == 0  # the sweep waits in the cascade
    start_worker()

    def swept() -> bool:
        try:
            client.workflow(w.id)
        except NotFoundError:
            return True
        return False

    wait_until(swept, 15, message="the workflow's record stream deleted by its sweep job")
    step.send(2)  # the worker consumes "swept": the sweep job, delivered before, never reached the actor
    assert calls.wait(1) == [2]
    assert_only_dead_letters_left(ojs_broker, "swept", 0)
