"""The control service: CANCEL, pause, resume (published to a queue's control stream) and INFO (an RPC).

Every control message goes to ``ojs.exchange.direct`` with key ``control.{queue}``
(confirmed, mandatory) and lands in the control stream ``ojs.queue.control.{queue}``,
which every worker of the queue reads (binding §5.6–§5.8, DESIGN §14).
"""

from __future__ import annotations

from kombu.connection import Connection

from ojs_kombu.amqp.info import INFO_SETTLE_WINDOW, ask_info, best_answer, publish_control
from ojs_kombu.amqp.publisher import ConfirmedPublisher
from ojs_kombu.client.session import Service
from ojs_kombu.errors import ValidationError
from ojs_kombu.model.info import JobInfo
from ojs_kombu.model.naming import validate_queue_name
from ojs_kombu.wire.codec import OutgoingMessage
from ojs_kombu.wire.control import cancel_message, control_job_id, pause_message


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
        publish_control(publisher, self.session.names, queue, message, self.session.confirm_timeout)

    def info(self, job_id: str, queue: str, timeout: float) -> JobInfo | None:
        """INFO: what the live workers of ``queue`` know about ``job_id`` (:meth:`ojs_kombu.Client.info`)."""
        validate_queue_name(queue)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValidationError(f"timeout must be a number of seconds > 0, got {timeout!r}", field="timeout")
        control_job_id(job_id)  # refused before any I/O
        return self.session.run(lambda conn: self._ask_info(conn, job_id, queue, float(timeout)))

    def _ask_info(self, conn: Connection, job_id: str, queue: str, timeout: float) -> JobInfo | None:
        """One INFO round trip on ``conn`` (:func:`~ojs_kombu.amqp.info.ask_info`)."""
        publisher = self.session.publisher(conn)
        if self.session.declare:
            self.session.topology.ensure_queue(conn.connection, queue)
        names, confirm_timeout = self.session.names, self.session.confirm_timeout
        return ask_info(
            conn.connection, publisher, names, job_id, queue, timeout=timeout, confirm_timeout=confirm_timeout
        )


__all__ = ["INFO_SETTLE_WINDOW", "Control", "best_answer"]
