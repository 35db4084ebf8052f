"""Concurrency limits across workers, applied before a job runs (``ojs-rate-limiting.md`` §5.1, §6.2, §8).

A job is limited by its own ``rate_limit`` (:class:`~ojs_kombu.model.ratelimit.RateLimitPolicy`)
and by its queue's policy (``Worker(rate_limits={queue: policy})``, spec §7.2): both must allow it.
:class:`Limiter` takes one permit per key with a ``concurrency`` (:class:`~ojs_kombu.amqp.permits.Permits`,
one connection of the worker's own, opened by the first limited job) before the handler runs, and the
:class:`~ojs_kombu.runtime.processing.Processing` gives them back once the run is settled.  A permit
held by a worker that dies returns to the broker with its connection.

The permits are asked for without waiting (``Basic.Get``).  A job that cannot take them all follows ``on_limit``
(of the first policy that stopped it):

* ``"wait"`` (the default): the delivery stays unacknowledged in this worker (*parked*: it holds no
  slot of the concurrency), and one waiter thread per key asks for its permits every
  :data:`WAITER_POLL` seconds, then hands the job back to the handler threads.  At most
  :attr:`Limiter.park_limit` jobs are parked at once (the Worker's ``concurrency // 2``): one more goes
  back to its queue through the scheduling cascade, delivered again :data:`WAIT_REQUEUE_DELAY` later
  (republished, then acked: no attempt spent), so the prefetch keeps room for jobs of other keys
  (spec §8.1: a limited job is skipped, the next one runs).
* ``"reschedule"``: back into the scheduling cascade, due :data:`RESCHEDULE_DELAY` later (a
  concurrency limit has no known time of release).
* ``"drop"``: a failed attempt (``rate_limited``) that is discarded (``failed`` event, not retried).

A policy's ``rate`` and ``throttle`` (spec §5.2, §5.3) are *start tokens* (:mod:`ojs_kombu.amqp.windows`):
once it holds its permits, a job spends one token of each window (``Basic.Get``, no ack), refilled every
slot by the one worker holding the window's refill permit (:class:`~ojs_kombu.runtime.refill.KeyRefills`).
A window whose tokens are spent applies ``on_limit`` as above, with the next slot's start as the time
to come back (a waiter sleeps until then; ``"reschedule"`` is due then; a ``"wait"`` whose window
opens more than :data:`PARK_AT_MOST` later waits in the cascade until then, not parked).  Permits are taken before
tokens because a token spent cannot be given back: a job stopped by its second window has spent its
first window's token (a start less in that slot, never one more).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ojs_kombu.amqp.permits import Permit, Permits
from ojs_kombu.amqp.windows import REFILL_POLL, REFILL_WAIT
from ojs_kombu.errors import ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.model.ratelimit import RateLimitPolicy
from ojs_kombu.observability.limit_metrics import LIMIT_METRICS
from ojs_kombu.observability.logs import job_log_extra
from ojs_kombu.policy.ratelimit import WindowSchedule
from ojs_kombu.policy.retry import Decision, Failure, Outcome
from ojs_kombu.runtime.delivery import Delivery
from ojs_kombu.runtime.refill import KeyRefills
from ojs_kombu.runtime.settle import Settler
from ojs_kombu.wire.events import RateLimitEvent, RateLimitEventName

logger = logging.getLogger(__name__)

RESCHEDULE_DELAY = 1.0
"""Seconds a job limited with ``on_limit="reschedule"`` goes back into the scheduling cascade for."""

WAIT_REQUEUE_DELAY = 0.5
"""Seconds a waiting job beyond :attr:`Limiter.park_limit` waits in the cascade before it is delivered again."""

PARK_AT_MOST = 2.0
"""Seconds a job stopped by a window waits parked in the worker at most: one whose window opens later
(a rate per minute, per hour) waits in the scheduling cascade until the next slot instead (a delivery
held unacknowledged that long would meet the queue's consumer timeout)."""

WAITER_POLL = 0.02
"""Seconds between two attempts of a waiter thread to take its oldest parked job's permits.

A waiter asks without waiting (``Basic.Get``) rather than subscribing: a subscribed wait holds the
permits' connection in turns of 0.2 s, and every release and every first attempt of the worker
(on its consumer thread) would wait for the turn to end."""

Admitted = Sequence[Permit]
"""The permits a job holds while it runs (empty: it has no concurrency limit)."""

Verdict = Admitted | Literal["parked", "settled"]
"""What :meth:`Limiter.admit` decided: run holding these permits, parked (``"wait"``), or settled
(rescheduled, dropped)."""


@dataclass(frozen=True)
class Blocked:
    """What kept a job from starting: a policy's ``concurrency``, ``rate`` or ``throttle``.

    Parameters:
        policy: the policy (its ``on_limit`` applies).
        strategy: ``"concurrency"``, ``"rate"`` or ``"throttle"`` (the metrics' and events' label).
        limit: the limit reached (permits, or starts per slot).
        retry_in: seconds until the job may start at the earliest (a window's next slot), or
            :data:`RESCHEDULE_DELAY` for a concurrency limit (no known time of release).
    """

    policy: RateLimitPolicy
    strategy: str
    limit: int
    retry_in: float


def queue_policies(
    rate_limits: Mapping[str, RateLimitPolicy | Mapping[str, Any]] | None, queues: list[str]
) -> dict[str, RateLimitPolicy]:
    """The ``rate_limits`` of a worker's queues checked and read (``Worker(rate_limits=...)``).

    Parameters:
        rate_limits: a :class:`~ojs_kombu.RateLimitPolicy`, or a dict of its fields, per queue.
        queues: the worker's queues.

    Returns:
        The policy of each queue that has one.

    Raises:
        ValidationError: a queue the worker does not consume, or a policy that is not one.
    """
    policies: dict[str, RateLimitPolicy] = {}
    for queue, policy in (rate_limits or {}).items():
        if queue not in queues:
            raise ValidationError(
                f"rate_limits names {queue!r}, which is not one of the worker's queues", field="rate_limits"
            )
        if not isinstance(policy, RateLimitPolicy):
            if not isinstance(policy, Mapping):
                raise ValidationError(
                    f"rate_limits[{queue!r}] must be a RateLimitPolicy or a dict, got {type(policy).__name__}",
                    field="rate_limits",
                )
            policy = RateLimitPolicy.model_validate(dict(policy))
        policies[queue] = policy
    return policies


class Limiter:
    """The concurrency limits of one worker's jobs (see the module docstring).

    Parameters:
        permits: makes the :class:`~ojs_kombu.amqp.permits.Permits` (called by the first limited job).
        queue_policies: a policy per queue (spec §7.2), applied to every job of that queue.
        settler: settles the jobs rescheduled, dropped or sent back.
        resubmit: hands a parked delivery whose permits were taken to a handler thread.
        park_limit: most jobs parked at once, all keys together (at least 1): parked deliveries
            count in the prefetch, which must keep room for jobs of other keys.
        generation: the consumer's connection generation now; a parked delivery of an older one
            (the connection was lost: the broker has it back) is never run, but given to ``forsake``.
        forsake: counts such a delivery out.
        job_policy: a policy of a job's own besides its ``rate_limit`` (a framework's option mapped
            onto one, e.g. a Celery task's ``rate_limit``), or None for none.
        emit: called with the ``rate_limit.*`` events of spec §11.1 (``exceeded`` when a limit stops
            a job, ``dropped`` with ``on_limit: "drop"``, ``released`` when a parked job may start),
            stamped with ``worker_id``; None: no events.
        worker_id: the worker the events are of.
    """

    def __init__(
        self,
        permits: Callable[[], Permits],
        queue_policies: Mapping[str, RateLimitPolicy],
        settler: Settler,
        resubmit: Callable[[Delivery], None],
        *,
        park_limit: int,
        generation: Callable[[], int] | None = None,
        forsake: Callable[[Delivery], None] | None = None,
        job_policy: Callable[[Job], RateLimitPolicy | None] | None = None,
        emit: Callable[[RateLimitEvent], None] | None = None,
        worker_id: str = "",
    ) -> None:
        self._make_permits = permits
        self._permits: Permits | None = None
        self.queue_policies = dict(queue_policies)
        self.settler = settler
        self.resubmit = resubmit
        self.park_limit = max(1, park_limit)
        self._generation = generation
        self._forsake = forsake
        self._job_policy = job_policy
        self._emit = emit
        self._worker_id = worker_id
        self._parked_by: dict[int, str] = {}  # id(delivery) -> the strategy that parked it
        self._lock = threading.Lock()
        self._ensured: dict[str, int] = {}  # key -> the limit passed to ensure() last
        self._parked: dict[str, deque[tuple[Delivery, Job]]] = {}
        self._waiters: dict[str, threading.Thread] = {}
        self._admitted: dict[int, tuple[Delivery, list[Permit]]] = {}  # parked, permits taken, handed back
        self._holding: dict[str, int] = {}
        self._exceeded: dict[tuple[str, str], int] = {}  # (key, strategy) -> count
        self.refills = KeyRefills(self._connection)
        self._stop = threading.Event()
        LIMIT_METRICS.watch(self)

    # -- what a job needs ------------------------------------------------------------------------

    def _sources(self, job: Job) -> tuple[RateLimitPolicy | None, ...]:
        own = None if self._job_policy is None else self._job_policy(job)
        return (self.queue_policies.get(job.queue), job.rate_limit, own)

    def policies(self, job: Job) -> list[RateLimitPolicy]:
        """The policies with a ``concurrency`` that apply to ``job`` (its own, its queue's), one per key, sorted.

        Two policies of one key: the smaller ``concurrency`` holds.

        Parameters:
            job: the job.

        Returns:
            The policies, sorted by key.
        """
        found: dict[str, RateLimitPolicy] = {}
        for policy in self._sources(job):
            if policy is None or policy.concurrency is None:
                continue
            other = found.get(policy.key)
            if other is None or (other.concurrency or 0) > policy.concurrency:
                found[policy.key] = policy
        return [found[key] for key in sorted(found)]

    def windows(self, job: Job) -> list[tuple[RateLimitPolicy, WindowSchedule]]:
        """The windows (``rate``, ``throttle``) that apply to ``job``, one per key and kind, sorted.

        Two policies of one key with a window of one kind: the fewer starts per second holds.

        Parameters:
            job: the job.

        Returns:
            ``(policy, schedule)`` pairs, sorted by key then kind.
        """
        found: dict[tuple[str, str], tuple[RateLimitPolicy, WindowSchedule]] = {}
        for policy in self._sources(job):
            if policy is None:
                continue
            for schedule in WindowSchedule.for_policy(policy):
                other = found.get((policy.key, schedule.kind))
                if other is None or schedule.capacity / schedule.interval < other[1].capacity / other[1].interval:
                    found[(policy.key, schedule.kind)] = (policy, schedule)
        return [found[window] for window in sorted(found)]

    # -- admission -------------------------------------------------------------------------------

    def admit(self, delivery: Delivery, job: Job) -> Verdict:
        """Take ``job``'s permits without waiting, or apply ``on_limit``.

        Parameters:
            delivery: the job's delivery (parked with ``"wait"``).
            job: the job, triaged.

        Returns:
            The permits to hold while it runs (empty without limits), ``"parked"`` or ``"settled"``.
        """
        with self._lock:
            admitted = self._admitted.pop(id(delivery), None)
        if admitted is not None:
            return admitted[1]
        if job.rate_limit is None and job.queue not in self.queue_policies:
            if self._job_policy is None or self._job_policy(job) is None:
                return ()  # no limits: no broker call, nothing more
        policies, windows = self.policies(job), self.windows(job)
        if not policies and not windows:
            return ()
        try:
            taken, blocked = self._take(policies, windows)
        except Exception:  # the broker or the permits' connection failed: the job is kept
            logger.warning(
                "job %s: its permits could not be asked for; rescheduled in %.1f s",
                job.id,
                RESCHEDULE_DELAY,
                exc_info=True,
                extra=job_log_extra(job),
            )
            self.settler.reschedule(delivery, job, int(RESCHEDULE_DELAY * 1000))
            return "settled"
        if blocked is None:
            return taken
        self._count_exceeded(blocked.policy.key, blocked.strategy)
        self._event("exceeded", job, blocked.policy.key, blocked.strategy, blocked.limit)
        action = blocked.policy.action
        if action == "drop":
            self._event("dropped", job, blocked.policy.key, blocked.strategy, blocked.limit)
            reason = f"rate limit {blocked.policy.key!r}: {blocked.strategy} {blocked.limit} reached (on_limit drop)"
            attempt = job.attempt + 1
            failure = Failure("rate_limited", "RateLimited", reason)
            self.settler.fail_attempt(delivery, job, attempt, failure, Decision(Outcome.DISCARD, reason=reason))
            return "settled"
        if action == "reschedule" or blocked.retry_in > PARK_AT_MOST:
            self.settler.reschedule(delivery, job, max(1, int(blocked.retry_in * 1000)))
            return "settled"
        return self._park(delivery, job, blocked.policy.key, blocked.strategy)

    def _event(self, event: RateLimitEventName, job: Job, key: str, strategy: str, limit: int | None) -> None:
        if self._emit is None:
            return
        try:
            self._emit(RateLimitEvent(event, key, strategy, job.id, job.type, job.queue, self._worker_id, limit))
        except Exception:  # events are best effort: never in the way of a job
            logger.warning("the rate_limit.%s event of job %s was not emitted", event, job.id, exc_info=True)

    def _take(
        self, policies: list[RateLimitPolicy], windows: list[tuple[RateLimitPolicy, WindowSchedule]]
    ) -> tuple[list[Permit], Blocked | None]:
        """One permit of each policy's key, in order, then one start token of each window, none waited
        for (two jobs needing the same keys never wait on each other).  Returns the permits taken and
        None, or nothing held and what stopped it."""
        permits = self._connection()
        taken: list[Permit] = []
        try:
            for policy in policies:
                key, limit = policy.key, policy.concurrency or 0
                if self._ensured.get(key) != limit:
                    permits.ensure(key, limit)
                    self._ensured[key] = limit
                permit = permits.acquire(key, timeout=0.0)
                if permit is None:
                    self.release(taken)
                    return [], Blocked(policy, "concurrency", limit, RESCHEDULE_DELAY)
                taken.append(permit)
                with self._lock:
                    self._holding[key] = self._holding.get(key, 0) + 1
            for policy, schedule in windows:
                self.refills.add(policy.key, schedule)
                slot = permits.take_start(policy.key, schedule)
                logger.debug("start token of %r (%s): slot %s", policy.key, schedule.kind, slot)
                if slot is None:
                    self.release(taken)
                    now = time.time()
                    into_slot = now - schedule.start(schedule.slot(now))
                    # Early in a slot its tokens may be on their way; later, nothing comes before the next slot.
                    retry_in = WAITER_POLL if into_slot < REFILL_WAIT else schedule.until_next(now) + REFILL_POLL
                    return [], Blocked(policy, schedule.kind, schedule.capacity, retry_in)
        except BaseException:
            self.release(taken)
            raise
        return taken, None

    def _connection(self) -> Permits:
        permits = self._permits
        if permits is None:
            with self._lock:
                if self._permits is None:
                    self._permits = self._make_permits()
                permits = self._permits
        return permits

    def release(self, held: Sequence[Permit]) -> None:
        """Give ``held`` back (after the run is settled); a permit lost with its connection is already back.

        Parameters:
            held: what :meth:`admit` returned.
        """
        for permit in held:
            if permit.released:
                continue
            with self._lock:
                self._holding[permit.key] = self._holding.get(permit.key, 1) - 1
            try:
                permit.release()
            except Exception:  # the connection is lost: the broker took the permit back
                logger.info("permit %r was lost with its connection: the broker returned it", permit, exc_info=True)

    def forget(self, delivery: Delivery) -> None:
        """``delivery`` will not run (settled by its triage, handed back): give back the permits it was admitted with."""
        with self._lock:
            admitted = self._admitted.pop(id(delivery), None)
        if admitted is not None:
            self.release(admitted[1])

    # -- waiting ---------------------------------------------------------------------------------

    def _park(self, delivery: Delivery, job: Job, key: str, strategy: str) -> Verdict:
        with self._lock:
            parked = self._parked.setdefault(key, deque())
            if not self._stop.is_set() and sum(map(len, self._parked.values())) < self.park_limit:
                parked.append((delivery, job))
                self._parked_by[id(delivery)] = strategy
                if key not in self._waiters:
                    thread = threading.Thread(target=self._wait_loop, args=(key,), name=f"ojs-limit-{key}", daemon=True)
                    self._waiters[key] = thread
                    thread.start()
                return "parked"
        logger.debug("job %s waits for a permit of %r in the cascade", job.id, key, extra=job_log_extra(job))
        self.settler.reschedule(delivery, job, int(WAIT_REQUEUE_DELAY * 1000))
        return "settled"

    def _wait_loop(self, key: str) -> None:
        """One key's waiter: take the permits of its oldest parked job, hand the job to a handler thread."""
        while True:
            with self._lock:
                parked = self._parked.get(key)
                if self._stop.is_set() or not parked:
                    del self._waiters[key]
                    return
                delivery, job = parked[0]
                stale = self._generation is not None and delivery.generation != self._generation()
                if stale:
                    parked.popleft()
                    self._parked_by.pop(id(delivery), None)
            if stale:
                if self._forsake is not None:
                    self._forsake(delivery)
                continue
            try:
                taken, blocked = self._take(self.policies(job), self.windows(job))
            except Exception:  # the permits' connection failed: reopened on the next turn
                logger.warning("waiting for a permit of %r failed; trying again", key, exc_info=True)
                self._stop.wait(1.0)
                continue
            if (
                blocked is not None and blocked.retry_in > PARK_AT_MOST
            ):  # its window opens later: admit() sends it around
                with self._lock:
                    handed = not self._stop.is_set() and bool(parked) and parked[0][0] is delivery
                    if handed:
                        parked.popleft()
                        self._parked_by.pop(id(delivery), None)
                if handed:
                    self.resubmit(delivery)
                continue
            if blocked is not None:
                self._stop.wait(
                    min(blocked.retry_in, WAITER_POLL) if blocked.strategy == "concurrency" else blocked.retry_in
                )
                continue
            with self._lock:
                handed = not self._stop.is_set() and bool(parked) and parked[0][0] is delivery
                if handed:
                    parked.popleft()
                    self._admitted[id(delivery)] = (delivery, taken)
            if handed:
                with self._lock:
                    strategy = self._parked_by.pop(id(delivery), "concurrency")
                self._event("released", job, key, strategy, None)
                self.resubmit(delivery)
            else:
                self.release(taken)

    def stop(self) -> list[Delivery]:
        """Stop parking and waiting; the parked deliveries, to be handed back unchanged.

        Returns:
            Every delivery parked now (none is handed to a handler thread afterwards).
        """
        with self._lock:
            self._stop.set()
            parked = [delivery for queue in self._parked.values() for delivery, _ in queue]
            self._parked.clear()
            self._parked_by.clear()
        return parked

    def close(self, *, close_permits: bool = True) -> None:
        """Stop the waiters and the refills; close the permits' connection (the permits still held return to the broker).

        Parameters:
            close_permits: False when the permits are shared (an ``OjsBroker``'s): their owner closes them.
        """
        self.refills.stop()  # first: its thread would open the permits again
        with self._lock:
            permits, self._permits = self._permits, None
            waiters = list(self._waiters.values())
        for thread in waiters:
            thread.join(timeout=1.0)
        if permits is not None and close_permits:
            permits.close()

    # -- what the metrics read -------------------------------------------------------------------

    def _count_exceeded(self, key: str, strategy: str) -> None:
        with self._lock:
            self._exceeded[(key, strategy)] = self._exceeded.get((key, strategy), 0) + 1

    def snapshot(self) -> Iterator[tuple[str, int, int, dict[str, int]]]:
        """Per key: permits this worker holds now, jobs it has parked waiting, times each limit stopped a job.

        Returns:
            ``(key, active, waiting, {strategy: exceeded})`` tuples (strategy: ``"concurrency"``,
            ``"rate"``, ``"throttle"``).
        """
        with self._lock:
            keys = set(self._holding) | set(self._parked) | {key for key, _ in self._exceeded}
            rows = [
                (
                    key,
                    self._holding.get(key, 0),
                    len(self._parked.get(key, ())),
                    {strategy: n for (k, strategy), n in self._exceeded.items() if k == key},
                )
                for key in sorted(keys)
            ]
        return iter(rows)


__all__ = [
    "PARK_AT_MOST",
    "RESCHEDULE_DELAY",
    "WAIT_REQUEUE_DELAY",
    "Admitted",
    "Blocked",
    "Limiter",
    "Verdict",
    "queue_policies",
]
