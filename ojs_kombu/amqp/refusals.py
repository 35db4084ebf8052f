"""What RabbitMQ's refusals of a declaration say (DESIGN §4): pure reading of 406 reply texts.

A ``406 PRECONDITION_FAILED`` names the first argument in which a queue or exchange differs
from the existing one (``inequivalent arg``): :func:`parse_precondition_failed` turns it into a
:class:`~ojs_kombu.errors.TopologyConflictError` and :func:`existing_value` reads the existing
value back in the type that can be re-declared.  A ``406 invalid arg`` says the broker does not
accept an argument on that type of queue at all: :func:`parse_invalid_argument` turns it into a
:class:`~ojs_kombu.errors.QueueArgumentRefusedError` with what to do instead, and
:func:`check_arguments` raises the same before anything is sent, for the versions known to refuse.
:class:`~ojs_kombu.amqp.topology.Topology` acts on what these say.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ojs_kombu.amqp.version import Version
from ojs_kombu.errors import ArgumentDifference, QueueArgumentRefusedError, TopologyConflictError
from ojs_kombu.wire.entities import QueueSpec, Spec

_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<arg>[^']+)' for (?:queue|exchange) '(?P<name>[^']+)' in vhost '[^']*': "
    r"received (?P<requested>.+?) but current is (?P<existing>.+)$"
)
# How RabbitMQ shows one side of an inequivalent argument: "none", "'v'" (same type on both
# sides) or "the value 'v' of type 't'".
_TYPED_VALUE = re.compile(r"^the value '(?P<value>.*)' of type '(?P<type>[a-z]+)'$", re.DOTALL)
_SAME_TYPE_VALUE = re.compile(r"^'(?P<value>.*)'$", re.DOTALL)
_INTEGER_TYPES = frozenset(
    {"byte", "unsignedbyte", "short", "unsignedshort", "signedint", "unsignedint", "long", "longlong"}
)
# The AMQP type of arguments whose existing value a 406 shows as 'v' while this side sent none:
# RabbitMQ 4.x puts its default in place of an absent x-queue-type ("received 'classic' but
# current is 'quorum'"), so both sides have the default's type.
_ARGUMENT_KINDS = {
    **dict.fromkeys(
        (
            "x-queue-type",
            "x-overflow",
            "x-dead-letter-exchange",
            "x-dead-letter-routing-key",
            "x-dead-letter-strategy",
            "x-max-age",
            "x-queue-leader-locator",
        ),
        "longstr",
    ),
    **dict.fromkeys(
        (
            "x-message-ttl",
            "x-expires",
            "x-max-length",
            "x-max-length-bytes",
            "x-max-priority",
            "x-delivery-limit",
            "x-consumer-timeout",
            "x-stream-max-segment-size-bytes",
        ),
        "long",
    ),
}

_INVALID_ARG = re.compile(
    r"invalid arg '(?P<arg>[^']+)' for queue '(?P<name>[^']+)' in vhost '[^']*'"
    r"(?: of queue type (?P<type>\w+)|: (?P<reason>.+))?"
)
_QUEUE_TYPE_MODULES = {
    "rabbit_classic_queue": "classic",
    "rabbit_quorum_queue": "quorum",
    "rabbit_stream_queue": "stream",
}
_CONSUMER_TIMEOUT_ON_CLASSIC = (
    "RabbitMQ 4.3 evaluates no consumer timeout on classic queues (rabbitmq-server#16983): it refuses "
    "x-consumer-timeout on them (4.3.2 and later; 4.3.0 and 4.3.1 ignore it), and a consumer-timeout policy "
    "is accepted but has no effect, so a classic queue never takes a delivery back however long its job runs. "
    "Drop consumer_timeout (x-consumer-timeout) if it was there to let long jobs run; for a timeout that takes "
    "a stuck worker's job back, use queue_type='quorum'"
)
# Queue arguments a range of RabbitMQ versions refuses (or ignores) on a type of queue, checked
# before the declaration is sent: (argument, queue type) -> (first version, first version not
# known to, what to do).  Later versions are left to the broker, whose refusal (406 invalid arg)
# gets the same error and hint.
_REFUSED_ARGUMENTS: dict[tuple[str, str], tuple[Version, Version, str]] = {
    ("x-consumer-timeout", "classic"): ((4, 3, 0), (4, 4, 0), _CONSUMER_TIMEOUT_ON_CLASSIC),
}


def parse_precondition_failed(entity: str, reply_text: str) -> TopologyConflictError:
    """Turn RabbitMQ's 406 reply text into a TopologyConflictError naming the differing argument."""
    differences = []
    match = _INEQUIVALENT.search(reply_text or "")
    if match:
        differences.append(ArgumentDifference(match["arg"], match["requested"], match["existing"]))
    return TopologyConflictError(entity, differences, reply_text or "")


def _version_text(version: Version | None) -> str:
    return ".".join(map(str, version)) if version else ""


def _argument_refused(
    entity: str, argument: str, queue_type: str, version: Version | None, *, reply_text: str = "", reason: str = ""
) -> QueueArgumentRefusedError:
    """The error for ``argument`` refused on queue ``entity`` of ``queue_type``, with what to do about it."""
    known = _REFUSED_ARGUMENTS.get((argument, queue_type))
    shown = _version_text(version)
    broker = f"RabbitMQ {shown}" if shown else "the broker"
    of_type = f" {queue_type}" if queue_type else ""
    why = f" ({reason})" if reason else ""
    hint = known[2] if known else "remove it from the queue's options, or declare another type of queue"
    message = f"{broker} does not accept {argument} on the{of_type} queue {entity!r}{why}: {hint}"
    if reply_text:
        message += f" (the broker said: 406 {reply_text})"
    return QueueArgumentRefusedError(
        message,
        entity=entity,
        argument=argument,
        queue_type=queue_type,
        broker_version=shown,
        reply_code=406 if reply_text else 0,
        reply_text=reply_text,
    )


def parse_invalid_argument(reply_text: str, version: Version | None = None) -> QueueArgumentRefusedError | None:
    """Turn RabbitMQ's 406 ``invalid arg`` reply into a :class:`~ojs_kombu.errors.QueueArgumentRefusedError`.

    Parameters:
        reply_text: the 406 reply, e.g. ``invalid arg 'x-consumer-timeout' for queue 'q' in vhost '/'
            of queue type rabbit_classic_queue``.
        version: the broker's version, named in the message.

    Returns:
        The error, or ``None`` when the reply is not an ``invalid arg`` one (an inequivalent argument).
    """
    match = _INVALID_ARG.search(reply_text or "")
    if match is None:
        return None
    queue_type = _QUEUE_TYPE_MODULES.get(match["type"] or "", match["type"] or "")
    return _argument_refused(
        match["name"], match["arg"], queue_type, version, reply_text=reply_text, reason=match["reason"] or ""
    )


def check_arguments(specs: Iterable[Spec], version: Version | None) -> None:
    """Refuse, before anything is sent, a queue argument that RabbitMQ ``version`` refuses on its type of queue.

    Only queues whose type the declaration names are checked (one declared without
    ``x-queue-type`` gets the virtual host's default type, unknown here): the broker's own
    refusal of the others gets the same error.

    Parameters:
        specs: the declarations about to be sent.
        version: the broker's version (``None``: unknown, nothing is checked).

    Raises:
        QueueArgumentRefusedError: e.g. ``x-consumer-timeout`` on a classic queue of RabbitMQ 4.3.
    """
    if version is None:
        return
    for spec in specs:
        if not isinstance(spec, QueueSpec):
            continue
        arguments = spec.argument_dict
        queue_type = arguments.get("x-queue-type")
        for (argument, refused_type), (since, until, _) in _REFUSED_ARGUMENTS.items():
            if argument in arguments and queue_type == refused_type and since <= version < until:
                raise _argument_refused(spec.name, argument, refused_type, version)


class UnreadableValue(Exception):
    """A value in a 406 reply this module cannot turn back into an argument."""


def existing_value(shown: str, requested: Any, argument: str = "") -> tuple[bool, Any]:
    """The existing value of an argument as RabbitMQ shows it in a 406 reply.

    Parameters:
        shown: the ``current is …`` part: ``none``, ``'v'`` or ``the value 'v' of type 't'``.
        requested: the value this side declared (its type is the existing one's in the ``'v'`` form).
        argument: the argument's name: in the ``'v'`` form without a ``requested`` value (RabbitMQ
            4.x compared its default, e.g. of ``x-queue-type``), its known type is the existing one's.

    Returns:
        ``(False, None)`` when the existing entity has no such argument, else ``(True, value)``.

    Raises:
        UnreadableValue: a type that cannot be declared back exactly (tables, arrays, timestamps ...).
    """
    if shown == "none":
        return False, None
    typed = _TYPED_VALUE.match(shown)
    if typed:
        text, kind = typed["value"], typed["type"]
    else:
        same = _SAME_TYPE_VALUE.match(shown)
        if same is None:
            raise UnreadableValue(shown)
        text = same["value"]
        kind = {bool: "bool", int: "long", float: "double", str: "longstr"}.get(type(requested), "")
        if requested is None:
            kind = _ARGUMENT_KINDS.get(argument, "")
    if kind == "longstr":
        return True, text
    if kind in _INTEGER_TYPES:
        return True, int(text)
    if kind == "bool" and text in ("true", "false"):
        return True, text == "true"
    if kind in ("double", "float"):
        return True, float(text)
    raise UnreadableValue(shown)


__all__ = [
    "UnreadableValue",
    "check_arguments",
    "existing_value",
    "parse_invalid_argument",
    "parse_precondition_failed",
]
