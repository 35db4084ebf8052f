"""The unique-jobs step of publishing: a job with a ``unique`` policy takes its lock before it is published.

Before a job carrying a :class:`~ojs_kombu.model.UniquePolicy` is published, the lock of its
uniqueness key (:func:`~ojs_kombu.policy.unique.job_unique_key`) is acquired with the job's id
as holder (:class:`~ojs_kombu.amqp.locks.UniqueLocks`, one per pooled connection), for what is
left of the policy's ``period`` counted from the job's ``created_at`` (spec §7).  When another
job holds it, ``on_conflict`` decides (spec §5):

* ``reject`` (default): :class:`~ojs_kombu.errors.DuplicateJobError` with the holder's id;
* ``ignore``: nothing is published; the outcome is the job passed, with the holder's id
  (:attr:`~ojs_kombu.client.EnqueueResult.existing_id` set);
* ``replace``: the holder is cancelled through the control plane
  (:meth:`~ojs_kombu.client.control.Control.cancel`, on the new job's queue), its lock freed,
  and the lock taken for the new job;
* ``replace_except_schedule``: as ``replace``, and the new job keeps the holder's
  ``scheduled_at`` (written with the holder's id in the lock's record) when that lies ahead.

A job whose publish then fails has its lock released, unless the failure leaves its fate
unknown (:class:`~ojs_kombu.errors.PublishTimeoutError`, :class:`~ojs_kombu.errors.BrokerConnectionError`):
the job may be queued, so its lock stays and ends with the job, or with its period.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Final

from kombu.connection import Connection

from ojs_kombu.amqp.locks import DEFAULT_QUEUE_EXPIRES, Acquired, Held, UniqueLocks
from ojs_kombu.client.control import Control
from ojs_kombu.client.results import EnqueueResult
from ojs_kombu.client.session import Service, Session
from ojs_kombu.errors import BrokerConnectionError, DuplicateJobError, OjsError, PublishTimeoutError
from ojs_kombu.model.job import Job
from ojs_kombu.model.timefmt import utcnow
from ojs_kombu.policy.unique import effective_on_conflict, job_unique_key, period_end

logger = logging.getLogger(__name__)

_LOCKS = "_ojs_unique_locks"  # the attribute of a pooled kombu connection holding its UniqueLocks
_REPLACE_ATTEMPTS: Final = 3  # replace: another job may take the freed lock first; then try again
_UNKNOWN_FATE = (PublishTimeoutError, BrokerConnectionError)


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


class Uniqueness(Service):
    """Takes the unique locks of a batch's jobs before it is published, and frees those of failed publishes.

    Parameters:
        session: the client's session.
        control: the control service (``replace`` cancels the existing job through it).
        queue_expires: ``x-expires`` of the lock queues (one value per deployment, see
            :class:`~ojs_kombu.amqp.locks.UniqueLocks`).
    """

    def __init__(self, session: Session, control: Control, *, queue_expires: timedelta = DEFAULT_QUEUE_EXPIRES):
        super().__init__(session)
        self.control = control
        self.queue_expires = queue_expires

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
        for index, job in enumerate(jobs):
            if not isinstance(job, Job) or job.unique is None:
                sending.append(index)
                continue
            try:
                outcome = self._claim(job)
            except OjsError as exc:
                outcomes[index] = EnqueueResult(job, exc)
                continue
            if isinstance(outcome, EnqueueResult):
                outcomes[index] = outcome
                continue
            claimed[index] = outcome
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

    def _claim(self, job: Job) -> tuple[str, Job] | EnqueueResult:
        """Take ``job``'s lock: ``(key, job to publish)``, or the outcome of a duplicate.

        Raises:
            DuplicateJobError: held by another job (``reject``, or a holder whose id could not be read).
            ValidationError: a bad policy for this job (``args_keys`` naming a missing key ...).
        """
        assert job.unique is not None
        key = job_unique_key(job)
        on_conflict = effective_on_conflict(job.unique)
        period = remaining_period(job)
        for _ in range(_REPLACE_ATTEMPTS):
            outcome = self._acquire(key, job, period)
            if isinstance(outcome, Acquired) or outcome.existing_id == job.id:
                return key, job  # (our own token: an acquire retried after its connection broke)
            existing = outcome.existing_id
            if on_conflict == "ignore" and existing is not None:
                return EnqueueResult(job.model_copy(update={"id": existing}), None, existing_id=existing)
            if on_conflict not in ("replace", "replace_except_schedule") or existing is None:
                raise self._duplicate(job, outcome)
            self.control.cancel(existing, job.queue)
            self._release_replaced(key, existing)
            if on_conflict == "replace_except_schedule":
                job = _keep_schedule(job, outcome)
            logger.info("job %s replaces job %s (unique, %s)", job.id, existing, on_conflict)
        raise self._duplicate(job, Held(key, self.session.run(lambda conn: self.locks(conn).holder(key))))

    def _acquire(self, key: str, job: Job, period: timedelta | None) -> Acquired | Held:
        return self.session.run(
            lambda conn: self.locks(conn).acquire(key, job.id, period, scheduled_at=job.scheduled_at)
        )

    def _release_replaced(self, key: str, existing: str) -> None:
        self.session.run(lambda conn: self.locks(conn).release(key, existing))

    @staticmethod
    def _duplicate(job: Job, held: Held) -> DuplicateJobError:
        holder = held.existing_id or "(unknown: its record expired or was released)"
        return DuplicateJobError(
            f"job {job.id} ({job.type}) is a duplicate of job {holder} (unique)",
            existing_id=held.existing_id,
            key=held.key,
        )

    def release(self, key: str, holder_id: str) -> None:
        """Free the lock of ``key`` held by ``holder_id`` (a job whose publish failed); a failure is logged.

        Parameters:
            key: the uniqueness key.
            holder_id: the job that took it.
        """
        try:
            self.session.run(lambda conn: self.locks(conn).release(key, holder_id))
        except OjsError as exc:
            logger.warning("could not release the unique lock of job %s: %s; it ends with its period", holder_id, exc)

    def locks(self, conn: Connection) -> UniqueLocks:
        """The :class:`UniqueLocks` of a pooled, connected connection (made on first use)."""
        locks: UniqueLocks | None = getattr(conn, _LOCKS, None)
        if locks is None or locks.connection is not conn.connection:
            locks = UniqueLocks(conn.connection, names=self.session.names, queue_expires=self.queue_expires)
            setattr(conn, _LOCKS, locks)
        return locks


def _keep_schedule(job: Job, held: Held) -> Job:
    """``job`` with the replaced job's ``scheduled_at`` when that lies ahead (spec §5.3)."""
    if held.existing_scheduled_at is None:
        return job
    kept = job.model_copy(update={"scheduled_at": held.existing_scheduled_at})
    scheduled = kept.scheduled_datetime
    return kept if scheduled is not None and scheduled > utcnow() else job


__all__ = ["Uniqueness", "remaining_period"]
