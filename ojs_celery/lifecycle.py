"""The job lifecycle events of a Celery worker (DESIGN §14): one :class:`Lifecycle` per worker process.

:class:`ojs_celery.request.Request` emits them in the worker's main process (the
one that reads the broker and the control streams; with ``prefork`` the pool
processes only run task code):

=================  ==================================================================
event              when
=================  ==================================================================
``started``        the pool accepted the task (``Request.on_accepted``)
``succeeded``      the task returned and its message is acked (``acks_late``, the
                   ``ojs_celery`` default; without it Celery acks before the task runs
                   and success is not reported)
``failed``         the task raised (not a ``Retry``), timed out or lost its process
``retried``        ``Task.retry`` or a counted attempt (time limit, lost process) was
                   published to the retry path
``dead-lettered``  the message was rejected into the dead letter queue
``cancelled``      a revoked (or OJS-cancelled) task was discarded or terminated
``expired``        a task past its ``expires`` was discarded
=================  ==================================================================

The ``ojs://`` transport emits to the same hub what it settles without Celery
(the transport option ``lifecycle``): ``cancelled`` for a cancelled job dropped on
delivery, ``failed`` then ``retried``/``dead-lettered`` for a redelivered job
(its worker died), ``dead-lettered`` for an invalid envelope.

Subscribe with ``worker_lifecycle().subscribe(callback)`` from the worker process,
e.g. in a worker bootstep or a ``celery.signals.worker_init`` handler.  The
process's :func:`worker_activity` is subscribed already: it answers INFO
requests (``ojs_kombu.Client.info``) through the transport option ``info``.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from ojs_kombu.model.info import JobInfo
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import job_type_for, ojs_queue_for
from ojs_kombu.policy.retry import Failure
from ojs_kombu.runtime.activity import Activity
from ojs_kombu.runtime.activity import worker_lifecycle as new_worker_lifecycle
from ojs_kombu.runtime.lifecycle import JobEventName, Lifecycle
from ojs_kombu.runtime.settle import failure_error

from .protocol import ENVELOPE_HEADER

logger = logging.getLogger(__name__)

#: The transport option :class:`ojs_celery.Celery` sets: the transport's own settling emits here too.
LIFECYCLE_HOOK = "ojs_celery.lifecycle:worker_lifecycle"

#: The transport option :class:`ojs_celery.Celery` sets: INFO requests are answered from :func:`worker_activity`.
INFO_HOOK = "ojs_celery.lifecycle:job_info"

_hub: tuple[Lifecycle, Activity] | None = None  # this process's (a forked child starts without one)
_lock = threading.Lock()


def worker_lifecycle() -> Lifecycle:
    """The :class:`Lifecycle` of this process (a forked process gets a new one, with its own worker id).

    Returns:
        The process's lifecycle hub.
    """
    return _process_hub()[0]


def worker_activity() -> Activity:
    """The :class:`~ojs_kombu.runtime.activity.Activity` of this process: running and recent jobs, fed by
    :func:`worker_lifecycle` (what INFO answers).

    Returns:
        The process's activity.
    """
    return _process_hub()[1]


def job_info(job_id: str) -> JobInfo | None:
    """The transport's ``info`` hook: what this worker process knows about ``job_id``.

    Parameters:
        job_id: the job id of an INFO request.

    Returns:
        Its :class:`~ojs_kombu.model.info.JobInfo`, or None when this worker never ran it.
    """
    return worker_activity().lookup(job_id)


def _process_hub() -> tuple[Lifecycle, Activity]:
    hub = _hub
    if hub is not None:
        return hub  # twice per task in the worker's main process: no lock, no getpid() system call
    return _new_hub()


def _new_hub() -> tuple[Lifecycle, Activity]:
    global _hub
    with _lock:
        if _hub is None:
            _hub = new_worker_lifecycle()
        return _hub


def _forget_hub() -> None:
    """In a forked child: the parent's hub is the parent's (its worker id names the parent)."""
    global _hub, _lock
    _hub = None
    _lock = threading.Lock()  # the parent may have held it while forking


os.register_at_fork(after_in_child=_forget_hub)


def request_job(request: Any) -> Job:
    """The OJS job of a Celery worker ``Request``, found once per request.

    The job the ``ojs://`` transport decoded from the delivery while it is unsettled
    (no second construction), else :func:`job_of`; kept on the request for its later events.

    Parameters:
        request: a ``celery.worker.request.Request``.

    Returns:
        The job.
    """
    job: Job | None = getattr(request, "_ojs_job", None)
    if job is None:
        message: Any = getattr(request, "message", None)
        delivered = getattr(getattr(message, "channel", None), "delivered_job", None)
        if delivered is not None:
            job = delivered(message.delivery_tag)
        if job is None:
            job = job_of(request)
        try:
            request._ojs_job = job
        except AttributeError:  # a Request class with __slots__ (not ojs_celery's)
            pass
    return job


def job_of(request: Any) -> Job:
    """The OJS job of a Celery worker ``Request`` from its headers (id, type, queue and attempt; not validated).

    Parameters:
        request: a ``celery.worker.request.Request``.

    Returns:
        The job, enough for a :class:`~ojs_kombu.runtime.lifecycle.JobEvent` (with its
        ``enqueued_at`` and ``scheduled_at``).
    """
    headers = request.request_dict
    envelope = headers.get(ENVELOPE_HEADER)
    job_id = envelope.get("id") if isinstance(envelope, dict) else None
    queue = (request.delivery_info or {}).get("routing_key") or "default"
    # The job metrics' queue wait and lateness: the envelope carries the job's created_at (the
    # transport does not carry enqueued_at, which is the same moment for a producer's job), the
    # Celery eta header is its scheduled_at.  A malformed one is ignored by the events.
    created_at = envelope.get("created_at") if isinstance(envelope, dict) else None
    eta = headers.get("eta")
    job: Job = Job.model_construct(
        specversion="1.0",
        id=str(job_id or request.id),
        type=job_type_for(str(request.name)),
        queue=ojs_queue_for(str(queue)),
        args=[],
        attempt=int(headers.get("retries") or 0),
        enqueued_at=created_at if isinstance(created_at, str) else None,
        scheduled_at=eta if isinstance(eta, str) else None,
    )
    return job


def emit(request: Any, event: JobEventName, exc: BaseException | None = None) -> None:
    """Emit ``event`` for ``request`` on :func:`worker_lifecycle` (the 1-based attempt is ``retries + 1``).

    Parameters:
        request: a ``celery.worker.request.Request``.
        event: what happened.
        exc: the exception of a ``failed`` event.
    """
    try:
        # Twice per task in the worker's main process: the job and the hub are read directly when known.
        job = getattr(request, "_ojs_job", None) or request_job(request)
        error = failure_error(Failure.from_exception(exc)) if exc is not None else None
        (_hub or _new_hub())[0].emit(event, job, job.attempt + 1, error=error)
    except Exception:  # events are observability: never in the way of settling the task
        logger.exception("could not emit the %s event of task %s", event, getattr(request, "id", "?"))


__all__ = [
    "INFO_HOOK",
    "LIFECYCLE_HOOK",
    "emit",
    "job_info",
    "job_of",
    "request_job",
    "worker_activity",
    "worker_lifecycle",
]
