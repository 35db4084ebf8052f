"""Unique jobs' locks around a job's life (unique-jobs spec §5-7, DESIGN §19): taken before the publish, freed when it ends.

:func:`claim` is what every publisher of a job with a ``unique`` policy does before the publish
(the Client, the ``ojs://`` transport of Celery, the Dramatiq broker): take the lock of its
uniqueness key (:func:`~ojs_kombu.policy.unique.job_unique_key`) with the job's id as holder,
for what is left of the policy's ``period`` counted from the job's ``created_at`` (spec §7.2).
When another job holds it, ``on_conflict`` decides (spec §5):

* ``reject`` (default): :class:`~ojs_kombu.errors.DuplicateJobError` with the holder's id;
* ``ignore``: the :class:`Claim` names the holder (``existing_id``): publish nothing;
* ``replace``: the holder is cancelled through the control plane (``cancel``, which may wait
  for a running holder to end and raise :class:`~ojs_kombu.errors.DuplicateJobError` when it
  does not, see :mod:`ojs_kombu.runtime.replace`), its lock freed, and the lock taken for the
  new job;
* ``replace_except_schedule``: as ``replace``, and the new job keeps the holder's
  ``scheduled_at`` (written with the holder's id in the lock's record) when that lies ahead.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any, Final, Protocol, TypeVar

from kombu.connection import Connection

from ojs_kombu.amqp.connection import connect_once, make_connection
from ojs_kombu.amqp.locks import DEFAULT_QUEUE_EXPIRES, Acquired, Held, LockRequest, UniqueLocks
from ojs_kombu.amqp.urls import redact
from ojs_kombu.errors import DuplicateJobError, OjsError, ValidationError
from ojs_kombu.model.fields import JobState
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import Names
from ojs_kombu.model.timefmt import utcnow
from ojs_kombu.policy.unique import effective_on_conflict, effective_states, job_unique_key, period_end
from ojs_kombu.runtime.redis_locks import RedisLocks, is_redis_url

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Locks(Protocol):
    """A unique-lock backend: :class:`~ojs_kombu.amqp.locks.UniqueLocks` (RabbitMQ queues) or
    :class:`~ojs_kombu.runtime.redis_locks.RedisLocks` (``SET NX PX``)."""

    def acquire(
        self, key: str, holder_id: str, period: timedelta | None, *, scheduled_at: str | None = None
    ) -> Acquired | Held:
        """Take the lock of ``key`` for ``holder_id`` unless another holds it (atomic set-if-absent)."""

    def acquire_many(self, requests: Sequence[LockRequest]) -> list[Acquired | Held]:
        """Take the locks of a batch, each as :meth:`acquire` does, in fewer round trips."""

    def holder(self, key: str) -> str | None:
        """The id of the job holding the lock of ``key``, or None when it is free."""

    def release(self, key: str, holder_id: str) -> bool:
        """Free the lock of ``key`` if ``holder_id`` holds it."""

    def close(self) -> None:
        """Close what the backend opened."""


#: ``with_locks(operation)`` runs ``operation(locks)`` on a :class:`Locks` (and may retry it after a reconnect).
WithLocks = Callable[[Callable[[Locks], Any]], Any]


class CancelOn(Protocol):
    """``cancel(job_id, scheduled_at, queue)``: cancel a job through the control plane of ``queue`` (``replace``)."""

    def __call__(self, job_id: str, scheduled_at: str | None, queue: str) -> None:
        """Cancel ``job_id`` on ``queue``; ``scheduled_at`` is what its lock's record says (None: unknown)."""


_REPLACE_ATTEMPTS: Final = 3  # replace: another job may take the freed lock first; then try again


@dataclass(frozen=True, slots=True)
class Claim:
    """The outcome of :func:`claim`: publish ``job`` (it holds the lock of ``key``), or nothing (``existing_id``)."""

    key: str
    job: Job
    """The job to publish: the one claimed, with the replaced job's schedule under ``replace_except_schedule``."""
    existing_id: str | None = None
    """Set when the job was a duplicate under ``on_conflict="ignore"``: the holder's id; publish nothing."""


def remaining_period(job: Job) -> timedelta | None:
    """What is left of ``job``'s unique ``period``, counted from its ``created_at`` (spec §7.2).

    Parameters:
        job: a job with a ``unique`` policy.

    Returns:
        The time left (at least 1 ms), or None when the policy has no period.

    Raises:
        ValidationError: the period is too long to add to ``created_at``.
    """
    assert job.unique is not None
    now = utcnow()
    end = period_end(job.unique, job.created_datetime or now)
    if end is None:
        return None
    return max(end - now, timedelta(milliseconds=1))


def claim(
    job: Job,
    with_locks: WithLocks,
    cancel: Callable[[str, str | None], None],
    *,
    first: Acquired | Held | None = None,
) -> Claim:
    """Take the lock of ``job`` (which has a ``unique`` policy) before it is published; apply ``on_conflict``.

    Parameters:
        job: the job.
        with_locks: runs an operation on the :class:`Locks` (RabbitMQ's or Redis's).
        cancel: ``cancel(existing_id, existing_scheduled_at)`` cancels the holder through the
            control plane (``replace``); its ``scheduled_at`` (from the lock's record, None when
            unknown) tells whether it may run yet.
        first: the outcome of an acquire already made for ``job`` (:func:`claim_many`).

    Returns:
        The :class:`Claim`.

    Raises:
        DuplicateJobError: another job holds the key (``reject``; or any mode when the holder's id
            could not be read; or ``replace`` losing the freed lock three times in a row; or
            ``cancel`` raising it: a running holder that did not end in time, spec §5.2).
        ValidationError: the policy does not fit the job (``args_keys`` naming a missing key ...).
    """
    assert job.unique is not None
    key = job_unique_key(job)
    on_conflict = effective_on_conflict(job.unique)
    period = remaining_period(job)
    for attempt in range(_REPLACE_ATTEMPTS):
        outcome: Acquired | Held = (
            first
            if attempt == 0 and first is not None
            else with_locks(partial(_acquire, key=key, holder_id=job.id, period=period, scheduled_at=job.scheduled_at))
        )
        if isinstance(outcome, Acquired) or outcome.existing_id == job.id:
            return Claim(key, job)  # (our own token: an acquire retried after its connection broke)
        existing = outcome.existing_id
        if on_conflict == "ignore" and existing is not None:
            return Claim(key, job, existing)
        if on_conflict not in ("replace", "replace_except_schedule") or existing is None:
            raise duplicate(job, outcome)
        try:
            cancel(existing, outcome.existing_scheduled_at)
        except DuplicateJobError as exc:  # a running holder that did not end in time: reject (spec §5.2)
            raise DuplicateJobError(str(exc), existing_id=existing, key=key) from None
        with_locks(partial(release_lock, key=key, holder_id=existing))
        if on_conflict == "replace_except_schedule":
            job = _keep_schedule(job, outcome)
        logger.info("job %s replaces job %s (unique, %s)", job.id, existing, on_conflict)
    raise duplicate(job, Held(key, with_locks(lambda locks: locks.holder(key))))


def claim_many(jobs: Sequence[Job], with_locks: WithLocks, cancel: CancelOn) -> list[Claim | OjsError]:
    """:func:`claim` every job of a batch (each has a ``unique`` policy): their locks taken together.

    One :meth:`Locks.acquire_many` takes every lock it can; a job whose key is held then goes
    through :func:`claim` (its ``on_conflict``) with that outcome.  Should the batch's acquire
    fail (the broker unreachable ...), every job of the batch carries its error; a lock it took
    before failing ends with its period.

    Parameters:
        jobs: the batch.
        with_locks: as for :func:`claim`.
        cancel: ``cancel(existing_id, existing_scheduled_at, queue)``: ``replace`` cancels the holder on
            the new job's queue.

    Returns:
        One :class:`Claim` or the job's error (:class:`DuplicateJobError`, :class:`ValidationError` ...), in order.
    """
    outcomes: list[Claim | OjsError | None] = [None] * len(jobs)
    requests: dict[int, LockRequest] = {}
    for index, job in enumerate(jobs):
        try:
            requests[index] = LockRequest(job_unique_key(job), job.id, remaining_period(job), job.scheduled_at)
        except OjsError as exc:
            outcomes[index] = exc
    try:
        firsts = with_locks(lambda locks: locks.acquire_many(list(requests.values()))) if requests else []
    except OjsError as exc:  # the broker (or Redis) failed: every job of the batch fails with it
        for index in requests:
            outcomes[index] = exc
        return [outcome for outcome in outcomes if outcome is not None]
    for (index, request), first in zip(requests.items(), firsts, strict=True):
        if isinstance(first, Acquired):
            outcomes[index] = Claim(request.key, jobs[index])
            continue
        try:
            outcomes[index] = claim(jobs[index], with_locks, partial(cancel, queue=jobs[index].queue), first=first)
        except OjsError as exc:
            outcomes[index] = exc
    return [outcome for outcome in outcomes if outcome is not None]


def _acquire(
    locks: Locks, key: str, holder_id: str, period: timedelta | None, scheduled_at: str | None
) -> Acquired | Held:
    return locks.acquire(key, holder_id, period, scheduled_at=scheduled_at)


def release_lock(locks: Locks, key: str, holder_id: str) -> bool:
    """``locks.release(key, holder_id)``: for ``with_locks(partial(release_lock, key=..., holder_id=...))``."""
    return locks.release(key, holder_id)


def duplicate(job: Job, held: Held) -> DuplicateJobError:
    """The :class:`DuplicateJobError` of ``job``, whose key ``held`` names another holder."""
    holder = held.existing_id or "(unknown: its record expired or was released)"
    return DuplicateJobError(
        f"job {job.id} ({job.type}) is a duplicate of job {holder} (unique)", existing_id=held.existing_id, key=held.key
    )


def _keep_schedule(job: Job, held: Held) -> Job:
    """``job`` with the replaced job's ``scheduled_at`` when that lies ahead (spec §5.3)."""
    if held.existing_scheduled_at is None:
        return job
    kept = job.model_copy(update={"scheduled_at": held.existing_scheduled_at})
    scheduled = kept.scheduled_datetime
    return kept if scheduled is not None and scheduled > utcnow() else job


def check_backend(backend: str | None) -> str | None:
    """``backend`` (``unique_backend=``) if it is None or a Redis URL.

    Parameters:
        backend: None (the locks are RabbitMQ queues) or a ``redis://`` / ``rediss://`` URL.

    Returns:
        ``backend``.

    Raises:
        ValidationError: anything else.
    """
    if backend is None or is_redis_url(backend):
        return backend
    raise ValidationError(
        f"unique_backend must be None (RabbitMQ) or a redis:// URL, got {redact(str(backend))!r}",
        field="unique_backend",
    )


def lock_to_release(job: Job, state: JobState) -> str | None:
    """The uniqueness key whose lock ``job`` frees on ending in ``state``, or None (no policy, or ``state`` is one of its ``states``).

    Parameters:
        job: the job that ended.
        state: its end state (``completed``, ``discarded``, ``cancelled``).

    Returns:
        The key, or None.
    """
    policy = job.unique
    if policy is None or state in effective_states(policy):
        return None
    try:
        return job_unique_key(job)
    except ValidationError:
        return None  # its publish could not have taken a lock either


class Releaser(Protocol):
    """What frees a job's unique lock when it ends (the :class:`~ojs_kombu.runtime.settle.Settler`'s ``unique``)."""

    def release(self, job: Job, state: JobState) -> object:
        """Free ``job``'s lock now that it ended in ``state`` (unless ``state`` is one of its policy's ``states``)."""


class UniqueRelease:
    """Frees the unique locks of jobs that end, on a connection of its own (opened on first use); thread-safe.

    Parameters:
        url: the broker URL (or failover list).
        names: the deployment's entity names.
        ssl, transport_options, heartbeat: as for the worker's connection.
        queue_expires: ``x-expires`` of the lock queues (the deployment's one value).
        backend: where the locks are: None (RabbitMQ, on a connection of its own) or a Redis
            URL (:class:`~ojs_kombu.runtime.redis_locks.RedisLocks`): the publishers' backend.
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
        backend: str | None = None,
    ):
        self.url = url
        self.backend = check_backend(backend)
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
        self._locks: Locks | None = None

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
        key = lock_to_release(job, state)
        if key is None:
            return False
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

    def _unique_locks(self) -> Locks:
        if self._locks is None and self.backend is not None:
            self._locks = RedisLocks(self.backend, names=self.names, queue_expires=self.queue_expires)
        if self._locks is None:
            connection = make_connection(self.url, **self._options)
            self._connection = connection
            connect_once(connection)
            self._locks = UniqueLocks(connection.connection, names=self.names, queue_expires=self.queue_expires)
        return self._locks

    def _reset(self) -> None:
        connection, self._connection, locks, self._locks = self._connection, None, self._locks, None
        if isinstance(locks, RedisLocks):
            locks.close()
        if connection is not None:
            try:
                connection.collect()
            except Exception:  # noqa: BLE001
                pass

    def close(self) -> None:
        """Close the connection (idempotent); a later release opens a new one."""
        with self._lock:
            if isinstance(self._locks, RedisLocks):
                self._locks.close()
                self._locks = None
            if self._connection is not None:
                connection, self._connection, self._locks = self._connection, None, None
                try:
                    connection.release()
                except Exception:  # noqa: BLE001
                    pass


__all__ = [
    "CancelOn",
    "Claim",
    "Locks",
    "check_backend",
    "Releaser",
    "UniqueRelease",
    "lock_to_release",
    "WithLocks",
    "claim",
    "claim_many",
    "duplicate",
    "release_lock",
    "remaining_period",
]
