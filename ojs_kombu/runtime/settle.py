"""Settling deliveries: every outcome of DESIGN §5, with its event and metric, shared by every worker.

:class:`Settler` is what :class:`~ojs_kombu.runtime.worker.Worker` (and the Dramatiq
adapter's consumer) do with every delivery they take:

* :meth:`Settler.triage` decodes a delivery and settles the ones that must not
  run: undecodable (to the DLQ with the reason in the headers), completed already
  (``deduplicate=True``: acked, not run, counted), redelivered
  (a worker died running it: a failed attempt, ``worker_lost``), cancelled
  (acked, not run: state ``cancelled``), expired
  (acked, not run) and early (back into the scheduling cascade), and carries out a due
  workflow sweep job (:func:`~ojs_kombu.runtime.workflow.sweep_job`: the ended workflow's record
  stream deleted, then acked; no framework sees it); it is the one place a delivery is judged
  before it runs;
* :meth:`Settler.succeed`: the handler returned: ack, ``succeeded``;
* :meth:`Settler.cancel`: a cancelled job (dropped on delivery, or stopped while it
  ran): ack, counted (``ojs_job_cancelled_total``), ``cancelled``;
* :meth:`Settler.fail_attempt`: an attempt failed: ``failed``, then
  :meth:`Settler.fail` carries out the :class:`~ojs_kombu.policy.retry.Decision`:
  retry (confirmed publish to the retry queue, then ack), dead letter
  (the final failure recorded in the control stream, confirmed, then
  ``Basic.Nack(requeue=False)``; or a republish with it, then ack),
  discard (ack);
* :meth:`Settler.skip`: a job the framework chose not to run (a Dramatiq middleware
  skipped it): ack, no event;
* :meth:`Settler.hand_back` returns an unstarted job at shutdown without
  spending an attempt; :meth:`Settler.reschedule` one its rate limit keeps from
  starting, into the scheduling cascade.

With a :class:`~ojs_kombu.runtime.lifecycle.Lifecycle` the Settler emits the
lifecycle events of what it settles (the job metrics and the activity behind INFO
subscribe to them): ``succeeded``, ``cancelled``, ``expired``, ``failed`` (a handler's
failure, a redelivery counted as a lost attempt), and, for every failure it carries
out, ``retried`` or ``dead-lettered`` (a discard adds nothing: ``failed`` alone means
discarded).  The caller emits ``started`` only.

The Settler never touches a channel itself: it settles through a
:class:`Settlement` (``ack``, ``nack``, ``republish``).  The Worker and the
Dramatiq adapter pass their :class:`~ojs_kombu.runtime.consumer.Consumer`;
the ``ojs://`` transport passes an adapter over its kombu channel
(:mod:`ojs_kombu.transport.settlement`).  Every republish is published
(confirmed) first and acked after.

A delayed republish (an early job back into the cascade, a retry) says where it goes
as a function of the clock, not as a delay measured here: the Settlement asks for it
right before the publish, after the declarations and the channel's set-up
(:meth:`~ojs_kombu.amqp.publisher.ConfirmedPublisher.publish_when_ready`), so neither
those waits nor the request's wait for the consumer's loop make the job late.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Literal, Protocol

from ojs_kombu.amqp.publisher import Destination
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.errors import DecodeError, ValidationError
from ojs_kombu.model.fields import JobState
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import SWEEP_JOB_TYPE, Names
from ojs_kombu.model.timefmt import format_timestamp, utcnow
from ojs_kombu.observability.logs import job_log_extra, message_log_extra
from ojs_kombu.observability.metrics import METRICS
from ojs_kombu.policy.retry import Decision, Failure, Outcome, decide, ladder_ms, record_failure, replay_count
from ojs_kombu.policy.schedule import Cascade, check_delay, delay_ms_until
from ojs_kombu.runtime.completed import Completions
from ojs_kombu.runtime.consumer import Delivery
from ojs_kombu.runtime.control import record_cancelled
from ojs_kombu.runtime.lifecycle import JobEventName, Lifecycle
from ojs_kombu.runtime.unique import Releaser
from ojs_kombu.runtime.workflow import WorkflowHook
from ojs_kombu.wire.codec import OutgoingMessage, decode, encode
from ojs_kombu.wire.control import final_failure_message
from ojs_kombu.wire.headers import error_headers

logger = logging.getLogger(__name__)

_SWEEP_RETRY_MS = 60_000  # a sweep job whose deletion failed is delivered again this much later


def failed_message(original: OutgoingMessage, job: Job, failure: Failure) -> OutgoingMessage:
    """The retry / dead-letter message of a failed attempt.

    ``original`` is the delivered message (``x-death*`` already stripped, see
    :meth:`Delivery.outgoing`); its properties and headers are kept, the
    envelope and the ``x-ojs-*`` headers come from ``job`` (as returned by
    :func:`~ojs_kombu.policy.retry.record_failure`), and the error headers are set.
    """
    encoded = encode(job)
    properties = {
        **encoded.properties,
        **original.properties,
        "content_type": encoded.properties["content_type"],
        "content_encoding": encoded.properties["content_encoding"],
    }
    headers = {**original.headers, **encoded.headers, **error_headers(failure.code, failure.message)}
    return OutgoingMessage(encoded.body, properties, headers)


def final_failure_record(job: Job, attempt: int, failure: Failure, failed_at: datetime) -> OutgoingMessage:
    """The control record of ``failure``, the final one of ``job`` (attempt ``attempt``), for a nack.

    A ``Basic.Nack`` dead-letters the delivered message as it is: its envelope still tells
    the *previous* attempt's error.  The record (:func:`~ojs_kombu.wire.control.final_failure_message`,
    to the queue's control stream) is what the dead letter readers join to the letter.
    """
    return final_failure_message(
        job.id,
        attempt=max(1, attempt),
        replays=replay_count(job),
        code=failure.code,
        type=failure.type,
        message=failure.message,
        failed_at=format_timestamp(failed_at),
    )


def failure_error(failure: Failure) -> dict[str, Any]:
    """The ``error`` of a ``failed`` lifecycle event: ``{"code", "type", "message"}`` of ``failure``."""
    return {"code": failure.code, "type": failure.type, "message": failure.message}


def worker_lost(attempt: int) -> Failure:
    """The failure recorded for an attempt whose worker died (a redelivered message)."""
    return Failure("worker_lost", "WorkerLost", f"attempt {attempt} was interrupted: the worker running it was lost")


class Settlement(Protocol):
    """How a :class:`Settler` settles a delivery: what every consumer of the binding provides.

    :class:`~ojs_kombu.runtime.consumer.Consumer` implements it with thread-safe
    requests to its loop; the ``ojs://`` transport with an adapter over its channel.
    """

    def ack(self, delivery: Delivery) -> None:
        """``Basic.Ack`` ``delivery``."""

    def nack(
        self,
        delivery: Delivery,
        record: Destination | None = None,
        prepare: Callable[[Any, Destination], None] | None = None,
    ) -> None:
        """``Basic.Nack(requeue=False)`` ``delivery``: into its dead letter queue.

        Parameters:
            delivery: the delivery to dead-letter.
            record: the job's final failure (:func:`final_failure_record`): published
                (confirmed) first, the nack follows its confirm, or its refusal.
            prepare: ``prepare(connection, record)`` before publishing ``record``.
        """

    def republish(
        self,
        delivery: Delivery,
        destination: Destination | Callable[[], Destination],
        queue: str,
        prepare: Callable[[Any, Destination], None] | None = None,
    ) -> None:
        """Publish ``destination`` (confirmed), then ack ``delivery``; nack it if the broker refuses the publish.

        Through :meth:`~ojs_kombu.amqp.publisher.ConfirmedPublisher.publish_when_ready`: a
        callable ``destination`` is asked for after ``prepare`` and the channel's set-up.

        Parameters:
            delivery: the delivery the republish replaces.
            destination: ``(message, exchange, routing_key)``, or what computes it from the
                clock (a delay), called in the thread that publishes.
            queue: the OJS queue it belongs to (metrics, errors).
            prepare: ``prepare(connection, destination)`` with the py-amqp connection, before
                publishing (e.g. to declare a retry queue).
        """


DeadLetterMode = Literal["nack", "republish"]


class Settler:
    """Settles deliveries according to DESIGN §5, through a :class:`Settlement`.

    Parameters:
        consumer: the :class:`Settlement` that acks, nacks and republishes.
        names: the entity names of the deployment.
        topology: declares retry queues and the scheduling cascade on demand.
        cascade: the scheduling cascade (early jobs go back into it).
        dead_letter_mode: ``"nack"`` (``Basic.Nack``, the binding's FAIL, after the final failure
            is recorded in the control stream: :meth:`dead_letter`) or ``"republish"`` (publish to
            the DLX with the final failure in the envelope and headers, then ack).
        early_tolerance_ms: a job delivered at most this much before its
            ``scheduled_at`` is run (the ``ojs://`` transport leaves such a
            job to Celery, which waits for the ETA itself); earlier ones go
            back into the cascade.
        discard_expired: whether :meth:`triage` acks an expired job without
            running it (the ``ojs://`` transport leaves that to the framework,
            which records the task as revoked).
        completed: the completed job ids (``deduplicate=True``,
            :class:`~ojs_kombu.runtime.completed.CompletedLog`): :meth:`triage` acks a
            delivery whose job completed already without running it (counted in
            :attr:`deduplicated`), whatever else holds (redelivered, scheduled ...), and
            :meth:`succeed` records the job there, confirmed, before the ack.  ``None``: no
            de-duplication.
        cancelled: tells whether a job id was cancelled (``Client.cancel``):
            :meth:`triage` acks such a job without running it, whatever else
            holds (redelivered, scheduled ...).  ``None``: no cancels known.
        lifecycle: where the events of what it settles go (see the module docstring); ``None``: nowhere.
        workflow: the completion hook of workflows, called before a job of a workflow is settled
            for good (succeeded, dead-lettered, discarded, cancelled); ``None``: jobs' ``meta.workflow``
            is ignored.  If it raises, the delivery goes to its DLQ (the caller's ``reject_unexpected``).
        unique: frees the unique lock of a job that ends (:meth:`ended`); ``None``: locks end with their period.
        sweep: ``sweep(workflow_id)`` deletes an ended workflow's record stream and cancel marker, for a
            due sweep job (:meth:`triage`); ``None``: the workflow hook's
            (:meth:`WorkflowHook.sweep <ojs_kombu.runtime.workflow.WorkflowHook.sweep>`), if any.
    """

    def __init__(
        self,
        consumer: Settlement,
        names: Names,
        topology: Topology,
        cascade: Cascade,
        *,
        dead_letter_mode: DeadLetterMode | str = "nack",
        early_tolerance_ms: int = 0,
        discard_expired: bool = True,
        cancelled: Callable[[str], bool] | None = None,
        completed: Completions | None = None,
        lifecycle: Lifecycle | None = None,
        workflow: WorkflowHook | None = None,
        unique: Releaser | None = None,
        sweep: Callable[[str], None] | None = None,
    ):
        self.consumer = consumer
        self.names = names
        self.topology = topology
        self.cascade = cascade
        self.dead_letter_mode = dead_letter_mode
        self.early_tolerance_ms = early_tolerance_ms
        self.discard_expired = discard_expired
        self.cancelled = cancelled
        self.completed = completed
        self.deduplicated = 0  # deliveries acked without running: their job had completed
        self.lifecycle = lifecycle
        self.workflow = workflow
        self.unique = unique
        self.sweep = sweep if sweep is not None else workflow.sweep if workflow is not None else None

    def ended(self, job: Job, state: JobState) -> None:
        """``job`` ended in ``state`` (completed, discarded, cancelled): free its unique lock, if it has one."""
        if self.unique is not None and job.unique is not None:
            self.unique.release(job, state)

    def _emit(self, event: JobEventName, job: Job, attempt: int, failure: Failure | None = None) -> None:
        if self.lifecycle is not None:
            self.lifecycle.emit(event, job, attempt, error=failure_error(failure) if failure else None)

    def triage(self, delivery: Delivery) -> Job | None:
        """Decode ``delivery``; return the job if it is to run now, else settle it and return None.

        The returned job's ``attempt`` is the number of executions before this one.
        """
        try:
            job = decode(delivery.body, delivery.properties, delivery.headers)
        except DecodeError as exc:
            self.reject_invalid(delivery, exc.code, str(exc))
            return None
        attempt = job.attempt + 1
        if self.cancelled is not None and self.cancelled(job.id):
            self.cancel(delivery, job, attempt, "pending")
            return None
        if self.completed is not None and self.completed.is_completed(job.id):
            self.deduplicated += 1
            METRICS.deduplicated(job.queue)
            logger.info(
                "job %s completed already; acknowledged without running it (a duplicate delivery%s)",
                job.id,
                ", redelivered" if delivery.redelivered else "",
                extra=job_log_extra(job, attempt),
            )
            self.consumer.ack(delivery)
            return None
        if delivery.redelivered and job.type != SWEEP_JOB_TYPE:  # a sweep job is done again, no attempt counted
            logger.warning(
                "job %s was redelivered: counting attempt %d as failed (worker_lost)",
                job.id,
                attempt,
                extra=job_log_extra(job, attempt),
            )
            failure = worker_lost(attempt)
            self.fail_attempt(delivery, job, attempt, failure, decide(job, attempt, error_type="worker_lost"))
            return None
        if job.expires_at is None and job.scheduled_at is None:
            if job.type != SWEEP_JOB_TYPE:
                return job  # most jobs: no clock to read
            self._swept(delivery, job)
            return None
        now = utcnow()
        expires = job.expires_datetime
        if self.discard_expired and expires is not None and expires <= now:
            logger.info(
                "job %s expired at %s; discarded without running",
                job.id,
                job.expires_at,
                extra=job_log_extra(job, attempt),
            )
            self.consumer.ack(delivery)
            self._emit("expired", job, attempt)
            self.ended(job, "discarded")
            return None
        scheduled = job.scheduled_datetime
        if scheduled is not None and scheduled > now:
            early_ms = delay_ms_until(scheduled, now)
            if early_ms > self.early_tolerance_ms:
                self.delay(delivery, job, early_ms)
                return None
        if job.type == SWEEP_JOB_TYPE:
            self._swept(delivery, job)
            return None
        return job

    def _swept(self, delivery: Delivery, job: Job) -> None:
        """A due sweep job: delete its workflow's record stream (and cancel marker), then ack.

        A consumer that cannot sweep (no ``sweep``) acks it all the same: the stream then stays, as
        before sweeps existed.  A broker error leaves the job for a minute later (in the cascade).
        """
        workflow_id = job.args[0] if len(job.args) == 1 else None
        if not isinstance(workflow_id, str) or not workflow_id:
            self.reject_invalid(
                delivery, "invalid_sweep", f"a sweep job's args must be [workflow_id], got {job.args!r}"
            )
            return None
        if self.sweep is None:
            logger.warning("workflow %s: this consumer cannot sweep its record stream; it stays", workflow_id)
        else:
            try:
                self.sweep(workflow_id)
            except Exception as exc:  # noqa: BLE001 - the sweep is tried again, nothing is lost
                logger.warning("sweeping workflow %s failed (%r); trying again in a minute", workflow_id, exc)
                self.reschedule(delivery, job, _SWEEP_RETRY_MS)
                return
            logger.debug("workflow %s swept", workflow_id)
        self.consumer.ack(delivery)

    def succeed(self, delivery: Delivery, job: Job, attempt: int, result: Any = None) -> None:
        """Attempt ``attempt`` of ``job`` succeeded (its handler returned ``result``): ack, ``succeeded``.

        Parameters:
            delivery: the job's delivery.
            job: the job as delivered.
            attempt: this execution, 1-based.
            result: what the handler returned (``None`` when the framework does not tell):
                the outcome's, for what follows a success (a workflow's next step).
        """
        if self.workflow is not None and job.meta:
            self.workflow.on_terminal(job, "completed", result)
        completed = self.completed
        if completed is not None:
            # Recorded (confirmed), then acked: see ojs_kombu.runtime.completed for the crash windows.
            completed.record(job.id, delivery.queue, partial(self._recorded, delivery))
        else:
            self.consumer.ack(delivery)
        lifecycle = self.lifecycle  # the hot path: no _emit
        if lifecycle is not None:
            lifecycle.emit("succeeded", job, attempt)
        if job.unique is not None:
            self.ended(job, "completed")

    def _recorded(self, delivery: Delivery, ok: bool) -> None:
        """A completed job's record is confirmed (or given up: at worst a duplicate later): ack it."""
        self.consumer.ack(delivery)

    def cancel(self, delivery: Delivery, job: Job, attempt: int, state: Literal["pending", "running"]) -> None:
        """A cancelled job (``Client.cancel``): acked, never retried nor dead-lettered, counted, ``cancelled``.

        Parameters:
            delivery: the job's delivery.
            job: the job.
            attempt: the execution it was delivered for, 1-based.
            state: ``"pending"`` (dropped on delivery, never run) or ``"running"`` (stopped while it ran).
        """
        record_cancelled(job, state, attempt)
        if self.workflow is not None and job.meta:
            self.workflow.on_terminal(job, "cancelled")
        self.consumer.ack(delivery)
        self._emit("cancelled", job, attempt)
        self.ended(job, "cancelled")

    def skip(self, delivery: Delivery, job: Job, reason: str) -> None:
        """A job the framework chose not to run (a Dramatiq middleware skipped it): acked, no event."""
        logger.debug("job %s skipped: %s", job.id, reason, extra=job_log_extra(job))
        self.consumer.ack(delivery)

    def fail_attempt(self, delivery: Delivery, job: Job, attempt: int, failure: Failure, decision: Decision) -> None:
        """Attempt ``attempt`` of ``job`` failed with ``failure``: ``failed``, then :meth:`fail`."""
        self._emit("failed", job, attempt, failure)
        self.fail(delivery, job, attempt, failure, decision)

    def fail(self, delivery: Delivery, job: Job, attempt: int, failure: Failure, decision: Decision) -> None:
        """Carry out ``decision`` for attempt ``attempt`` of ``job`` that failed with ``failure``.

        Emits ``retried`` or ``dead-lettered`` (nothing for a discard); ``failed`` is
        :meth:`fail_attempt`'s (the ``ojs://`` transport leaves it to the framework).
        """
        if decision.outcome is Outcome.RETRY:
            self.retry(delivery, job, attempt, failure, decision.delay_ms or 1)
            return
        if self.workflow is not None and job.meta:  # failed for good (§9.1): the workflow goes on
            self.workflow.on_terminal(job, "failed", error={**failure_error(failure), "attempt": attempt})
        if decision.outcome is Outcome.DISCARD:
            logger.info("job %s discarded: %s", job.id, decision.reason, extra=job_log_extra(job, attempt))
            self.consumer.ack(delivery)
            self.ended(job, "discarded")
            return
        self.dead_letter(delivery, job, attempt, failure, decision.reason)
        self._emit("dead-lettered", job, attempt, failure)
        self.ended(job, "discarded")

    def dead_letter(self, delivery: Delivery, job: Job, attempt: int, failure: Failure, reason: str = "") -> None:
        """Into ``ojs.queue.dlx.{q}``, with ``failure`` (attempt ``attempt``) as the letter's final failure.

        ``"republish"``: the letter is published with the failure in its envelope and error
        headers (confirmed), then the delivery is acked.  ``"nack"``: the failure is recorded
        in the queue's control stream (:func:`final_failure_record`, confirmed), then the
        delivery is ``Basic.Nack``-ed, whether the record was confirmed or refused.  Emits nothing.
        """
        failed_at = utcnow()
        if self.dead_letter_mode == "republish":
            failed = record_failure(job, attempt, failure, failed_at)
            message = failed_message(delivery.outgoing(), failed, failure)
            self.consumer.republish(delivery, (message, self.names.dead_letter_exchange, job.queue), job.queue)
            return
        logger.info("job %s dead-lettered: %s", job.id, reason or failure.message, extra=job_log_extra(job, attempt))
        queue = delivery.queue  # whose dead letter queue the nack fills, and whose readers join the record
        self.consumer.nack(
            delivery,
            (
                final_failure_record(job, attempt, failure, failed_at),
                self.names.direct_exchange,
                self.names.control_routing_key(queue),
            ),
            prepare=lambda connection, _: self.topology.declare(connection, self.topology.control_specs(queue)),
        )

    def retry(self, delivery: Delivery, job: Job, attempt: int, failure: Failure, delay_ms: int) -> None:
        """Publish ``job`` (attempt+1, error recorded) to its retry queue ``delay_ms`` from now, then ack;
        emits ``retried``.

        The retry queue is ``ojs.queue.retry.{q}.{ms}`` for the step of
        :func:`~ojs_kombu.policy.retry.ladder_ms` that carries what is left of ``delay_ms`` when
        it is published: ``delay_ms`` itself, unless declaring its queue (or waiting for the
        consumer's loop) took long enough for a smaller step to do.
        """
        message = failed_message(delivery.outgoing(), record_failure(job, attempt, failure), failure)
        queue = job.queue
        due = time.monotonic() + delay_ms / 1000
        steps: dict[str, int] = {}  # routing key -> its step, for prepare

        def destination() -> Destination:
            step = min(delay_ms, ladder_ms((due - time.monotonic()) * 1000))
            key = self.names.retry_routing_key(queue, step)
            steps[key] = step
            return message, self.names.retry_exchange, key

        self.consumer.republish(
            delivery,
            destination,
            queue,
            prepare=lambda connection, to: self.topology.ensure_retry_queue(connection, queue, steps[to[2]]),
        )
        self._emit("retried", job, attempt, failure)

    def delay(self, delivery: Delivery, job: Job, delay_ms: int) -> None:
        """A job that arrived ``delay_ms`` before its ``scheduled_at``: back into the cascade, unchanged,
        for the time left until ``scheduled_at`` when it is published (after the cascade is declared)."""
        try:
            check_delay(delay_ms)  # the delay only shrinks until the publish: in range then too
        except ValidationError as exc:
            self.reject_invalid(delivery, "invalid_schedule", str(exc))
            return
        logger.debug("job %s arrived %d ms early; delaying it again", job.id, delay_ms, extra=job_log_extra(job))
        self._into_cascade(delivery, job, job.scheduled_datetime or utcnow() + timedelta(milliseconds=delay_ms))

    def reschedule(self, delivery: Delivery, job: Job, delay_ms: int) -> None:
        """A job its rate limit keeps from starting now: back into the cascade, unchanged (no attempt
        spent), delivered ``delay_ms`` from now (``on_limit="reschedule"``, ``ojs-rate-limiting.md`` §6.2)."""
        logger.debug("job %s is rate limited; rescheduled in %d ms", job.id, delay_ms, extra=job_log_extra(job))
        self._into_cascade(delivery, job, utcnow() + timedelta(milliseconds=delay_ms))

    def _into_cascade(self, delivery: Delivery, job: Job, when: datetime) -> None:
        """Republish ``delivery`` unchanged into the scheduling cascade, due at ``when`` (confirmed), then ack."""
        message, queue = delivery.outgoing(), job.queue
        self.consumer.republish(
            delivery,
            lambda: self.cascade.destination(message, when, queue),
            queue,
            prepare=lambda connection, _: self.topology.ensure_scheduling(connection, queue, self.cascade),
        )

    def reject_invalid(self, delivery: Delivery, code: str, message: str) -> None:
        """A message no handler can run: to its DLQ with the reason in the headers, then ack."""
        logger.warning(
            "message %s on %s sent to the dead letter queue: %s (%s)",
            delivery.properties.get("message_id"),
            delivery.queue,
            message,
            code,
            extra=message_log_extra(delivery.properties.get("message_id"), delivery.queue),
        )
        self.consumer.republish(
            delivery,
            (delivery.outgoing(error_headers(code, message)), self.names.dead_letter_exchange, delivery.queue),
            delivery.queue,
        )

    def reject_unexpected(self, delivery: Delivery) -> None:
        """A bug of ours met ``delivery``: log it with the traceback being handled, ``Basic.Nack`` it
        into its DLQ (nothing recorded: what records may be what failed).  Call it from an ``except``."""
        logger.exception(
            "unexpected error processing a delivery; sending it to the DLQ",
            extra=message_log_extra(delivery.properties.get("message_id"), delivery.queue),
        )
        self.consumer.nack(delivery)

    def hand_back(self, delivery: Delivery) -> None:
        """An unstarted job at shutdown: republish it unchanged to its queue, then ack (no attempt spent).

        A redelivered one already cost its lost worker an attempt: that is
        recorded (``worker_lost``) rather than forgiven by the hand-back.
        """
        if delivery.redelivered:
            self.triage(delivery)  # settles a redelivery as a failed attempt; never runs it
            return
        self.consumer.republish(
            delivery, (delivery.outgoing(), self.names.direct_exchange, delivery.queue), delivery.queue
        )


__all__ = [
    "DeadLetterMode",
    "Settlement",
    "Settler",
    "failed_message",
    "failure_error",
    "final_failure_record",
    "worker_lost",
]
