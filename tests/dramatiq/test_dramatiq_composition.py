"""Pipelines, groups, callbacks, results and priorities over OjsBroker, with a real dramatiq.Worker."""

from __future__ import annotations

import threading

import dramatiq
import pytest
from dramatiq import group, pipeline
from dramatiq.results import Results
from dramatiq.results.backends import StubBackend
from support import wait_until

from ojs_dramatiq import OjsBroker, OjsGroupCallbacks

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def results(ojs_broker) -> StubBackend:
    """The Results middleware with Dramatiq's in-process backend (worker and sender share the process)."""
    backend = StubBackend()
    ojs_broker.add_middleware(Results(backend=backend))
    return backend


def test_results_are_found_by_the_dramatiq_message_id(ojs_broker, start_worker, results):
    attempts = []

    @dramatiq.actor(store_results=True, max_retries=2, min_backoff=50)
    def square(x):
        attempts.append(x)
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")  # the result must survive a retry (same message id)
        return x * x

    start_worker()
    message = square.send(7)
    assert message.get_result(block=True, timeout=20_000) == 49
    assert attempts == [7, 7]


def test_failed_results_raise_for_the_caller(ojs_broker, start_worker, results):
    @dramatiq.actor(store_results=True, max_retries=0)
    def broken():
        raise ValueError("nope")

    start_worker()
    message = broken.send()
    with pytest.raises(dramatiq.results.ResultFailure, match="nope"):
        message.get_result(block=True, timeout=20_000)


def test_pipelines_pipe_results_through_the_broker(ojs_broker, start_worker, results):
    @dramatiq.actor(store_results=True)
    def add(x, y=0):
        return x + y

    @dramatiq.actor(store_results=True)
    def delayed_double(x):
        return 2 * x

    start_worker()
    pipe = pipeline([add.message(1, 2), add.message(3), delayed_double.message_with_options(delay=300)])
    pipe.run()
    assert pipe.get_result(block=True, timeout=20_000) == 12
    assert list(pipe.get_results(block=True, timeout=20_000)) == [3, 6, 12]


def test_groups_and_their_completion_callbacks(ojs_broker, start_worker, results, management, names):
    ojs_broker.add_middleware(OjsGroupCallbacks())  # the fan-in, no Redis: test_dramatiq_groups.py across processes
    done = threading.Event()
    after_failure = []

    @dramatiq.actor(store_results=True)
    def inc(x):
        return x + 1

    @dramatiq.actor(max_retries=0)
    def broken():
        raise ValueError("a member that fails for good")

    @dramatiq.actor
    def finished():
        done.set()

    @dramatiq.actor
    def never():
        after_failure.append(1)

    start_worker()
    g = group(inc.message(i) for i in range(5))
    g.add_completion_callback(finished.message())
    g.run()
    failing = group([inc.message(10), broken.message()])
    failing.add_completion_callback(never.message())
    failing.run()
    assert sorted(g.get_results(block=True, timeout=20_000)) == [1, 2, 3, 4, 5]
    assert done.wait(20)
    # Both fan-in streams are deleted: after the callback was published, and once the failing group ended.
    wait_until(lambda: not management.queues(names.fan_in_stream("")), 20, message="the fan-in streams deleted")
    ojs_broker.join("default", timeout=20_000)
    assert after_failure == []  # a member failed for good: no callback, as with GroupCallbacks


def test_on_success_and_on_failure_callbacks(ojs_broker, start_worker):
    seen = []
    both = threading.Barrier(3, timeout=20)

    @dramatiq.actor
    def ok():
        return 1

    @dramatiq.actor(max_retries=0)
    def ko():
        raise ValueError("bad")

    @dramatiq.actor
    def succeeded(message_data, result):
        seen.append(("success", message_data["actor_name"], result))
        both.wait()

    @dramatiq.actor
    def failed(message_data, exception_data):
        seen.append(("failure", message_data["actor_name"], exception_data["type"], exception_data["message"]))
        both.wait()

    start_worker()
    ok.send_with_options(on_success=succeeded)
    ko.send_with_options(on_failure=failed)
    both.wait()
    assert sorted(seen) == [("failure", "ko", "ValueError", "bad"), ("success", "ok", 1)]


def test_broker_priority_orders_waiting_messages(amqp_url, prefix, start_worker):
    broker = OjsBroker(amqp_url, prefix=prefix, max_priority=10)
    order = []

    @dramatiq.actor(broker=broker, queue_name="prio")
    def job(n):
        order.append(n)

    broker.declare_queue("prio", ensure=True)
    for n in range(6):
        job.send_with_options(args=(n,), broker_priority=n % 2 * 9)  # odd n: priority 9
    start_worker(broker, worker_threads=1)
    broker.join("prio", timeout=20_000)
    broker.close()
    # Basic.Qos(prefetch=2) lets the first two in before the others queue up behind priorities.
    assert set(order[:3]) == {1, 3, 5}, order
