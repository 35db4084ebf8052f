"""Pure logic of the AMQP layer: which py-amqp errors are permanent and what they become,
reading RabbitMQ's 406 replies, and the typed options of ``Client.enqueue``."""

from __future__ import annotations

import inspect
import typing

import pytest
from amqp.exceptions import AccessRefused, ConnectionForced, NotAllowed, NotFound, PreconditionFailed

from ojs_kombu import AccessRefusedError, BrokerRefusedError, Client, Job, NotFoundError, OjsError, ValidationError
from ojs_kombu.amqp.errors import connection_error, is_permanent, map_exception, map_exceptions
from ojs_kombu.amqp.topology import ON_CONFLICT_CHOICES, Topology, existing_value, parse_precondition_failed
from ojs_kombu.client import JobOptions

REFUSED_LOGIN = AccessRefused("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN", None, None)
NO_VHOST = NotAllowed("NOT_ALLOWED - vhost x not found", (10, 40), "Connection.open")
NO_QUEUE = NotFound("NOT_FOUND - no queue 'q' in vhost '/'", (60, 70), "Basic.get")


@pytest.mark.parametrize(
    "exc,must_exist,permanent",
    [
        (REFUSED_LOGIN, False, True),
        (NO_VHOST, False, True),
        (NO_QUEUE, False, False),  # e.g. a deleted exchange: re-declaring cures it
        (NO_QUEUE, True, True),  # a passive declare / Basic.Get: it must exist
        (ConnectionForced("CONNECTION_FORCED - broker forced connection closure", None, None), False, False),
        (ConnectionRefusedError(111, "Connection refused"), False, False),
        (PreconditionFailed("PRECONDITION_FAILED - inequivalent arg", None, None), False, False),
        (AccessRefusedError("mapped already"), False, True),
    ],
)
def test_is_permanent(exc, must_exist, permanent):
    assert is_permanent(exc, must_exist=must_exist) is permanent


def test_map_exception_builds_the_typed_error_with_the_reply_and_a_masked_url():
    error = map_exception(NO_VHOST, url="amqp://guest:hunter2@host:5672/x")
    assert isinstance(error, AccessRefusedError) and isinstance(error, BrokerRefusedError)
    assert (error.reply_code, error.method) == (530, "Connection.open")
    assert error.reply_text == "NOT_ALLOWED - vhost x not found"
    assert "hunter2" not in str(error) and "guest:***@host" in str(error)
    not_found = map_exception(NO_QUEUE, must_exist=True)
    assert isinstance(not_found, NotFoundError) and not_found.reply_code == 404
    assert map_exception(NO_QUEUE) is None
    assert map_exception(ConnectionRefusedError(111, "refused")) is None


def test_map_exceptions_raises_the_mapped_error_chained_and_lets_transient_errors_through():
    with pytest.raises(AccessRefusedError) as info:
        with map_exceptions():
            raise REFUSED_LOGIN
    assert info.value.__cause__ is REFUSED_LOGIN
    with pytest.raises(ConnectionRefusedError):
        with map_exceptions():
            raise ConnectionRefusedError(111, "refused")
    with pytest.raises(NotFoundError):
        with map_exceptions(must_exist=True):
            raise NO_QUEUE


def test_connection_error_masks_the_password():
    error = connection_error("amqp://u:hunter2@h//", OSError("refused"), 3, 4.96)
    assert "hunter2" not in str(error) and "after 3 attempts in 5.0s" in str(error)


@pytest.mark.parametrize(
    "shown,requested,expected",
    [
        ("none", "x", (False, None)),
        ("the value '1000' of type 'signedint'", None, (True, 1000)),
        ("the value 'ojs.exchange.dlx' of type 'longstr'", None, (True, "ojs.exchange.dlx")),
        ("the value 'it''s' of type 'longstr'", None, (True, "it''s")),
        ("the value 'true' of type 'bool'", None, (True, True)),
        ("the value '1.5' of type 'double'", None, (True, 1.5)),
        ("'other'", "mine", (True, "other")),  # same type on both sides: RabbitMQ omits it
        ("'10'", 5, (True, 10)),
        ("'false'", True, (True, False)),
    ],
)
def test_existing_value_reads_rabbitmqs_406_reply(shown, requested, expected):
    assert existing_value(shown, requested) == expected


@pytest.mark.parametrize("shown", ["the value '[]' of type 'array'", "the value 'x' of type 'timestamp'", "garbled"])
def test_existing_value_refuses_what_it_cannot_declare_back(shown):
    with pytest.raises(Exception) as info:
        existing_value(shown, None)
    assert not isinstance(info.value, OjsError)  # internal: the probe stops and the fallback applies


def test_parse_precondition_failed_names_the_argument():
    reply = (
        "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'ojs.queue.email' in "
        "vhost '/': received the value 'ojs.exchange.dlx' of type 'longstr' but current is none"
    )
    conflict = parse_precondition_failed("ojs.queue.email", reply)
    [difference] = conflict.differences
    assert difference.argument == "x-dead-letter-exchange"
    assert difference.requested == "the value 'ojs.exchange.dlx' of type 'longstr'"
    assert difference.existing == "none"


def test_on_conflict_is_a_literal_checked_at_runtime():
    assert ON_CONFLICT_CHOICES == ("use-existing", "raise")
    with pytest.raises(ValidationError) as info:
        Topology(on_conflict="ignore")  # type: ignore[arg-type]
    assert info.value.field == "on_conflict"


def test_enqueue_options_are_the_keyword_options_of_job_create():
    keyword_only = [name for name, p in inspect.signature(Job.create).parameters.items() if p.kind is p.KEYWORD_ONLY]
    assert list(typing.get_type_hints(JobOptions)) == keyword_only
    options = inspect.signature(Client.enqueue).parameters["options"]
    assert options.kind is options.VAR_KEYWORD and "Unpack[JobOptions]" in str(options.annotation)
