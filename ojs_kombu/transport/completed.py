"""Execution de-duplication on ``ojs://`` (transport option ``deduplicate``): one
:class:`~ojs_kombu.runtime.completed.CompletedLog` per job queue a connection consumes.

The Worker knows its queues up front and opens one log for all of them; a kombu consumer
(Celery's worker) consumes its queues one ``Basic.Consume`` at a time, so each job queue gets
its log right before its first consume, replayed before any of its jobs is delivered.  The
logs belong to the transport (one per kombu connection): they outlive a reconnection of the
AMQP connection, and reconnect on their own connections.

What is recorded is the framework's to say: the ``ojs://`` channel records a job when its ack
is a success (:meth:`~ojs_kombu.transport.channel.Channel.note_success`, which ``ojs_celery``
calls on an ``acks_late`` success) and acks it once the record is confirmed.  An ack that is
no success (Celery's ``Task.retry()`` re-sends the same id, then acks the original) records
nothing, so the retry runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ojs_kombu.model.naming import Names
from ojs_kombu.runtime.completed import CompletedLog
from ojs_kombu.wire.completed import CompletedOptions

logger = logging.getLogger(__name__)


class CompletedLogs:
    """The completed job ids of the job queues consumed through one kombu connection.

    A :class:`~ojs_kombu.runtime.completed.Completions` for the channel's Settler.

    Parameters:
        url: an AMQP URL (or a ``;``-separated failover list) for the logs' own connections.
        names: the entity names (prefix).
        options: bounds of the streams and of the ids kept.
        ssl: TLS options of the connections (as for :class:`~ojs_kombu.runtime.completed.CompletedLog`).
        heartbeat: AMQP heartbeat of the connections, seconds.
    """

    def __init__(self, url: str, names: Names, options: CompletedOptions, *, ssl: object, heartbeat: float):
        self.url = url
        self.names = names
        self.options = options
        self.ssl = ssl
        self.heartbeat = heartbeat
        self.logs: dict[str, CompletedLog] = {}

    def ensure(self, queue: str) -> None:
        """Open the log of OJS queue ``queue`` if it has none, and wait until it is caught up.

        Called by the channel right before it consumes ``queue`` (the connection's thread).
        """
        if queue in self.logs:
            return
        log = self.logs[queue] = CompletedLog(
            self.url,
            [queue],
            names=self.names,
            options=self.options,
            ssl=self.ssl,
            heartbeat=self.heartbeat,
            connection_name=f"ojs:// completed ids {queue}",
        )
        if not log.start():
            logger.warning(
                "the completed job ids of %s were not replayed within %.0fs; consuming without them meanwhile "
                "(a duplicate of a job completed before may run again)",
                queue,
                log.replay_timeout,
            )

    def is_completed(self, job_id: str) -> bool:
        """Whether ``job_id`` completed (within ``max_age``) in a queue consumed here, or by another worker of it."""
        return any(log.is_completed(job_id) for log in self.logs.values())

    def record(self, job_id: str, queue: str, on_recorded: Callable[[bool], None] | None = None) -> None:
        """Record that ``job_id`` of ``queue`` completed; ``on_recorded(ok)`` is called in the log's thread.

        A queue without a log (not consumed here) records nothing: ``on_recorded(False)`` at once.
        """
        log = self.logs.get(queue)
        if log is None:
            if on_recorded is not None:
                on_recorded(False)
            return
        log.record(job_id, queue, on_recorded)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every log (what is pending is published and confirmed first, up to ``timeout`` each)."""
        logs, self.logs = list(self.logs.values()), {}
        for log in logs:
            log.stop(timeout)


__all__ = ["CompletedLogs"]
