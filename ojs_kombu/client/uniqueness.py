"""The unique-jobs step of publishing: a job with a ``unique`` policy takes its lock before it is published.

Before a job carrying a :class:`~ojs_kombu.model.UniquePolicy` is published, its lock is taken
and ``on_conflict`` applied by :func:`ojs_kombu.runtime.unique.claim` (one
:class:`~ojs_kombu.amqp.locks.UniqueLocks` per pooled connection; ``replace`` cancels the holder
through :meth:`~ojs_kombu.client.control.Control.cancel`, on the new job's queue).  A duplicate
under ``ignore`` publishes nothing: its outcome is the job passed, with the holder's id
(:attr:`~ojs_kombu.client.EnqueueResult.existing_id` set).

``replace`` of a *running* holder never runs both (unique-jobs spec §8, UNIQ-30): after the
cancel, INFO (:meth:`~ojs_kombu.client.control.Control.info`, ``replace_probe`` s) is asked until
no worker says the holder is ``active``, for at most ``replace_timeout`` s, then the replace is
rejected (:func:`ojs_kombu.runtime.replace.cancel_and_wait`).  What replacing a pending holder
costs is the probe: ``replace_probe`` s when no worker knows the holder (the INFO timeout).
The window left: a worker that reads its control stream more than ``replace_probe`` s late,
and started the holder before reading the cancel.

A job whose publish then fails has its lock released, unless the failure leaves its fate
unknown (:class:`~ojs_kombu.errors.PublishTimeoutError`, :class:`~ojs_kombu.errors.BrokerConnectionError`):
the job may be queued, so its lock stays and ends with the job, or with its period.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from kombu.connection import Connection

from ojs_kombu.amqp.locks import DEFAULT_QUEUE_EXPIRES, UniqueLocks
from ojs_kombu.client.control import Control
from ojs_kombu.client.results import EnqueueResult
from ojs_kombu.client.session import Service, Session
from ojs_kombu.errors import BrokerConnectionError, OjsError, PublishTimeoutError
from ojs_kombu.model.job import Job
from ojs_kombu.runtime.redis_locks import RedisLocks
from ojs_kombu.runtime.replace import DEFAULT_REPLACE_PROBE, DEFAULT_REPLACE_TIMEOUT, cancel_and_wait, check_seconds
from ojs_kombu.runtime.unique import Claim, Locks, check_backend, claim_many

logger = logging.getLogger(__name__)

_LOCKS = "_ojs_unique_locks"  # the attribute of a pooled kombu connection holding its UniqueLocks
_UNKNOWN_FATE = (PublishTimeoutError, BrokerConnectionError)


class Uniqueness(Service):
    """Takes the unique locks of a batch's jobs before it is published, and frees those of failed publishes.

    Parameters:
        session: the client's session.
        control: the control service (``replace`` cancels the existing job through it).
        queue_expires: ``x-expires`` of the lock queues (one value per deployment, see
            :class:`~ojs_kombu.amqp.locks.UniqueLocks`).
        backend: None (the locks are RabbitMQ queues, on the pooled connections) or a Redis URL
            (:class:`~ojs_kombu.runtime.redis_locks.RedisLocks`, connected on first use).
        replace_probe: seconds the INFO after a ``replace``'s cancel waits for a worker to
            say the holder runs (what replacing a pending holder costs).
        replace_timeout: seconds a ``replace`` waits for a running holder to end once
            cancelled; past that it is rejected (:class:`DuplicateJobError`).

    Raises:
        ValidationError: ``backend`` is neither None nor a Redis URL, or ``replace_probe`` /
            ``replace_timeout`` is not a number of seconds (> 0, >= 0).
    """

    def __init__(
        self,
        session: Session,
        control: Control,
        *,
        queue_expires: timedelta = DEFAULT_QUEUE_EXPIRES,
        backend: str | None = None,
        replace_probe: float = DEFAULT_REPLACE_PROBE,
        replace_timeout: float = DEFAULT_REPLACE_TIMEOUT,
    ):
        super().__init__(session)
        self.replace_probe = check_seconds("replace_probe", replace_probe, zero=False)
        self.replace_timeout = check_seconds("unique_replace_timeout", replace_timeout, zero=True)
        self.control = control
        self.queue_expires = queue_expires
        self.backend = check_backend(backend)
        self._redis: RedisLocks | None = None
        self._redis_lock = threading.Lock()

    def publish(self, jobs: list[Job], publish: Callable[[list[Job]], list[EnqueueResult]]) -> list[EnqueueResult]:
        """Claim the lock of every job with a ``unique`` policy, ``publish`` the others and the claimed ones.

        Parameters:
            jobs: the batch (a single job: its error is raised, as ``publish`` does).
            publish: publishes jobs, one :class:`EnqueueResult` per job.

        Returns:
            One outcome per job, in order: duplicates carry :class:`DuplicateJobError`
            (``reject``) or :attr:`EnqueueResult.existing_id` (``ignore``).

        Raises:
            DuplicateJobError, ValidationError, ...: for a single job, what its outcome carries.
        """
        outcomes: list[EnqueueResult | None] = [None] * len(jobs)
        claimed: dict[int, tuple[str, Job]] = {}  # index -> (key, job): locks taken
        sending: list[int] = []
        unique = [i for i, job in enumerate(jobs) if isinstance(job, Job) and job.unique is not None]
        claims = dict(zip(unique, self._claim_many([jobs[i] for i in unique]), strict=True))
        for index, job in enumerate(jobs):
            if index not in claims:
                sending.append(index)
                continue
            outcome = claims[index]
            if isinstance(outcome, OjsError):
                outcomes[index] = EnqueueResult(job, outcome)
                continue
            if outcome.existing_id is not None:  # ignored: nothing is published
                job = job.model_copy(update={"id": outcome.existing_id})
                outcomes[index] = EnqueueResult(job, None, existing_id=outcome.existing_id)
                continue
            claimed[index] = (outcome.key, outcome.job)
            sending.append(index)
        single = len(jobs) == 1
        if single and outcomes[0] is not None:
            outcomes[0].unwrap()  # a single duplicate raises (an ignored one returns)
        batch = [claimed[i][1] if i in claimed else jobs[i] for i in sending]
        try:
            results = publish(batch) if batch else []
        except BaseException:
            for key, job in claimed.values():  # a single bad job: nothing was published
                self.release(key, job.id)
            raise
        for index, result in zip(sending, results, strict=True):
            outcomes[index] = result
            if index in claimed and result.error is not None and not isinstance(result.error, _UNKNOWN_FATE):
                self.release(claimed[index][0], claimed[index][1].id)
        return [outcome for outcome in outcomes if outcome is not None]

    def _claim_many(self, jobs: list[Job]) -> list[Claim | OjsError]:
        return claim_many(jobs, self._with_locks, self._cancel_holder) if jobs else []

    def _cancel_holder(self, job_id: str, scheduled_at: str | None, queue: str) -> None:
        """Cancel the holder ``job_id`` (``replace``); return once it does not run, or reject.

        A holder scheduled more than ``_NOT_DUE`` ahead (its lock's record says so) cannot run
        yet: it is not asked about.

        Raises:
            DuplicateJobError: it still runs ``replace_timeout`` s after the cancel (its ``key``
                is set by :func:`~ojs_kombu.runtime.unique.claim`).
        """
        cancel_and_wait(
            job_id,
            scheduled_at,
            cancel=lambda: self.control.cancel(job_id, queue),
            info=lambda probe: self.control.info(job_id, queue, probe),
            probe=self.replace_probe,
            timeout=self.replace_timeout,
        )

    def _with_locks(self, operation: Callable[[Locks], Any]) -> Any:
        if self.backend is not None:
            return operation(self._redis_locks())
        return self.session.run(lambda conn: operation(self.locks(conn)))

    def _redis_locks(self) -> RedisLocks:
        with self._redis_lock:
            if self._redis is None:
                assert self.backend is not None
                self._redis = RedisLocks(self.backend, names=self.session.names, queue_expires=self.queue_expires)
            return self._redis

    def close(self) -> None:
        """Close the Redis backend's connections, if any (the pooled AMQP ones are the session's)."""
        with self._redis_lock:
            if self._redis is not None:
                self._redis.close()

    def release(self, key: str, holder_id: str) -> None:
        """Free the lock of ``key`` held by ``holder_id`` (a job whose publish failed); a failure is logged.

        Parameters:
            key: the uniqueness key.
            holder_id: the job that took it.
        """
        try:
            self._with_locks(lambda locks: locks.release(key, holder_id))
        except OjsError as exc:
            logger.warning("could not release the unique lock of job %s: %s; it ends with its period", holder_id, exc)

    def locks(self, conn: Connection) -> UniqueLocks:
        """The :class:`UniqueLocks` of a pooled, connected connection (made on first use)."""
        locks: UniqueLocks | None = getattr(conn, _LOCKS, None)
        if locks is None or locks.connection is not conn.connection:
            locks = UniqueLocks(conn.connection, names=self.session.names, queue_expires=self.queue_expires)
            setattr(conn, _LOCKS, locks)
        return locks


__all__ = ["DEFAULT_REPLACE_PROBE", "DEFAULT_REPLACE_TIMEOUT", "Uniqueness"]
