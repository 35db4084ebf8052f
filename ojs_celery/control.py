"""OJS cancels as Celery revokes, and Celery revokes as OJS cancels (binding §5.6, DESIGN §14).

**An OJS cancel reaches Celery workers.**  The ``ojs://`` transport reads the
control stream ``ojs.queue.control.{q}`` of every queue a worker consumes,
replayed from its start before the queue is consumed, and:

* drops a cancelled job when it is delivered (acked, never run, never retried
  or dead-lettered), wherever it waited: queued, counting down in the
  scheduling cascade (``countdown``/``eta``), or in a retry queue;
* hands every cancel to :func:`on_cancel` (the transport option ``on_cancel``
  that :class:`ojs_celery.Celery` sets), which revokes it in the worker as
  ``app.control.revoke`` would: the id goes to ``celery.worker.state.revoked``,
  so a request Celery already holds (prefetched, or waiting for its ETA) is
  discarded and recorded as REVOKED; a task running now is terminated when
  ``ojs_cancel_terminate`` is set.

Settings (``app.conf``):

``ojs_cancel_terminate`` (default ``False``, like ``revoke(terminate=False)``)
    terminate a running task that is cancelled: Celery's
    ``Request.terminate(pool, signal)``, so the task is recorded REVOKED
    (``terminated``) and its message acked.  The ``prefork`` pool kills the pool
    process running it (and starts another); the ``threads``, ``solo``,
    ``eventlet`` and ``gevent`` pools cannot terminate a task: it runs to its end
    (logged), and only the jobs it has not started are dropped.
``ojs_cancel_signal`` (default ``"SIGTERM"``)
    the signal ``prefork`` sends (``"SIGKILL"`` for a task that ignores SIGTERM).

The revoke happens in every process where a worker of this app runs (a
:class:`CancelStep` registers each worker), in the worker's consumer thread.

**A dropped task is REVOKED.**  Celery never sees a job the transport dropped on
delivery, so the transport's lifecycle (the transport option ``lifecycle``,
:func:`transport_lifecycle`) records it as Celery records a revoked task it
meets: ``REVOKED`` (``TaskRevokedError("revoked")``) in the result backend of each
worker's app in this process (:func:`record_revoked`), so ``AsyncResult(id).state``
does not stay ``PENDING``; a chord member's chord fails as in stock Celery.  Skipped
as stock Celery skips it (``ignore_result`` without ``store_errors_even_if_ignored``),
and for ``rpc://``, whose result goes to the caller's reply queue: the dropped
job does not carry it.

**A Celery revoke reaches OJS.**  :class:`Control` (``app.control``, also what
``AsyncResult.revoke()`` calls) publishes an OJS cancel (confirmed) for each id
to the control stream of every job queue of the app: every queue of
``app.amqp.queues`` (``task_queues``, the default queue, and the queues this
process routed tasks to), durable and not bound to a broadcast exchange, or the
``ojs_queues=`` given to ``revoke``; then Celery's own broadcast goes out as
before.  The cancel survives worker restarts and reaches jobs still in the
broker.  Ids must be the OJS job ids: ``ojs_celery.Celery`` task ids are (UUIDv7).
``revoke_by_stamped_headers`` is Celery's alone (no job id to cancel).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from typing import Any

from celery import bootsteps
from celery.app import control as celery_control
from celery.app.task import Context
from celery.backends.base import DisabledBackend
from celery.backends.rpc import RPCBackend
from celery.platforms import signals as celery_signals
from celery.utils.functional import maybe_list
from celery.worker import state as worker_state

from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import ojs_queue_for
from ojs_kombu.runtime.lifecycle import JobEvent, JobEventName, Lifecycle, Subscriber
from ojs_kombu.transport.channel import BROADCAST_EXCHANGE_TYPES
from ojs_kombu.transport.state import ConnectionState

from .canvas import ChordBackend, report
from .lifecycle import worker_lifecycle
from .protocol import CeleryCodec

logger = logging.getLogger(__name__)

#: The transport option :class:`ojs_celery.Celery` sets so the transport calls :func:`on_cancel`.
ON_CANCEL_HOOK = "ojs_celery.control:on_cancel"
#: The transport option ``lifecycle`` :class:`ojs_celery.Celery` sets: :func:`transport_lifecycle`.
TRANSPORT_LIFECYCLE_HOOK = "ojs_celery.control:transport_lifecycle"
#: The reason stock Celery records for a revoked task it discards.
REVOKED_REASON = "revoked"
CANCEL_TERMINATE_SETTING = "ojs_cancel_terminate"
CANCEL_SIGNAL_SETTING = "ojs_cancel_signal"
DEFAULT_CANCEL_SIGNAL = "SIGTERM"


class WorkerCanceller:
    """Revokes cancelled jobs in one Celery worker (``WorkController``).

    Parameters:
        worker: the worker (its app's settings and its pool are used).
    """

    def __init__(self, worker: Any):
        self.worker = worker
        conf = worker.app.conf
        self.terminate = bool(conf.get(CANCEL_TERMINATE_SETTING, False))
        self.signal = celery_signals.signum(conf.get(CANCEL_SIGNAL_SETTING) or DEFAULT_CANCEL_SIGNAL)

    def cancel(self, task_id: str) -> None:
        """Terminate the running request of ``task_id`` if the settings say so (the id is revoked already)."""
        if not self.terminate:
            return
        for request in list(worker_state.active_requests):
            if request.id != task_id or request._already_revoked:
                continue
            try:
                request.terminate(self.worker.pool, signal=self.signal)
            except NotImplementedError:
                logger.info(
                    "task %s was cancelled while running; the %s pool cannot terminate it: it runs to its end",
                    task_id,
                    type(self.worker.pool).__name__,
                )
            else:
                logger.info("task %s was cancelled while running: terminated (signal %d)", task_id, self.signal)


_cancellers: list[WorkerCanceller] = []
_lock = threading.Lock()
_CODEC = CeleryCodec()


def on_cancel(job_id: str) -> None:
    """The transport's ``on_cancel`` hook: revoke ``job_id`` in every worker of this process.

    Idempotent (the transport replays every retained cancel on each connection).

    Parameters:
        job_id: the cancelled job's id (the Celery task id).
    """
    worker_state.revoked.add(job_id)
    with _lock:
        cancellers = list(_cancellers)
    for canceller in cancellers:
        canceller.cancel(job_id)


def dropped_request(job: Job) -> Context:
    """The Celery request context of a job the transport dropped (what the task message would have said).

    Parameters:
        job: the dropped job.

    Returns:
        A :class:`celery.app.task.Context` with the task's id, name, headers (group, chord
        ...), arguments and its message's ``reply_to``/``correlation_id`` if the job has them.
    """
    body, properties, headers = _CODEC.from_job(job, {}, {})
    args, kwargs, embed = json.loads(body)
    return Context({**headers, **embed, **properties, "args": args, "kwargs": kwargs})


def record_revoked(job: Job) -> None:
    """Record ``job`` (dropped on delivery, never seen by Celery) as ``REVOKED`` (see the module docstring).

    In the result backend of the app of each worker of this process; a failing backend is
    logged (the job is settled already).

    Parameters:
        job: the dropped job.
    """
    with _lock:
        apps = {id(c.worker.app): c.worker.app for c in _cancellers}
    if not apps:
        return
    request = dropped_request(job)
    for app in apps.values():
        backend = app.backend
        if isinstance(backend, ChordBackend):  # a chord's header task: its chord fails, whatever is stored
            report(app, request, "cancelled")
        if isinstance(backend, (DisabledBackend, RPCBackend)):
            continue
        task = app.tasks.get(request.task)
        if task is not None and task.ignore_result and not task.store_errors_even_if_ignored:
            continue
        try:
            backend.mark_as_revoked(request.id, REVOKED_REASON, request=request)
        except Exception:
            logger.exception("could not record the dropped task %s as REVOKED", request.id)


class DroppedTaskLifecycle(Lifecycle):
    """The transport's lifecycle: events go to :func:`~ojs_celery.lifecycle.worker_lifecycle`, and a
    job dropped on delivery (``cancelled``, the only ``cancelled`` the transport emits) is
    recorded REVOKED (:func:`record_revoked`).

    Parameters:
        hub: where the events go (default: this process's :func:`~ojs_celery.lifecycle.worker_lifecycle`).
    """

    def __init__(self, hub: Lifecycle | None = None):
        self.hub = hub or worker_lifecycle()
        super().__init__(self.hub.worker_id)

    def subscribe(self, subscriber: Subscriber, *, deferred: bool = False) -> None:
        """Subscribe to the hub."""
        self.hub.subscribe(subscriber, deferred=deferred)

    def flush(self) -> None:
        """Flush the hub (its deferred subscribers)."""
        self.hub.flush()

    def emit(
        self, event: JobEventName, job: Job, attempt: int, *, error: dict[str, Any] | None = None
    ) -> JobEvent | None:
        """Record a ``cancelled`` job REVOKED, then emit ``event`` on the hub (see :meth:`Lifecycle.emit`)."""
        if event == "cancelled":
            record_revoked(job)
        return self.hub.emit(event, job, attempt, error=error)


def transport_lifecycle() -> Lifecycle:
    """The transport option ``lifecycle`` of :class:`ojs_celery.Celery` (called per channel).

    Returns:
        A :class:`DroppedTaskLifecycle` on this process's worker lifecycle.
    """
    return DroppedTaskLifecycle()


class CancelStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """Worker bootstep: while the worker runs, OJS cancels read by its transport revoke its tasks."""

    label = "OJS cancel"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, **kwargs: Any):
        super().__init__(worker, **kwargs)
        self.canceller: WorkerCanceller | None = None

    def start(self, worker: Any) -> None:
        """Register the worker with :func:`on_cancel`."""
        self.canceller = WorkerCanceller(worker)
        with _lock:
            _cancellers.append(self.canceller)

    def stop(self, worker: Any) -> None:
        """Unregister the worker."""
        with _lock:
            if self.canceller in _cancellers:
                _cancellers.remove(self.canceller)

    terminate = stop


def cancel_queues(app: Any) -> list[str]:
    """The OJS queues a revoke publishes its cancels to (see the module docstring).

    Parameters:
        app: the Celery app.

    Returns:
        The OJS names of the app's durable queues not bound to a broadcast exchange, in order.
    """
    passthrough = set((app.conf.broker_transport_options or {}).get("passthrough_queues") or ())
    found: list[str] = []
    for queue in app.amqp.queues.values():
        exchange_type = getattr(queue.exchange, "type", "direct") if queue.exchange is not None else "direct"
        if (
            not queue.durable
            or queue.exclusive
            or queue.auto_delete
            or exchange_type in BROADCAST_EXCHANGE_TYPES
            or queue.name in passthrough
        ):
            continue
        ojs_queue = ojs_queue_for(queue.name)
        if ojs_queue not in found:
            found.append(ojs_queue)
    return found


def publish_cancels(app: Any, task_ids: Iterable[str], queues: Iterable[str] | None = None) -> int:
    """Publish an OJS cancel (confirmed) for each of ``task_ids`` to the control stream of each queue.

    Parameters:
        app: the Celery app (its connection pool is used).
        task_ids: the ids to cancel.
        queues: the queues (Celery or OJS names); default :func:`cancel_queues`.

    Returns:
        How many cancels were published (0 when the app's broker is not ``ojs://``).

    Raises:
        ValidationError: an empty id.
        PublishError: the broker returned or nacked a cancel, or did not confirm it in time.
    """
    ids = [str(task_id) for task_id in task_ids]
    targets = cancel_queues(app) if queues is None else list(dict.fromkeys(ojs_queue_for(q) for q in queues))
    if not ids or not targets:
        return 0
    published = 0
    with app.pool.acquire(block=True) as connection:
        state = getattr(connection.connection, "ojs", None)
        if not isinstance(state, ConnectionState):
            return 0  # a stock AMQP transport: Celery's broadcast is all there is
        for task_id in ids:
            for queue in targets:
                state.publish_cancel(task_id, queue)
                published += 1
    return published


class Control(celery_control.Control):  # type: ignore[misc]  # Celery is untyped
    """``app.control`` of :class:`ojs_celery.Celery`: :meth:`revoke` also publishes OJS cancels."""

    def revoke(
        self,
        task_id: Any,
        destination: Any = None,
        terminate: bool = False,
        signal: str = celery_control.TERM_SIGNAME,
        **kwargs: Any,
    ) -> Any:
        """As :meth:`celery.app.control.Control.revoke`, after publishing an OJS cancel of each id.

        Parameters:
            task_id: an id or a list of ids.
            destination, terminate, signal, kwargs: Celery's.
            ojs_queues: (keyword) the queues whose control streams get the cancels
                (default: :func:`cancel_queues`).

        Raises:
            PublishError: a cancel was not confirmed by the broker (Celery's broadcast went out anyway).
        """
        queues = kwargs.pop("ojs_queues", None)
        try:
            publish_cancels(self.app, maybe_list(task_id) or [], queues)
        finally:
            result = super().revoke(task_id, destination=destination, terminate=terminate, signal=signal, **kwargs)
        return result


__all__ = [
    "CANCEL_SIGNAL_SETTING",
    "CANCEL_TERMINATE_SETTING",
    "CancelStep",
    "Control",
    "DroppedTaskLifecycle",
    "ON_CANCEL_HOOK",
    "REVOKED_REASON",
    "TRANSPORT_LIFECYCLE_HOOK",
    "WorkerCanceller",
    "cancel_queues",
    "dropped_request",
    "on_cancel",
    "publish_cancels",
    "record_revoked",
    "transport_lifecycle",
]
