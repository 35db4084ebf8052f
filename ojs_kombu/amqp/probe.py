"""Learning every argument in which an existing queue differs from the one a :class:`~ojs_kombu.amqp.topology.Topology`
declares (DESIGN §4).

RabbitMQ's ``406`` names only the first inequivalent argument it finds.  :func:`probe_queue`
re-declares the queue, on fresh channels, with the existing value of each argument the broker
named (:func:`~ojs_kombu.amqp.refusals.existing_value`) until the broker accepts: that
declaration is equivalent to the existing queue, so it changes nothing, and every difference
has been named on the way.
"""

from __future__ import annotations

import logging
from typing import Any

from amqp import Channel, Connection
from amqp.exceptions import PreconditionFailed

from ojs_kombu.amqp.connection import close_quietly
from ojs_kombu.amqp.refusals import UnreadableValue, existing_value, parse_precondition_failed
from ojs_kombu.errors import ArgumentDifference, TopologyConflictError
from ojs_kombu.wire.entities import QueueSpec, normalise_arguments

logger = logging.getLogger("ojs_kombu.amqp.topology")

# Queue.Declare flags RabbitMQ may name as inequivalent; the others are x- arguments.
_FLAGS = frozenset({"durable", "auto_delete"})
_MAX_PROBES = 16  # more than the number of queue arguments RabbitMQ compares


def reply_text(exc: BaseException) -> str:
    return str(getattr(exc, "reply_text", "") or exc)


def _real_differences(spec: QueueSpec, differences: list[ArgumentDifference]) -> list[ArgumentDifference]:
    """The ``differences`` that are not only of form: compared with :func:`normalise_arguments`.

    RabbitMQ up to 4.2 compares arguments literally (``x-max-age`` ``"60m"`` differs from ``"1h"``)
    and 4.x names ``x-queue-type`` ``'classic'`` where nothing was sent; what means the same is no
    difference, so every version gives the same answer.
    """
    ours = normalise_arguments(spec.argument_dict)
    real = []
    for difference in differences:
        name = difference.argument
        if name in _FLAGS:
            real.append(difference)
            continue
        try:
            present, value = existing_value(difference.existing, spec.argument_dict.get(name), name)
        except (UnreadableValue, ValueError):
            real.append(difference)
            continue
        theirs = normalise_arguments({name: value} if present else {}).get(name)
        if theirs != ours.get(name):
            real.append(difference)
    return real


def _queue_declare(channel: Channel, name: str, arguments: dict[str, Any], flags: dict[str, bool]) -> None:
    channel.queue_declare(
        name,
        durable=flags.get("durable", True),
        exclusive=False,
        auto_delete=flags.get("auto_delete", False),
        arguments=arguments or None,
    )


def probe_queue(
    connection: Connection, spec: QueueSpec, conflict: TopologyConflictError
) -> tuple[TopologyConflictError, Channel | None]:
    """Learn every argument in which the existing queue differs from ``spec`` (see the module docstring).

    Returns the conflict with all differences found, and the open channel of the
    declaration the broker accepted (``None`` when a reply could not be read).
    """
    arguments = dict(spec.argument_dict)
    flags: dict[str, bool] = {}
    differences = list(conflict.differences)
    for _ in range(_MAX_PROBES):
        if not differences:
            break
        last = differences[-1]
        try:
            if last.argument in _FLAGS:
                present, value = existing_value(last.existing, True)
                flags[last.argument] = bool(value) if present else False
            else:
                present, value = existing_value(last.existing, arguments.get(last.argument), last.argument)
                if present:
                    arguments[last.argument] = value
                else:
                    arguments.pop(last.argument, None)
        except (UnreadableValue, ValueError):
            break
        channel = connection.channel()
        try:
            _queue_declare(channel, spec.name, arguments, flags)
        except PreconditionFailed as exc:
            more = parse_precondition_failed(spec.name, reply_text(exc)).differences
            if not more or any(d.argument == more[0].argument for d in differences):
                break  # not read, or not cured by the existing value: give up probing
            differences.extend(more)
            continue
        except BaseException:
            close_quietly(channel)
            raise
        found = TopologyConflictError(spec.name, _real_differences(spec, differences), conflict.reply_text)
        return found, channel
    logger.info("could not learn every argument in which %r differs; known: %s", spec.name, differences)
    return TopologyConflictError(spec.name, differences, conflict.reply_text), None


__all__ = ["probe_queue", "reply_text"]
