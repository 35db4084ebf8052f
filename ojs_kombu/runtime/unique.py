"""Freeing a unique job's lock when the job leaves its policy's ``states`` (unique-jobs spec §6, DESIGN §19).

A job enqueued with a ``unique`` policy holds the lock of its uniqueness key
(:mod:`ojs_kombu.client.uniqueness`).  :meth:`UniqueRelease.release` is called by the
:class:`~ojs_kombu.runtime.settle.Settler` when a job ends: completed, dead-lettered
(``discarded``), discarded, cancelled or expired.  It frees the lock unless the end state is one
of the policy's ``states`` (``states=[..., "completed"]`` keeps it for the rest of the period).
A retry or a redelivery is no end: the lock stays held meanwhile.  A lock whose release fails
(the broker unreachable) or whose job is lost ends with its period, or ``queue_expires``.

The lock is recomputed from the job as delivered (its type, queue, args and meta), and freed
only if this job holds it (:meth:`~ojs_kombu.amqp.locks.UniqueLocks.release`): a job that ends
after its period, when another job has taken the key, frees nothing.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

from kombu.connection import Connection

from ojs_kombu.amqp.connection import connect_once, make_connection
from ojs_kombu.amqp.locks import DEFAULT_QUEUE_EXPIRES, UniqueLocks
from ojs_kombu.errors import ValidationError
from ojs_kombu.model.fields import JobState
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import Names
from ojs_kombu.policy.unique import effective_states, job_unique_key

logger = logging.getLogger(__name__)


class UniqueRelease:
    """Frees the unique locks of jobs that end, on a connection of its own (opened on first use); thread-safe.

    Parameters:
        url: the broker URL (or failover list).
        names: the deployment's entity names.
        ssl, transport_options, heartbeat: as for the worker's connection.
        queue_expires: ``x-expires`` of the lock queues (the deployment's one value).
    """

    def __init__(
        self,
        url: str,
        names: Names,
        *,
        ssl: Any = None,
        transport_options: dict[str, Any] | None = None,
        heartbeat: float = 0,
        queue_expires: timedelta = DEFAULT_QUEUE_EXPIRES,
        connection_name: str = "ojs_kombu unique locks",
    ):
        self.url = url
        self.names = names
        self.queue_expires = queue_expires
        self._options: dict[str, Any] = {
            "heartbeat": heartbeat,
            "ssl": ssl,
            "transport_options": transport_options,
            "connection_name": connection_name,
        }
        self._lock = threading.Lock()
        self._connection: Connection | None = None
        self._locks: UniqueLocks | None = None

    def release(self, job: Job, state: JobState) -> bool:
        """Free ``job``'s unique lock now that it is in ``state``, unless ``state`` is one of its policy's ``states``.

        Never raises: a lock that cannot be freed is logged and ends with its period.

        Parameters:
            job: the job that ended (as delivered).
            state: its end state: ``completed``, ``discarded`` (dead-lettered, discarded,
                expired) or ``cancelled``.

        Returns:
            True when this freed the job's lock.
        """
        policy = job.unique
        if policy is None or state in effective_states(policy):
            return False
        try:
            key = job_unique_key(job)
        except ValidationError:
            return False  # its publish could not have taken a lock either
        with self._lock:
            for attempt in (1, 2):  # a connection that broke since the last release: once more, afresh
                try:
                    return self._unique_locks().release(key, job.id)
                except Exception as exc:  # noqa: BLE001  (a worker never fails a job over its lock)
                    self._reset()
                    if attempt == 2:
                        logger.warning(
                            "could not release the unique lock of job %s (%s): %s; it ends with its period",
                            job.id,
                            state,
                            exc,
                        )
        return False

    def _unique_locks(self) -> UniqueLocks:
        if self._locks is None:
            connection = make_connection(self.url, **self._options)
            self._connection = connection
            connect_once(connection)
            self._locks = UniqueLocks(connection.connection, names=self.names, queue_expires=self.queue_expires)
        return self._locks

    def _reset(self) -> None:
        connection, self._connection, self._locks = self._connection, None, None
        if connection is not None:
            try:
                connection.collect()
            except Exception:  # noqa: BLE001
                pass

    def close(self) -> None:
        """Close the connection (idempotent); a later release opens a new one."""
        with self._lock:
            if self._connection is not None:
                connection, self._connection, self._locks = self._connection, None, None
                try:
                    connection.release()
                except Exception:  # noqa: BLE001
                    pass


__all__ = ["UniqueRelease"]
