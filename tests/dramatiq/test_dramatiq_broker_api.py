"""``OjsBroker`` as a drop-in for ``RabbitmqBroker``: Dramatiq's errors from ``enqueue`` (wrapping
ours) and ``RabbitmqBroker``'s ``host=`` / ``port=`` / ``parameters=`` connection forms."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from urllib.parse import unquote, urlsplit

import dramatiq
import pika
import pytest
from dramatiq.errors import BrokerError, ConnectionClosed, QueueNotFound
from kombu.utils.url import parse_url
from support import get_messages

from ojs_dramatiq import OjsBroker
from ojs_dramatiq.errors import ERROR_MAP, dramatiq_error_for, dramatiq_errors
from ojs_dramatiq.parameters import REFUSED, url_for_parameters
from ojs_kombu import (
    BrokerConnectionError,
    Job,
    OjsError,
    PublishError,
    PublishNackedError,
    PublishTimeoutError,
    QueueOptions,
    TopologyConflictError,
    UnroutableError,
    ValidationError,
)
from ojs_kombu.testing.broker import PrivateNode

# -- the error table (no broker) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (BrokerConnectionError("down"), ConnectionClosed),
        (PublishTimeoutError("no confirm"), ConnectionClosed),
        (UnroutableError("returned"), QueueNotFound),
        (PublishNackedError("nacked"), BrokerError),
        (PublishError("channel closed"), BrokerError),
        (TopologyConflictError("q", [], "PRECONDITION_FAILED"), BrokerError),
        (OjsError("the client is closed"), BrokerError),
    ],
)
def test_each_ojs_error_maps_to_the_closest_dramatiq_error(error, expected):
    mapped = dramatiq_error_for(error)
    assert type(mapped) is expected and str(mapped) == str(error)
    with pytest.raises(expected) as raised, dramatiq_errors():
        raise error
    assert raised.value.__cause__ is error


def test_a_validation_error_is_not_a_broker_error():
    error = ValidationError("args[0] is not JSON", field="args[0]")
    with pytest.raises(ValidationError) as raised, dramatiq_errors():
        raise error
    assert raised.value is error and not isinstance(raised.value, BrokerError)


def test_every_publish_error_of_ojs_kombu_has_a_row():
    for ojs_class in (BrokerConnectionError, PublishTimeoutError, UnroutableError, PublishNackedError):
        assert any(row[0] is ojs_class for row in ERROR_MAP), ojs_class


# -- RabbitmqBroker's connection forms (no broker) ---------------------------------------------


def test_pika_keywords_become_a_quoted_amqp_url():
    translation = url_for_parameters(
        host="rabbit.example",
        port=5673,
        virtual_host="/",
        credentials=pika.PlainCredentials("us@er", "p:ss/w%rd"),
        heartbeat=15,
    )
    assert translation.url == "amqp://us%40er:p%3Ass%2Fw%25rd@rabbit.example:5673/%2F"
    assert translation.heartbeat == 15
    parts = parse_url(translation.url)  # what kombu makes of it
    assert (parts["hostname"], parts["port"], parts["userid"], parts["password"], parts["virtual_host"]) == (
        "rabbit.example",
        5673,
        "us@er",
        "p:ss/w%rd",
        "/",
    )


def test_pika_defaults_are_guest_on_localhost():
    assert url_for_parameters().url == "amqp://guest:guest@localhost:5672/%2F"
    assert url_for_parameters(port=5999).url == "amqp://guest:guest@localhost:5999/%2F"
    assert url_for_parameters(host="::1", virtual_host="a/b").url == "amqp://guest:guest@[::1]:5672/a%2Fb"


def test_a_list_of_parameters_is_a_failover_list_in_order():
    translation = url_for_parameters(
        [
            {"host": "a", "heartbeat": 30},
            pika.ConnectionParameters(host="b", port=5673, credentials=pika.PlainCredentials("u", "p")),
            pika.URLParameters("amqp://x:y@c:5674/vh?heartbeat=30"),
        ]
    )
    assert translation.url == "amqp://guest:guest@a:5672/%2F;amqp://u:p@b:5673/%2F;amqp://x:y@c:5674/vh"
    assert translation.heartbeat == 30
    assert url_for_parameters({"host": "solo"}).url == "amqp://guest:guest@solo:5672/%2F"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_parameter_without_an_equivalent_is_refused_with_what_to_use(name):
    with pytest.raises(TypeError, match=name) as raised:
        url_for_parameters(**{name: object()})
    assert REFUSED[name] in str(raised.value)


def test_refusals_name_the_supported_form():
    with pytest.raises(TypeError, match=r"amqps://.*ssl="):
        url_for_parameters(ssl_options=object())
    with pytest.raises(TypeError, match="connect_retries="):
        url_for_parameters([{"host": "a", "connection_attempts": 3}])
    with pytest.raises(TypeError, match=r"url='amqp://user:password@host:5672/%2F' or host="):
        url_for_parameters(hostname="a")
    # A pika object with a setting beyond the translated ones would silently lose it.
    with pytest.raises(TypeError, match="blocked_connection_timeout"):
        url_for_parameters([pika.ConnectionParameters(host="a", blocked_connection_timeout=300)])
    with pytest.raises(TypeError, match="PlainCredentials"):
        url_for_parameters(credentials=pika.credentials.ExternalCredentials())
    with pytest.raises(TypeError, match="callable"):
        url_for_parameters(heartbeat=lambda conn, proposed: proposed)
    with pytest.raises(TypeError, match="not str"):
        url_for_parameters(["amqp://a"])


def test_inconsistent_parameters_are_refused():
    with pytest.raises(ValueError, match="different heartbeats"):
        url_for_parameters([{"host": "a", "heartbeat": 10}, {"host": "b", "heartbeat": 20}])
    with pytest.raises(ValueError, match="port"):
        url_for_parameters(port=0)
    with pytest.raises(ValueError, match="names no broker"):
        url_for_parameters([])
    with pytest.raises(TypeError, match="cannot be combined"):
        url_for_parameters([{"host": "a"}], host="b")


def test_ojs_broker_takes_the_rabbitmq_broker_forms():
    broker = OjsBroker(host="rabbit", port=5673, credentials=pika.PlainCredentials("u", "p"), heartbeat=20)
    try:
        assert broker.url == "amqp://u:p@rabbit:5673/%2F" and broker.heartbeat == 20
        assert "p@" not in repr(broker)
    finally:
        broker.close()
    broker = OjsBroker(parameters=[{"host": "a", "heartbeat": 0}, {"host": "b"}])
    try:
        assert broker.url == "amqp://guest:guest@a:5672/%2F;amqp://guest:guest@b:5672/%2F" and broker.heartbeat == 0
    finally:
        broker.close()


def test_ojs_broker_refuses_mixed_forms_and_untranslatable_parameters():
    with pytest.raises(TypeError, match=r"url=.*cannot be combined.*host"):
        OjsBroker("amqp://guest:guest@localhost//", host="other")
    with pytest.raises(TypeError, match=r"url=.*cannot be combined.*parameters"):
        OjsBroker("amqp://guest:guest@localhost//", parameters=[{"host": "other"}])
    with pytest.raises(TypeError, match="cannot be combined"):
        OjsBroker(parameters=[{"host": "a"}], port=5673)
    with pytest.raises(TypeError, match=r"ssl_options.*amqps://"):
        OjsBroker(host="a", ssl_options=object())
    with pytest.raises(TypeError, match=r"connection_attempts=.*connect_retries="):
        OjsBroker("amqp://guest:guest@localhost//", connection_attempts=3)
    with pytest.raises(ValueError, match="differs"):
        OjsBroker(parameters=[{"host": "a", "heartbeat": 10}], heartbeat=20)
    with pytest.raises(TypeError, match="unexpected keyword arguments: hostname"):
        OjsBroker(hostname="a")


# -- against the real broker -------------------------------------------------------------------


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def make_broker() -> Iterator:
    """``make_broker(*args, **kwargs)``: an OjsBroker, closed after the test."""
    brokers: list[OjsBroker] = []

    def make(*args, **kwargs) -> OjsBroker:
        broker = OjsBroker(*args, **kwargs)
        brokers.append(broker)
        return broker

    yield make
    for broker in brokers:
        broker.close()


def test_enqueue_with_the_broker_unreachable_raises_connection_closed(make_broker, prefix):
    broker = make_broker(f"amqp://guest:guest@127.0.0.1:{closed_port()}//", prefix=prefix, connect_retries=0)

    @dramatiq.actor(broker=broker, queue_name="nowhere")
    def nowhere():
        pass

    with pytest.raises(ConnectionClosed) as raised:
        nowhere.send()
    assert isinstance(raised.value, BrokerError)  # what RabbitmqBroker code catches
    assert isinstance(raised.value.__cause__, BrokerConnectionError)
    assert "127.0.0.1" in str(raised.value) and "guest:guest" not in str(raised.value)
    with pytest.raises(ConnectionClosed) as raised:
        broker.enqueue_many([nowhere.message(), nowhere.message()])
    assert isinstance(raised.value.__cause__, BrokerConnectionError)


def test_enqueue_to_a_queue_that_does_not_exist_raises_queue_not_found(make_broker, client, prefix):
    client.declare_queue("present")  # the direct exchange exists; "absent" has no queue bound
    broker = make_broker(client.url, prefix=prefix, declare=False)

    @dramatiq.actor(broker=broker, queue_name="absent")
    def absent():
        pass

    with pytest.raises(QueueNotFound) as raised:
        absent.send()
    assert isinstance(raised.value.__cause__, UnroutableError)
    assert raised.value.__cause__.routing_key == "absent"


def test_enqueue_refused_by_the_broker_raises_broker_error(make_broker, amqp_url, prefix, names):
    broker = make_broker(amqp_url, prefix=prefix, queue_options=QueueOptions(max_length=0, overflow="reject-publish"))

    @dramatiq.actor(broker=broker, queue_name="full")
    def full():
        pass

    with pytest.raises(BrokerError) as raised:
        full.send()
    assert type(raised.value) is BrokerError and isinstance(raised.value.__cause__, PublishNackedError)
    with pytest.raises(BrokerError) as raised:
        broker.enqueue_many([full.message(), full.message()])
    assert isinstance(raised.value.__cause__, PublishNackedError)


def test_a_bad_argument_stays_a_validation_error(make_broker, amqp_url, prefix):
    broker = make_broker(amqp_url, prefix=prefix)

    @dramatiq.actor(broker=broker, queue_name="bad")
    def bad(value):
        pass

    with pytest.raises(ValidationError):
        bad.send(float("nan"))


def _pika_keywords(amqp_url: str) -> dict:
    parts = urlsplit(amqp_url)
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    return {
        "host": parts.hostname,
        "port": parts.port or 5672,
        "virtual_host": vhost,
        "credentials": pika.PlainCredentials(unquote(parts.username or ""), unquote(parts.password or "")),
    }


def test_host_and_port_reach_the_broker(make_broker, amqp_url, prefix, names):
    broker = make_broker(prefix=prefix, **_pika_keywords(amqp_url))

    @dramatiq.actor(broker=broker, queue_name="byhost")
    def by_host(n):
        pass

    message = by_host.send(1)
    [(_, properties, body)] = get_messages(amqp_url, names.job_queue("byhost"), 1)
    assert Job.from_json(body).args == [1] and properties.type == "by_host"
    assert Job.from_json(body).meta["dramatiq"]["message_id"] == message.message_id


def test_parameters_fail_over_to_the_next_broker(make_broker, amqp_url, prefix, names):
    reachable = _pika_keywords(amqp_url)
    unreachable = {**reachable, "port": closed_port()}
    broker = make_broker(prefix=prefix, parameters=[unreachable, pika.ConnectionParameters(**reachable)])

    @dramatiq.actor(broker=broker, queue_name="failover")
    def failover(n):
        pass

    failover.send(2)
    [(_, _, body)] = get_messages(amqp_url, names.job_queue("failover"), 1)
    assert Job.from_json(body).args == [2]


def test_a_broker_that_stops_confirming_raises_connection_closed(make_broker):
    """A memory alarm blocks every publishing connection: no confirm arrives (on a node of its own)."""
    with PrivateNode() as node:
        broker = make_broker(node.url, prefix="alarm", confirm_timeout=1, connect_retries=0)

        @dramatiq.actor(broker=broker, queue_name="blocked")
        def blocked():
            pass

        blocked.send()  # the queue is declared and a publish confirmed before the alarm
        node._ctl("set_vm_memory_high_watermark", "0")
        with pytest.raises(ConnectionClosed) as raised:
            blocked.send()
        assert isinstance(raised.value.__cause__, PublishTimeoutError)
        broker.close()  # before the node stops
