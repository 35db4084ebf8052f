"""Queue arguments compared by meaning (pure logic).

The same comparison serves the topology's conflict handling and the broker tests' assertions on
what the management API lists, so they agree on RabbitMQ 3.10, 4.0 and 4.3 (docs/rabbitmq-4.md).
"""

from __future__ import annotations

import pytest

from ojs_kombu import OjsError
from ojs_kombu.amqp.topology import existing_value
from ojs_kombu.wire.entities import duration_ms, normalise_arguments


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
