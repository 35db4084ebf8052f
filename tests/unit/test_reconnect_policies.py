"""The reconnect primitive's pure logic: each policy, and the one rule for permanent errors."""

from __future__ import annotations

import pytest
from amqp.exceptions import AccessRefused, InternalError, NotAllowed, NotFound, ResourceError

from ojs_kombu.amqp.errors import QueueNotServed
from ojs_kombu.amqp.failover import Failover
from ojs_kombu.amqp.reconnect import MIN_ATTEMPT_TIMEOUT, UNSERVED_AFTER, Budgeted, Forever, OnePass, Reconnector
from ojs_kombu.errors import (
    AccessRefusedError,
    BrokerConnectionError,
    NotFoundError,
    QueueUnavailableError,
    ValidationError,
)

ONE = "amqp://u:secret@h1//"
TWO = "amqp://u:secret@h1//;amqp://u:secret@h2//"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reconnector(policy, url=ONE, **options):
    failover = Failover(url, heartbeat=0, ssl=None, transport_options=None, connection_name="t", rand=lambda: 0.5)
    clock = Clock()
    return Reconnector(policy, failover, url=url, clock=clock, **options), failover, clock


# -- the policies -------------------------------------------------------------------------------


def test_budgeted_cuts_the_wait_at_the_budget_then_gives_up():
    policy = Budgeted(5.0)
    assert policy.next_delay(1.0, 1, 0.0) == 1.0
    assert policy.next_delay(4.0, 3, 3.0) == 2.0  # what is left of the budget
    assert policy.next_delay(1.0, 4, 5.0) is None


def test_budgeted_retries_bound_the_reconnections_too():
    policy = Budgeted(None, retries=2)
    assert policy.next_delay(8.0, 2, 1000.0) == 8.0  # no time limit
    assert policy.next_delay(8.0, 3, 0.0) is None


def test_budgeted_attempt_timeout_is_what_is_left_within_the_connect_timeout():
    policy = Budgeted(5.0)
    assert policy.attempt_timeout(None, 4) == 4.0
    assert policy.attempt_timeout(3.0, 4) == 2.0
    assert policy.attempt_timeout(4.999, 4) == MIN_ATTEMPT_TIMEOUT
    assert Budgeted(None).attempt_timeout(3.0, 4) is None


@pytest.mark.parametrize("bad", [{"seconds": 0}, {"seconds": -1}, {"seconds": 1, "retries": -1}])
def test_budgeted_refuses_a_bad_budget(bad):
    with pytest.raises(ValidationError):
        Budgeted(**bad)


def test_forever_always_waits_the_failovers_back_off():
    assert Forever().next_delay(60.0, 10_000, 1e9) == 60.0
    assert Forever().attempt_timeout(1e9, 4) is None


def test_one_pass_tries_each_node_once_without_waiting():
    policy = OnePass(3)
    assert [policy.next_delay(1.0, n, 0.0) for n in (1, 2, 3)] == [0.0, 0.0, None]
    with pytest.raises(ValidationError):
        OnePass(0)


# -- the reconnector: budget, rotation, the rule for permanent errors ------------------------------


def test_the_budget_counts_from_the_start_of_the_attempt_that_failed():
    retry, failover, clock = reconnector(Budgeted(5.0))
    conn = failover.connection()
    retry.connecting()
    clock.now += 2.0  # the attempt took 2 s before it failed
    assert retry.failed(ConnectionRefusedError("refused"), conn) == pytest.approx(1.0)  # §9: ~1 s
    assert retry.elapsed == pytest.approx(2.0)
    clock.now += 3.5
    with pytest.raises(BrokerConnectionError, match="after 2 attempts in 5.5s") as raised:
        retry.failed(ConnectionRefusedError("refused"), conn)
    assert "secret" not in str(raised.value)


def test_a_failure_moves_to_the_next_node_at_once_within_a_rotation():
    retry, failover, _ = reconnector(Forever(), TWO)
    conn = failover.connection()
    assert retry.failed(OSError("down"), conn) == 0.0
    assert failover.current.endswith("@h2//")
    assert retry.failed(OSError("down"), failover.connection()) > 0  # a full rotation failed: back off


@pytest.mark.parametrize("policy", [Forever(), Budgeted(None), OnePass(5)])
@pytest.mark.parametrize("exc", [AccessRefused("403 wrong password"), NotAllowed("530 no vhost")])
def test_a_permanent_refusal_is_raised_at_once_under_every_policy(policy, exc):
    retry, failover, _ = reconnector(policy)
    with pytest.raises(AccessRefusedError) as raised:
        retry.failed(exc, failover.connection())
    assert raised.value.__cause__ is exc
    assert retry.failures == 0


def test_a_404_is_retried_once_then_raised_not_found():
    retry, failover, _ = reconnector(Forever())
    conn = failover.connection()
    assert retry.failed(NotFound("404 no exchange"), conn) >= 0  # re-declaring may cure it
    with pytest.raises(NotFoundError):
        retry.failed(NotFound("404 no exchange"), conn)


def test_a_404_where_the_entity_must_exist_is_final_at_once():
    retry, failover, _ = reconnector(Forever(), must_exist=True)
    with pytest.raises(NotFoundError):
        retry.failed(NotFound("404 no queue"), failover.connection())


def test_a_queue_that_refuses_every_consumer_is_retried_then_raised_naming_it():
    """A 541 on Basic.Consume: a member may be recovering; past UNSERVED_AFTER only an operator can help."""
    retry, failover, clock = reconnector(Forever())
    conn = failover.connection()

    def unserved(queue: str = "p.ojs.queue.control.q") -> QueueNotServed:
        return QueueNotServed(queue, InternalError("INTERNAL_ERROR", reply_code=541))

    assert retry.failed(unserved(), conn) >= 0
    clock.now += UNSERVED_AFTER - 1
    assert retry.failed(unserved(), conn) >= 0
    assert retry.failed(unserved("p.ojs.queue.other"), conn) >= 0  # each queue has its own clock
    clock.now += 1
    with pytest.raises(QueueUnavailableError) as raised:
        retry.failed(unserved(), conn)
    error = raised.value
    assert error.entity == "p.ojs.queue.control.q" and error.seconds == UNSERVED_AFTER
    assert error.reply_code == 541 and "delete_queue p.ojs.queue.control.q" in str(error)
    assert "secret" not in str(error)
    retry.reset()  # consumed again: the clock starts over
    assert retry.failed(unserved(), conn) >= 0


def test_a_publish_to_a_stream_without_a_member_counts_as_that_stream_unserved():
    retry, failover, clock = reconnector(Forever())
    conn = failover.connection()
    text = "RESOURCE_ERROR - Stream not found for queue 'p.ojs.stream.events' in vhost '/'"
    assert retry.failed(ResourceError(text, reply_code=506), conn) >= 0
    clock.now += UNSERVED_AFTER
    with pytest.raises(QueueUnavailableError) as raised:
        retry.failed(ResourceError(text, reply_code=506), conn)
    assert raised.value.entity == "p.ojs.stream.events" and raised.value.reply_code == 506
    other, _, clock = reconnector(Forever())
    assert other.failed(ResourceError("RESOURCE_ERROR - other", reply_code=506), conn) >= 0
    clock.now += 2 * UNSERVED_AFTER
    assert other.failed(ResourceError("RESOURCE_ERROR - other", reply_code=506), conn) >= 0  # names no queue


def test_reset_forgets_the_failures_of_a_long_running_loop():
    retry, failover, clock = reconnector(Budgeted(5.0))
    conn = failover.connection()
    retry.failed(OSError("down"), conn)
    clock.now += 10
    retry.succeeded()
    retry.reset()
    assert retry.failures == 0 and retry.elapsed is None
    assert retry.failed(OSError("down again"), conn) is not None  # a fresh budget


def test_the_logged_warning_is_the_callers_with_its_note_and_no_password(caplog):
    message = "%(name)s to %(failed)s lost (%(error)s); reconnecting to %(next)s in %(delay).1fs%(note)s"
    retry, failover, _ = reconnector(Forever(), TWO, name="consumer connection", message=message)
    with caplog.at_level("WARNING", logger="ojs_kombu.amqp.reconnect"):
        retry.failed(OSError("reset"), failover.connection(), note="; 3 unsettled")
    (logged,) = [record.getMessage() for record in caplog.records]
    assert logged == (
        "consumer connection to amqp://u:***@h1:5672// lost (reset); "
        "reconnecting to amqp://u:***@h2:5672// in 0.0s; 3 unsettled"
    )
