"""The worker-side Request of ``ojs_celery``: time limits and lost workers are counted attempts.

Stock Celery, with ``acks_late``, answers a hard time limit with
``reject(requeue=True)`` (unless ``acks_on_timeout``) and a lost worker with a
requeue when ``reject_on_worker_lost`` is set: the broker redelivers at once,
and a task that always times out or kills its process loops forever.

:class:`Request` treats both as a failed attempt (DESIGN §5):

* attempts left (``retries < max_retries``, or ``max_retries=None``): the task
  is republished through the OJS retry path (``ojs.queue.retry.{q}.{ms}``,
  ``x-ojs-attempt`` + 1, after ``default_retry_delay``), marked RETRY, then acked;
* no attempts left: the usual failure handling, then ``Basic.Nack`` into
  ``ojs.queue.dlx.{q}`` — never a requeue.

It is installed on every task of an :class:`ojs_celery.Celery` app (the app's
``Task`` class, and tasks declared with another ``base=`` when the app
finalizes).
"""

from __future__ import annotations

import logging
from typing import Any

from billiard.einfo import ExceptionInfo, ExceptionWithTraceback  # type: ignore[import-untyped]
from billiard.exceptions import Terminated  # type: ignore[import-untyped]
from celery.exceptions import Ignore, Retry, TimeLimitExceeded, WorkerLostError
from celery.worker import request as celery_request
from celery.worker.request import task_ready

from ojs_kombu.model.fields import JobState
from ojs_kombu.model.job import Job
from ojs_kombu.policy.retry import Failure
from ojs_kombu.transport.message import DecodedMessage

from .lifecycle import emit, request_job

logger = logging.getLogger(__name__)

STOCK_REQUEST = "celery.worker.request:Request"
REQUEST = "ojs_celery.request:Request"


class Request(celery_request.Request):  # type: ignore[misc]  # Celery is untyped
    """A Celery ``Request`` that never requeues: timeouts and lost workers are counted attempts."""

    # A hard time limit reaches the request twice (the pool's timeout handler and
    # the job's error callback, in either order): the first one settles it.
    _ojs_counted = False
    _ojs_exhausted = False
    # Set once the attempt has an outcome other than success (its lifecycle events are emitted).
    _ojs_outcome = False
    # The job its lifecycle events are about (ojs_celery.lifecycle.request_job).
    _ojs_job = None
    # What failed last, for the dead letter of a reject (the ojs:// channel records it before its nack).
    _ojs_failure: BaseException | None = None
    # The task raised Ignore (Task.replace() among others: its replacement carries the same task id).
    _ojs_ignored = False

    # What the pool process gets (Celery's create_request_cls sends body, content_type and
    # content_encoding): for a job delivery of the ojs:// transport, the [args, kwargs, embed] the
    # transport built from the job it read (DecodedMessage), as Celery hands over a protocol 1
    # message's, instead of the JSON body for the pool process to parse again.  Read once per task:
    # cheaper than an __init__ override, which costs every request a second call with 12 arguments.

    @property
    def body(self) -> Any:
        """The payload handed over by the ``ojs://`` transport, else the message body."""
        payload = _handed_over(self._message)
        return self._body if payload is None else payload

    @property
    def content_type(self) -> str | None:
        """None for a handed-over payload (nothing to decode), else the message's content type."""
        return self._content_type if _handed_over(self._message) is None else None

    @property
    def content_encoding(self) -> str | None:
        """None for a handed-over payload, else the message's content encoding."""
        return self._content_encoding if _handed_over(self._message) is None else None

    def on_accepted(self, pid: int, time_accepted: float) -> Any:
        """The pool started the task: lifecycle ``started``."""
        result = super().on_accepted(pid, time_accepted)
        emit(self, "started")
        return result

    def acknowledge(self) -> Any:
        """Ack the message; an ack after the task ran with no other outcome is a success (``succeeded``).

        Celery's worker replaces ``on_success`` with its own per task, so success is seen here.
        """
        succeeded = not self.acknowledged and not self._ojs_outcome and self.time_start and self.task.acks_late
        job = request_job(self) if succeeded else None  # before the ack: the transport's job, unique policy included
        if succeeded and not self._ojs_ignored:
            # With the transport option deduplicate, the ojs:// channel records the job id before its ack
            # (not after Ignore: Task.replace() sends its replacement under the same id).
            note_success = getattr(self._message.channel, "note_success", None)
            if note_success is not None:
                note_success(self._message.delivery_tag)
        result = super().acknowledge()
        if succeeded:
            emit(self, "succeeded")
            _release(self, job, "completed")
        return result

    def on_retry(self, exc_info: Any) -> Any:
        """``Task.retry`` published the next attempt: ``failed``, then ``retried``."""
        self._ojs_outcome = True
        result = super().on_retry(exc_info)
        exc = exc_info.exception
        exc = getattr(exc, "exc", exc)  # ExceptionWithTraceback
        emit(self, "failed", getattr(exc, "exc", None) or exc)  # Retry carries the task's exception
        emit(self, "retried")
        return result

    def _announce_revoked(self, reason: str, terminated: bool, signum: Any, expired: bool) -> Any:
        """A revoked (or OJS-cancelled) task discarded or terminated: ``cancelled`` (``expired``)."""
        self._ojs_outcome = True
        result = super()._announce_revoked(reason, terminated, signum, expired)
        emit(self, "expired" if expired else "cancelled")
        _release(self, request_job(self), "discarded" if expired else "cancelled")
        return result

    def on_timeout(self, soft: bool, timeout: float) -> Any:
        """Hard time limit: retry through the retry queue while attempts remain, else dead-letter."""
        if soft or self._ojs_counted:
            return None if self._ojs_counted else super().on_timeout(soft, timeout)
        if self.task.acks_late and self._attempts_left():
            task_ready(self)
            logger.error(
                "Hard time limit (%ss) exceeded for %s[%s]; retrying (a counted attempt)", timeout, self.name, self.id
            )
            if self._retry_counted(TimeLimitExceeded(timeout)):
                return None
        # Exhausted: Celery's failure handling; its requeue becomes a Nack (see reject()).
        self._ojs_failure = TimeLimitExceeded(timeout)
        return super().on_timeout(soft, timeout)

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> Any:
        """A hard time limit or a lost worker (the pool process died) is a counted attempt."""
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if isinstance(exc, Ignore):
            self._ojs_ignored = True
        if self._ojs_counted:
            return None
        counted = isinstance(exc, (WorkerLostError, TimeLimitExceeded)) or (
            isinstance(exc, (SystemExit, KeyboardInterrupt)) and not (self._already_cancelled or self._already_revoked)
        )
        if (
            counted
            and self.task.acks_late
            and not (isinstance(exc, WorkerLostError) and self.task.retry_on_worker_lost)
            and self._attempts_left()
        ):
            task_ready(self)
            if self._retry_counted(exc):
                return None
        if self._is_failed_attempt(exc):
            self._ojs_outcome = True
            emit(self, "failed", exc)
        if isinstance(exc, BaseException):
            self._ojs_failure = exc
        return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

    def _is_failed_attempt(self, exc: BaseException) -> bool:
        """Whether ``exc`` ends the attempt as ``failed`` (not a retry, a revoke or a cancel; reported once)."""
        if self._ojs_outcome or self._already_revoked or self._already_cancelled:
            return False
        return not isinstance(exc, (Retry, Terminated, Ignore))

    def reject(self, requeue: bool = False) -> Any:
        """Reject the message; a requeue left after the above (an exhausted task) becomes a Nack."""
        if requeue and self._ojs_exhausted:
            requeue = False
        rejecting = not self.acknowledged
        if rejecting and not requeue and self._ojs_failure is not None:
            # The dead letter says why: the ojs:// channel records this failure, then nacks.
            note_failure = getattr(self._message.channel, "note_failure", None)
            if note_failure is not None:
                note_failure(self._message.delivery_tag, Failure.from_exception(self._ojs_failure))
        job = request_job(self) if rejecting and not requeue else None
        result = super().reject(requeue=requeue)
        if rejecting and not requeue:
            self._ojs_outcome = True
            emit(self, "dead-lettered")
            _release(self, job, "discarded")
        return result

    def _attempts_left(self) -> bool:
        max_retries = self.task.max_retries
        left = max_retries is None or self._context.retries < max_retries
        self._ojs_exhausted = not left
        return left

    def _retry_counted(self, exc: BaseException) -> bool:
        """Republish as the next attempt (retry path), mark RETRY, ack; False if the publish failed."""
        task, request = self.task, self._context
        countdown = task.default_retry_delay
        try:
            raise exc
        except BaseException:  # noqa: BLE001 - only to capture the exception info
            einfo = ExceptionInfo()
        try:
            task.signature_from_request(request, countdown=countdown, retries=request.retries + 1).apply_async()
        except Exception as send_exc:  # noqa: BLE001
            logger.error("could not retry %s[%s] after %r: %r", self.name, self.id, exc, send_exc)
            self._ojs_exhausted = True
            return False
        self._ojs_counted = True
        self._ojs_outcome = True
        emit(self, "failed", exc)
        emit(self, "retried")
        if self.store_errors:
            task.backend.mark_as_retry(self.id, exc, einfo.traceback, request=request)
        self.acknowledge()
        self.send_event("task-retried", exception=repr(exc), traceback=str(einfo.traceback))
        task.request_stack.push(request)
        try:
            task.on_retry(exc, self.id, self.args, self.kwargs, einfo)
        finally:
            task.request_stack.pop()
        logger.info("Task %s[%s] retry: %r", self.name, self.id, Retry(exc=exc, when=countdown))
        return True


def _handed_over(message: Any) -> Any:
    return message.handed_over if type(message) is DecodedMessage else None


def _release(request: Any, job: Job | None, state: JobState) -> None:
    """Free the unique lock (``ojs_unique``) of ``request``'s job, which ended in ``state``: through its
    ``ojs://`` connection, which does it from its loop (:meth:`~ojs_kombu.transport.state.ConnectionState.release`)."""
    if job is None or job.unique is None:
        return
    ojs = getattr(getattr(getattr(request, "_message", None), "channel", None), "ojs", None)
    if ojs is not None:
        ojs.release(job, state)


__all__ = ["REQUEST", "STOCK_REQUEST", "Request"]
