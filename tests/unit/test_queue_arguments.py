"""Queue arguments compared by meaning, and the ones RabbitMQ does not accept (406 ``invalid arg``) (pure logic).

The same comparison serves the topology's conflict handling and the broker tests' assertions on
what the management API lists, so they agree on RabbitMQ 3.10, 4.0 and 4.3 (docs/rabbitmq-4.md).
"""

from __future__ import annotations

import pytest

from ojs_kombu import OjsError, QueueArgumentRefusedError
from ojs_kombu.amqp.topology import check_arguments, existing_value, parse_invalid_argument
from ojs_kombu.errors import BrokerRefusedError, TopologyError
from ojs_kombu.wire.entities import QueueOptions, QueueSpec, duration_ms, frozen_arguments, normalise_arguments


@pytest.mark.parametrize(
    "text,ms",
    [
        ("2h", 7_200_000),
        ("120m", 7_200_000),
        ("7200s", 7_200_000),
        ("7200000", 7_200_000),  # digits alone: how RabbitMQ 4.3 shows x-max-age in a 406 reply
        ("400D", 400 * 86_400_000),
        ("1M", 30 * 86_400_000),
        ("1Y", 365 * 86_400_000),
        ("2 h", None),
        ("h", None),
        ("2d", None),
    ],
)
def test_duration_ms_counts_as_rabbitmq_does(text, ms):
    assert duration_ms(text) == ms


def test_equal_durations_in_either_form_are_equal():
    assert normalise_arguments({"x-max-age": "2h"}) == normalise_arguments({"x-max-age": "120m"})
    assert normalise_arguments({"x-max-age": "2h"}) == normalise_arguments({"x-max-age": "7200000"})
    assert normalise_arguments({"x-max-age": "2h"}) != normalise_arguments({"x-max-age": "1h"})
    assert normalise_arguments({"x-max-age": "soon"})["x-max-age"] == "soon"  # not a duration: as it is


def test_an_absent_queue_type_is_classic_unless_the_queue_says_otherwise():
    assert normalise_arguments({"x-message-ttl": 5}) == {"x-message-ttl": 5, "x-queue-type": "classic"}
    assert normalise_arguments({"x-message-ttl": 5}) == normalise_arguments(
        {"x-message-ttl": 5, "x-queue-type": "classic"}
    )
    assert normalise_arguments({}, queue_type="quorum") == {"x-queue-type": "quorum"}
    assert normalise_arguments({"x-queue-type": "stream"}, queue_type="classic") == {"x-queue-type": "stream"}
    assert normalise_arguments(None) == {"x-queue-type": "classic"}


def test_other_arguments_compare_by_value():
    assert normalise_arguments({"x-expires": 3_600_000}) == normalise_arguments({"x-expires": 3_600_000})
    assert normalise_arguments({"x-expires": 3_600_000}) != normalise_arguments({"x-expires": 3_600_001})


def test_a_default_filled_in_by_rabbitmq_4_is_read_by_the_arguments_type():
    # RabbitMQ 4.x: "received 'classic' but current is 'quorum'" for a declaration without x-queue-type.
    assert existing_value("'quorum'", None, "x-queue-type") == (True, "quorum")
    assert existing_value("'7200000'", "1h", "x-max-age") == (True, "7200000")
    with pytest.raises(Exception) as info:
        existing_value("'quorum'", None)  # the type is unknown without the argument's name
    assert not isinstance(info.value, OjsError)  # internal: the probe stops and the fallback applies


def test_parse_invalid_argument_names_the_argument_the_queue_type_and_what_to_do():
    reply = (
        "PRECONDITION_FAILED - invalid arg 'x-consumer-timeout' for queue 'p.ojs.queue.long' in vhost '/' "
        "of queue type rabbit_classic_queue"
    )
    error = parse_invalid_argument(reply, (4, 3, 6))
    assert isinstance(error, QueueArgumentRefusedError)
    assert isinstance(error, TopologyError) and isinstance(error, BrokerRefusedError)  # permanent
    assert (error.entity, error.argument, error.queue_type) == ("p.ojs.queue.long", "x-consumer-timeout", "classic")
    assert (error.reply_code, error.broker_version, error.method) == (406, "4.3.6", "Queue.declare")
    assert "RabbitMQ 4.3.6" in str(error) and "quorum" in str(error) and "#16983" in str(error)
    invalid = parse_invalid_argument(
        "PRECONDITION_FAILED - invalid arg 'x-max-age' for queue 'q' in vhost '/': invalid_max_age"
    )
    assert invalid is not None and invalid.argument == "x-max-age" and "invalid_max_age" in str(invalid)
    inequivalent = (
        "PRECONDITION_FAILED - inequivalent arg 'x-max-age' for queue 'q' in vhost '/': "
        "received '1h' but current is '2h'"
    )
    assert parse_invalid_argument(inequivalent) is None  # a conflict, handled as one


def _job_queue(options: QueueOptions) -> QueueSpec:
    return QueueSpec("p.ojs.queue.long", frozen_arguments(options.arguments()))


@pytest.mark.parametrize("version", [(4, 3, 0), (4, 3, 6), (4, 3, 99)])
def test_consumer_timeout_on_a_classic_queue_of_rabbitmq_4_3_is_refused_before_it_is_sent(version):
    with pytest.raises(QueueArgumentRefusedError) as info:
        check_arguments([_job_queue(QueueOptions(queue_type="classic", consumer_timeout=60_000))], version)
    assert info.value.reply_code == 0  # nothing was sent
    assert info.value.argument == "x-consumer-timeout" and info.value.queue_type == "classic"


@pytest.mark.parametrize(
    "options,version",
    [
        (QueueOptions(queue_type="classic", consumer_timeout=60_000), (4, 2, 3)),
        (QueueOptions(queue_type="classic", consumer_timeout=60_000), (3, 10, 8)),
        (QueueOptions(queue_type="classic", consumer_timeout=60_000), (4, 4, 0)),  # left to the broker
        (QueueOptions(queue_type="classic", consumer_timeout=60_000), None),  # unknown broker
        (QueueOptions(queue_type="quorum", consumer_timeout=60_000), (4, 3, 6)),
        (QueueOptions(consumer_timeout=60_000), (4, 3, 6)),  # the vhost's default type: the broker decides
        (QueueOptions(queue_type="classic"), (4, 3, 6)),
    ],
)
def test_other_declarations_are_left_to_the_broker(options, version):
    check_arguments([_job_queue(options)], version)
