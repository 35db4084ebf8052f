"""INFO over AMQP: one round trip asking a queue's workers what they know about a job (binding §5.8).

Shared by the Client (:meth:`ojs_kombu.Client.info`, a ``replace``'s wait) and the ``ojs://``
transport (a Celery producer's ``replace``): a server-named exclusive reply queue, the INFO
request on the queue's control stream, the answers collected.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from amqp import Message

from ojs_kombu.amqp.connection import close_quietly
from ojs_kombu.amqp.publisher import ConfirmedPublisher
from ojs_kombu.errors import DecodeError
from ojs_kombu.model.info import JobInfo
from ojs_kombu.model.naming import Names
from ojs_kombu.wire.codec import OutgoingMessage
from ojs_kombu.wire.control import decode_info_reply, info_message

logger = logging.getLogger(__name__)

#: Seconds an INFO keeps listening after the first answer that is not ``active``
#: (other workers of the queue may know the job better).
INFO_SETTLE_WINDOW = 0.2

_EPOCH = datetime.fromtimestamp(0, UTC)


def best_answer(answers: Iterable[JobInfo]) -> JobInfo | None:
    """The answer an INFO returns among several workers': an ``active`` one, else the
    latest outcome (by ``finished_at``), else None."""
    ranked = sorted(
        answers,
        key=lambda a: (a.state == "active", (a.finished_at or a.started_at or _EPOCH).timestamp()),
    )
    return ranked[-1] if ranked else None


def publish_control(
    publisher: ConfirmedPublisher, names: Names, queue: str, message: OutgoingMessage, confirm_timeout: float
) -> None:
    """Publish a control ``message`` to the control stream of ``queue`` (confirmed, mandatory) and wait for its confirm.

    Parameters:
        publisher: the connection's confirmed publisher.
        names: the deployment's names.
        queue: the OJS queue.
        message: the control message.
        confirm_timeout: seconds to wait for the confirm.

    Raises:
        UnroutableError, PublishNackedError, PublishTimeoutError: the broker did not take it.
    """
    ticket = publisher.publish(
        message,
        exchange=names.direct_exchange,
        routing_key=names.control_routing_key(queue),
        queue=queue,
        job_id=message.properties["message_id"],
        confirm_timeout=confirm_timeout,
    )
    publisher.wait([ticket], confirm_timeout)
    ticket.raise_for_error()


def ask_info(
    connection: Any,
    publisher: ConfirmedPublisher,
    names: Names,
    job_id: str,
    queue: str,
    *,
    timeout: float,
    confirm_timeout: float,
) -> JobInfo | None:
    """One INFO round trip on ``connection``: a server-named reply queue, the request, the answers.

    Listens until a worker answers ``active``, ``INFO_SETTLE_WINDOW`` s after the first other
    answer, or ``timeout`` s; the queue's control stream must exist.

    Parameters:
        connection: the py-amqp connection (its events are drained while waiting).
        publisher: the connection's confirmed publisher (the request is published with it).
        names: the deployment's names.
        job_id: the job asked about.
        queue: its OJS queue.
        timeout: seconds to wait for answers.
        confirm_timeout: seconds to wait for the request's confirm.

    Returns:
        :func:`best_answer` of the answers, or None when no worker answered.

    Raises:
        UnroutableError, PublishNackedError, PublishTimeoutError: the broker did not take the request.
    """
    deadline = time.monotonic() + timeout
    channel = connection.channel()
    channel.auto_decode = False
    answers: list[JobInfo] = []
    correlation_id = str(uuid.uuid4())

    def on_reply(message: Message) -> None:
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8")
        try:
            correlation, answer = decode_info_reply(body, dict(message.properties))
        except DecodeError as exc:
            logger.warning("ignoring an unreadable INFO reply: %s", exc)
            return
        if correlation == correlation_id:
            answers.append(answer)

    try:
        reply_to, _, _ = channel.queue_declare("", durable=False, exclusive=True, auto_delete=True)
        channel.basic_consume(reply_to, no_ack=True, callback=on_reply)
        request = info_message(job_id, reply_to=reply_to, correlation_id=correlation_id)
        publish_control(publisher, names, queue, request, confirm_timeout)
        settling = False
        while not any(answer.state == "active" for answer in answers):
            if answers and not settling:  # other workers may know better: listen a little longer
                settling = True
                deadline = min(deadline, time.monotonic() + INFO_SETTLE_WINDOW)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                connection.drain_events(timeout=remaining)
            except TimeoutError:
                continue  # the loop ends on the deadline
    finally:
        close_quietly(channel)  # the reply queue goes with it (exclusive, auto-delete)
    return best_answer(answers)


__all__ = ["INFO_SETTLE_WINDOW", "ask_info", "best_answer", "publish_control"]
