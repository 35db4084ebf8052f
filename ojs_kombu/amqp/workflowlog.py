"""A workflow's record on RabbitMQ alone: its definition and every step's outcome, in one stream.

Each root workflow has a stream ``ojs.workflow.{id}.log`` (:meth:`Names.workflow_log_stream`),
declared by :meth:`WorkflowLog.open` when the workflow is enqueued, with a first record holding its
definition (``workflow_to_dict``).  Every job of the workflow that ends for good appends one
``step`` record (path, state, result or error, job id); the end of the workflow appends a
``finished`` record; ``Client.cancel_workflow`` a ``cancelled`` record, after declaring the
workflow's cancel marker (:meth:`WorkflowLog.mark_cancelled`).  :meth:`WorkflowLog.read` reads the
stream from its first record to a marker it appends itself, so it sees every record confirmed
before the call.

A stream is read without being consumed, by any number of readers, and survives a broker restart;
records are appended with publisher confirms.  Retention is :data:`~ojs_kombu.amqp.fanin.STREAM_MAX_AGE`
(RabbitMQ refuses ``x-expires`` on a stream): the state of a workflow can be read for 7 days.
A :class:`WorkflowLog` uses one py-amqp connection from one thread.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson
from amqp import Connection
from amqp.exceptions import NotFound

from ojs_kombu.amqp.connection import close_quietly
from ojs_kombu.amqp.errors import map_exceptions
from ojs_kombu.amqp.fanin import STREAM_MAX_AGE, STREAM_SEGMENT_BYTES
from ojs_kombu.amqp.publisher import ConfirmedPublisher, PublishTicket
from ojs_kombu.errors import NotFoundError, PublishTimeoutError, UnroutableError
from ojs_kombu.model.naming import Names
from ojs_kombu.wire.codec import OutgoingMessage

_READ_TIMEOUT: Final = 30.0
#: ``x-expires`` of a workflow's cancel marker: 7 days (as long as its record stream is kept).
CANCEL_MARKER_EXPIRES_MS: Final = 7 * 24 * 3600 * 1000


class WorkflowLog:
    """Append to and read the record stream of workflows.

    Parameters:
        connection: a connected py-amqp connection, used from this thread only.
        names: the deployment's entity names.
    """

    def __init__(self, connection: Connection, *, names: Names | None = None):
        self.connection = connection
        self.names = names if names is not None else Names()
        self._publisher = ConfirmedPublisher(connection)

    def open(self, workflow_id: str, definition: Mapping[str, Any]) -> None:
        """Declare the workflow's stream and record its definition (before any of its jobs is published).

        Parameters:
            workflow_id: the root workflow's id.
            definition: ``workflow_to_dict(workflow)``.

        Raises:
            PublishError: the record was not confirmed.
        """
        stream = self.names.workflow_log_stream(workflow_id)
        arguments = {
            "x-queue-type": "stream",
            "x-max-age": STREAM_MAX_AGE,
            "x-stream-max-segment-size-bytes": STREAM_SEGMENT_BYTES,
        }
        channel = self.connection.channel()
        try:
            with map_exceptions():
                channel.queue_declare(stream, durable=True, auto_delete=False, arguments=arguments)
        finally:
            close_quietly(channel)
        self.append(workflow_id, {"kind": "definition", "workflow": dict(definition)})

    def append(self, workflow_id: str, record: Mapping[str, Any]) -> None:
        """Append ``record`` (a JSON object) to the workflow's stream, confirmed.

        Parameters:
            workflow_id: the root workflow's id.
            record: what to append.

        Raises:
            NotFoundError: the workflow has no stream (it was not enqueued by ``Client.enqueue_workflow``).
            PublishError: the record was not confirmed.
        """
        self.append_many([(workflow_id, record)])

    def append_many(self, records: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
        """Append each ``(workflow id, record)``: every one published, then one wait for their confirms.

        Parameters:
            records: what to append, to which workflow's stream (in order per stream).

        Raises:
            NotFoundError: a workflow has no stream (it was not enqueued by ``Client.enqueue_workflow``).
            PublishError: a record was not confirmed.
        """
        self.settle(self.publish_many(records))

    def publish_many(self, records: Sequence[tuple[str, Mapping[str, Any]]]) -> list[PublishTicket]:
        """:meth:`append_many` without waiting: the records are sent, :meth:`settle` waits for them.

        Parameters:
            records: what to append, to which workflow's stream.

        Returns:
            Their tickets, for :meth:`settle`.
        """
        tickets = []
        for workflow_id, record in records:
            stream = self.names.workflow_log_stream(workflow_id)
            record_id = str(uuid.uuid4())
            message = OutgoingMessage(
                orjson.dumps(dict(record)),
                {"message_id": record_id, "delivery_mode": 2, "content_type": "application/json"},
            )
            tickets.append(
                self._publisher.publish(message, exchange="", routing_key=stream, queue=stream, job_id=record_id)
            )
        return tickets

    def settle(self, tickets: Sequence[PublishTicket]) -> None:
        """Wait for the confirms of :meth:`publish_many`'s records.

        Parameters:
            tickets: what :meth:`publish_many` returned.

        Raises:
            NotFoundError: a workflow has no stream.
            PublishError: a record was not confirmed.
        """
        self._publisher.wait(tickets)
        for ticket in tickets:
            if isinstance(ticket.error, UnroutableError):
                raise NotFoundError(
                    f"no workflow record stream {ticket.queue!r}", reply_code=404, method="Basic.Publish"
                )
            ticket.raise_for_error()

    def read(self, workflow_id: str) -> list[dict[str, Any]]:
        """Every record of the workflow's stream, oldest first.

        Parameters:
            workflow_id: the root workflow's id.

        Returns:
            The records (JSON objects), the markers of earlier reads left out.

        Raises:
            NotFoundError: no such workflow.
            PublishError: the read's marker did not come back within 30 s.
        """
        stream = self.names.workflow_log_stream(workflow_id)
        channel = self.connection.channel()
        try:
            try:
                channel.queue_declare(stream, passive=True)
            except NotFound:
                raise NotFoundError(f"workflow {workflow_id} not found", reply_code=404) from None
            marker = str(uuid.uuid4())
            self.append(workflow_id, {"kind": "read", "marker": marker})
            records: list[dict[str, Any]] = []
            done = False

            def on_message(message: Any) -> None:
                nonlocal done
                channel.basic_ack(message.delivery_tag)
                try:
                    record = orjson.loads(message.body)
                except orjson.JSONDecodeError:
                    return
                if not isinstance(record, dict):
                    return
                if record.get("kind") == "read":
                    done = done or record.get("marker") == marker
                    return
                if not done:
                    records.append(record)

            channel.basic_qos(0, 500, False)
            tag = channel.basic_consume(stream, callback=on_message, arguments={"x-stream-offset": "first"})
            deadline = time.monotonic() + _READ_TIMEOUT
            while not done:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PublishTimeoutError(f"the workflow stream {stream} did not answer in {_READ_TIMEOUT} s")
                try:
                    self.connection.drain_events(timeout=min(left, 1.0))
                except TimeoutError:
                    continue
            # Records appended meanwhile are still on their way: after Cancel-Ok none is, so the
            # channel closes with no delivery left to ignore (py-amqp warns about each).
            channel.basic_cancel(tag)
            return records
        finally:
            close_quietly(channel)

    def mark_cancelled(self, workflow_id: str) -> None:
        """Declare the workflow's cancel marker (:meth:`Names.workflow_cancel_queue`; idempotent).

        A durable classic queue that holds nothing: it exists, which :meth:`cancelled` asks with a
        passive declare (one round trip), far cheaper than reading the record stream on every step.
        It removes itself after :data:`CANCEL_MARKER_EXPIRES_MS` unused, the record stream's retention.

        Parameters:
            workflow_id: the root workflow's id.

        Raises:
            BrokerRefusedError: the broker refused the declaration.
        """
        channel = self.connection.channel()
        try:
            with map_exceptions():
                channel.queue_declare(
                    self.names.workflow_cancel_queue(workflow_id), durable=True, auto_delete=False,
                    arguments={"x-expires": CANCEL_MARKER_EXPIRES_MS},
                )  # fmt: skip
        finally:
            close_quietly(channel)

    def cancelled(self, workflow_id: str) -> bool:
        """Whether the workflow was cancelled (its cancel marker exists).

        Parameters:
            workflow_id: the root workflow's id.

        Returns:
            True once ``Client.cancel_workflow`` declared the marker.
        """
        channel = self.connection.channel()
        try:
            channel.queue_declare(self.names.workflow_cancel_queue(workflow_id), passive=True)
            return True
        except NotFound:
            return False
        finally:
            close_quietly(channel)

    def delete(self, workflow_id: str) -> None:
        """Delete the workflow's stream (idempotent).

        Parameters:
            workflow_id: the root workflow's id.
        """
        channel = self.connection.channel()
        try:
            channel.queue_delete(self.names.workflow_log_stream(workflow_id))
        except NotFound:
            pass
        finally:
            close_quietly(channel)

    def sweep(self, workflow_id: str) -> None:
        """:func:`sweep_workflow` on this object's connection.

        Parameters:
            workflow_id: the root workflow's id.

        Raises:
            BrokerRefusedError: the broker refused a deletion.
        """
        sweep_workflow(self.connection, self.names, workflow_id)

    def close(self) -> None:
        """Close this object's publisher channel (not the connection)."""
        self._publisher.close()


def sweep_workflow(connection: Connection, names: Names, workflow_id: str) -> None:
    """Delete a workflow's record stream and its cancel marker, if any (idempotent): an ended
    workflow's clean-up (its ``ojs.workflow.sweep`` job); ``Client.workflow(id)`` then raises
    ``NotFoundError``.

    Parameters:
        connection: a connected py-amqp connection.
        names: the deployment's entity names.
        workflow_id: the root workflow's id.

    Raises:
        BrokerRefusedError: the broker refused a deletion.
    """
    channel = connection.channel()
    try:
        with map_exceptions():
            channel.queue_delete(names.workflow_log_stream(workflow_id))
            channel.queue_delete(names.workflow_cancel_queue(workflow_id))
    finally:
        close_quietly(channel)


__all__ = ["CANCEL_MARKER_EXPIRES_MS", "WorkflowLog", "sweep_workflow"]
