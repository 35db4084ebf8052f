"""The control service: CANCEL, pause, resume (published to a queue's control stream) and INFO (an RPC).

Every control message goes to ``ojs.exchange.direct`` with key ``control.{queue}``
(confirmed, mandatory) and lands in the control stream ``ojs.queue.control.{queue}``,
which every worker of the queue reads (binding §5.6–§5.8, DESIGN §14).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime

from amqp import Message
from kombu.connection import Connection

from ojs_kombu.amqp.connection import close_quietly
from ojs_kombu.amqp.publisher import ConfirmedPublisher
from ojs_kombu.client.session import Service
from ojs_kombu.errors import DecodeError, ValidationError
from ojs_kombu.model.info import JobInfo
from ojs_kombu.model.naming import validate_queue_name
from ojs_kombu.wire.codec import OutgoingMessage
from ojs_kombu.wire.control import (
    cancel_message,
    control_job_id,
    decode_info_reply,
    info_message,
    pause_message,
)

logger = logging.getLogger(__name__)

#: Seconds :meth:`Client.info` keeps listening after the first answer that is not ``active``
#: (other workers of the queue may know the job better).
INFO_SETTLE_WINDOW = 0.2

_EPOCH = datetime.fromtimestamp(0, UTC)


def best_answer(answers: Iterable[JobInfo]) -> JobInfo | None:
    """The answer :meth:`Client.info` returns among several workers': an ``active`` one, else the
    latest outcome (by ``finished_at``), else None."""
    ranked = sorted(
        answers,
        key=lambda a: (a.state == "active", (a.finished_at or a.started_at or _EPOCH).timestamp()),
    )
    return ranked[-1] if ranked else None


class Control(Service):
    """Publishes control messages and asks INFO through the client's session (see :class:`~ojs_kombu.Client`)."""

    def cancel(self, job_id: str, queue: str) -> None:
        """CANCEL job ``job_id`` of ``queue`` (:meth:`ojs_kombu.Client.cancel`)."""
        validate_queue_name(queue)
        self.publish(queue, cancel_message(job_id))

    def pause(self, queue: str, *, paused: bool = True) -> None:
        """Pause (or with ``paused=False`` resume) ``queue`` (:meth:`ojs_kombu.Client.pause`)."""
        self.publish(queue, pause_message(queue, paused=paused))

    def publish(self, queue: str, message: OutgoingMessage) -> None:
        """Publish a control ``message`` to the control stream of ``queue`` (confirmed, mandatory).

        Raises:
            UnroutableError, PublishNackedError, PublishTimeoutError: the broker did not take it.
            BrokerConnectionError, BrokerRefusedError: as for :meth:`ojs_kombu.Client.enqueue`.
        """

        def publish(conn: Connection) -> None:
            publisher = self.session.publisher(conn)
            if self.session.declare:
                self.session.topology.ensure_queue(conn.connection, queue)
            self._publish_on(publisher, queue, message)

        self.session.run(publish)

    def _publish_on(self, publisher: ConfirmedPublisher, queue: str, message: OutgoingMessage) -> None:
        """Publish ``message`` to the control stream of ``queue`` and wait for its confirm."""
        session = self.session
        ticket = publisher.publish(
            message,
            exchange=session.names.direct_exchange,
            routing_key=session.names.control_routing_key(queue),
            queue=queue,
            job_id=message.properties["message_id"],
            confirm_timeout=session.confirm_timeout,
        )
        publisher.wait([ticket], session.confirm_timeout)
        ticket.raise_for_error()

    def info(self, job_id: str, queue: str, timeout: float) -> JobInfo | None:
        """INFO: what the live workers of ``queue`` know about ``job_id`` (:meth:`ojs_kombu.Client.info`)."""
        validate_queue_name(queue)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValidationError(f"timeout must be a number of seconds > 0, got {timeout!r}", field="timeout")
        control_job_id(job_id)  # refused before any I/O
        return self.session.run(lambda conn: self._ask_info(conn, job_id, queue, float(timeout)))

    def _ask_info(self, conn: Connection, job_id: str, queue: str, timeout: float) -> JobInfo | None:
        """One INFO round trip on ``conn``: a server-named reply queue, the request, the answers."""
        deadline = time.monotonic() + timeout
        publisher = self.session.publisher(conn)
        if self.session.declare:
            self.session.topology.ensure_queue(conn.connection, queue)
        channel = conn.connection.channel()
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
            self._publish_on(publisher, queue, info_message(job_id, reply_to=reply_to, correlation_id=correlation_id))
            settling = False
            while not any(answer.state == "active" for answer in answers):
                if answers and not settling:  # other workers may know better: listen a little longer
                    settling = True
                    deadline = min(deadline, time.monotonic() + INFO_SETTLE_WINDOW)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    conn.connection.drain_events(timeout=remaining)
                except TimeoutError:
                    continue  # the loop ends on the deadline
        finally:
            close_quietly(channel)  # the reply queue goes with it (exclusive, auto-delete)
        return best_answer(answers)


__all__ = ["INFO_SETTLE_WINDOW", "Control", "best_answer"]
