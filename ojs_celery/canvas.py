"""Celery chords on OJS workflows: a chord's header is an OJS batch, its body the batch's callback.

Celery starts a chord by asking the result backend (``backend.apply_chord``) before it publishes the
header; each header task then tells the backend it ended (``on_chord_part_return``).  Redis counts in
Redis; ``rpc://`` refuses chords (Celery 5.7; older versions fell back to ``celery.chord_unlock``, a
task polling the header's results every second, which needs a backend that stores them).

An :class:`ojs_celery.Celery` app's backend, whatever it is (``rpc://``, Redis, none), is wrapped by
:func:`chord_backend`:

* ``apply_chord`` starts an OJS batch (``ojs-workflows.md`` §6) whose id is the chord's group id:
  one member per header task (in the definition as ``ojs_celery.chord_member`` placeholders with the
  tasks' ids: Celery publishes the tasks themselves), ``on_success`` the body's task message as a job,
  ``on_failure`` the task :data:`CHORD_FAILED`.  Only the fan-ins are opened
  (:meth:`~ojs_kombu.runtime.workflow.WorkflowRunner.start` with ``enqueue=False``); the body's
  options get :data:`~ojs_celery.protocol.CHORD_OPTION`, which the codec reads in every header task
  message's ``chord`` and turns into the member's ``meta.workflow`` (index ``group_index``).
* ``mark_as_done`` / ``mark_as_failure`` / ``mark_as_revoked`` (what Celery's tracer calls in the pool
  process, before the message is acknowledged) report every job of a workflow that ended to the
  core's completion hook (:class:`~ojs_kombu.runtime.workflow.WorkflowHook`): the fan-in
  (:mod:`ojs_kombu.amqp.fanin`) counts each member once and its one winner publishes the callback
  once.  ``on_chord_part_return`` does nothing for these chords.
* The callback job reaches Celery as the body task with the header's results, in order, as its
  first argument (:data:`~ojs_celery.protocol.CHORD_RESULTS`); with ``reply_to`` and
  ``correlation_id`` kept in its ``meta.celery``, an ``rpc://`` client gets the body's result.
* A failed header task (failed for good: no retry left) fires :data:`CHORD_FAILED` instead, which does
  what Celery's Redis backend does: the body does not run, its result is a ``ChordError`` naming the
  first failed task and its error, and the body's errbacks are called.
* A body that is not one task (a chain, group or chord), or that is itself in an enclosing chord's
  header (a job belongs to one workflow), is applied with the results by :data:`CHORD_BODY`
  (``body.delay(results)``, as the Redis backend does).  A group id that is not a UUIDv7
  (``apply_async(task_id="...")``) gets a workflow id of its own, carried with it in the mark.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any, Final

from kombu.serialization import dumps as serialize
from kombu.utils.json import dumps as kombu_json

from ojs_kombu.amqp.topology import Topology
from ojs_kombu.model.ids import JOB_ID_RE, new_job_id
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import job_type_for, ojs_queue_for
from ojs_kombu.model.workflow import WORKFLOW_META_KEY, batch
from ojs_kombu.policy.retry import Failure
from ojs_kombu.runtime.workflow import TerminalState, WorkflowHook
from ojs_kombu.transport.queues import queue_map
from ojs_kombu.transport.settings import OJS_OPTIONS, Settings
from ojs_kombu.transport.transport import SSLTransport

from .protocol import CHORD_OPTION, CHORD_RESULTS, ENVELOPE_HEADER, CeleryCodec, chord_member

logger = logging.getLogger(__name__)

CHORDS_SETTING: Final = "ojs_chords"
"""The app setting that turns this off: ``app.conf.ojs_chords = False`` keeps the result backend's own chords
(Redis counts in Redis: about 16 ms for a two-task chord where a batch takes about 95 ms, measured)."""

CHORD_FAILED: Final = "ojs_celery.chord_failed"
"""The task a chord's batch fires when a header task failed: fails the body with a ``ChordError``."""

CHORD_BODY: Final = "ojs_celery.chord_body"
"""The task a chord's batch fires when its body is a chain, group or chord: applies it with the results."""

MEMBER_TYPE: Final = "ojs_celery.chord_member"
"""The job type of a header task's placeholder in the batch's definition."""

_WRAPPED: dict[type, type] = {}
_WRAPPED_LOCK = threading.Lock()
_HOOK_LOCK = threading.Lock()


class ChordBackend:
    """The mix-in :func:`chord_backend` puts in front of a Celery result backend class (see the module doc)."""

    app: Any

    def apply_chord(self, header_result_args: Any, body: Any, **kwargs: Any) -> Any:
        """Start the chord as an OJS batch (an empty header, which Celery never sends here: the backend's own)."""
        if not start_chord(self.app, header_result_args, body):
            return super().apply_chord(header_result_args, body, **kwargs)  # type: ignore[misc]
        return None

    def on_chord_part_return(self, request: Any, state: Any, result: Any, **kwargs: Any) -> Any:
        """Nothing for a chord of this app (its members report from ``mark_as_*``); else the backend's own.

        One exception: Celery's ``_fail_chain`` calls it for the last task of a chain in the header whose
        earlier task failed; that task never runs, so it reports ``failed`` here for it.
        """
        if not is_ojs_chord(getattr(request, "chord", None)):
            return super().on_chord_part_return(request, state, result, **kwargs)  # type: ignore[misc]
        if getattr(request, ENVELOPE_HEADER, None) is None:  # not a delivered task: a chain's unrun last task
            report_unrun(self.app, request, result)
        return None

    def mark_as_done(self, task_id: str, result: Any, request: Any = None, *args: Any, **kwargs: Any) -> Any:
        """Celery's, then a job of a workflow reports ``completed`` with its result."""
        outcome = super().mark_as_done(task_id, result, request, *args, **kwargs)  # type: ignore[misc]
        report(self.app, request, "completed", result=result)
        return outcome

    def mark_as_failure(
        self, task_id: str, exc: Any, traceback: Any = None, request: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        """Celery's, then a job of a workflow reports ``failed`` (the task failed for good: no retry left)."""
        outcome = super().mark_as_failure(task_id, exc, traceback, request, *args, **kwargs)  # type: ignore[misc]
        report(self.app, request, "failed", exc=exc)
        return outcome

    def mark_as_revoked(self, task_id: str, reason: str = "", request: Any = None, *args: Any, **kwargs: Any) -> Any:
        """Celery's, then a job of a workflow reports ``cancelled``."""
        outcome = super().mark_as_revoked(task_id, reason, request, *args, **kwargs)  # type: ignore[misc]
        report(self.app, request, "cancelled")
        return outcome

    def ensure_chords_allowed(self) -> None:
        """Chords need no result backend here (``rpc://`` and no backend refuse them in Celery)."""


def chord_backend(backend_cls: type) -> type:
    """The class of ``backend_cls`` with :class:`ChordBackend` in front (one per class, idempotent).

    Parameters:
        backend_cls: a Celery result backend class.

    Returns:
        The subclass (``backend_cls`` itself when it already is one).
    """
    if issubclass(backend_cls, ChordBackend):
        return backend_cls
    with _WRAPPED_LOCK:
        wrapped = _WRAPPED.get(backend_cls)
        if wrapped is None:
            wrapped = _WRAPPED[backend_cls] = type(
                backend_cls.__name__, (ChordBackend, backend_cls), {"__module__": backend_cls.__module__}
            )
        return wrapped


def is_ojs_chord(body: Any) -> bool:
    """Whether ``body`` (a request's ``chord``) is the body of a chord started as an OJS batch.

    Parameters:
        body: a chord body signature (a dict), or None.

    Returns:
        True when it carries :data:`~ojs_celery.protocol.CHORD_OPTION`.
    """
    return isinstance(body, Mapping) and isinstance((body.get("options") or {}).get(CHORD_OPTION), Mapping)


def start_chord(app: Any, header_result_args: Any, body: Any) -> bool:
    """Start a chord as an OJS batch: record it and open its fan-in, before Celery publishes the header.

    Parameters:
        app: the Celery app.
        header_result_args: ``(group id, [AsyncResult of each header task])``, as Celery gives ``apply_chord``.
        body: the body signature, frozen (its id is the chord's result id).

    Returns:
        False for an empty header (Celery calls the body itself then); nothing was started.

    Raises:
        OjsError: the broker refused a record (the chord is not started; Celery's ``apply_async`` raises).
    """
    from celery.canvas import Signature

    group_id, results = str(header_result_args[0]), list(header_result_args[1] or [])
    if not results:
        return False
    workflow_id = group_id if JOB_ID_RE.fullmatch(group_id) else new_job_id()
    body.options[CHORD_OPTION] = {"id": workflow_id, "group": group_id, "count": len(results)}
    reply_to = body.options.get("reply_to") or app.thread_oid
    queue = _route(app, body)
    root_id = body.options.get("root_id")
    if type(body) is Signature and not str(body.task).startswith("celery.") and not body.options.get("chord"):
        on_success = _callback_job(app, body, queue, reply_to=reply_to, results=not body.immutable)
    else:  # a chain, group or chord, or a body that is itself in a chord's header (a job is in one workflow)
        fire = app.signature(CHORD_BODY, args=(dict(body),), options=_internal(root_id))
        on_success = _callback_job(app, fire, queue, reply_to=reply_to, results=True)
    failed = app.signature(
        CHORD_FAILED, args=(dict(body), [result.id for result in results]), options=_internal(root_id)
    )
    # It answers for the body: an rpc:// client waits for a reply correlated to the body's id.
    on_failure = _callback_job(app, failed, queue, reply_to=reply_to, results=True, correlation_id=body.id)
    members = [
        Job.create(MEMBER_TYPE, [], queue=queue, id=result.id if JOB_ID_RE.fullmatch(str(result.id)) else None)
        for result in results
    ]
    workflow = batch(members, on_success=on_success, on_failure=on_failure, id=workflow_id, name=f"chord {group_id}")
    workflow_hook(app).run(lambda runner: runner.start(workflow, enqueue=False))
    return True


def chord_body(app: Any, results: list[Any], body: Mapping[str, Any]) -> None:
    """The task :data:`CHORD_BODY`: apply a chord's body that is not one task (a chain, a group) with the results.

    Parameters:
        app: the Celery app.
        results: every header task's result, in order.
        body: the body signature.
    """
    callback = app.signature(dict(body))
    callback.options.pop(CHORD_OPTION, None)
    callback.delay(results)


def chord_failed(app: Any, results: list[Any], body: Mapping[str, Any], member_ids: list[str]) -> None:
    """The task :data:`CHORD_FAILED`: fail the chord's body as Celery does when a header task failed.

    Parameters:
        app: the Celery app.
        results: every header task's ``parent_results`` entry, in order (``{"error": {...}}`` for a failed one).
        body: the body signature.
        member_ids: the header tasks' ids, in order.
    """
    from celery.exceptions import ChordError

    failures = [(i, r["error"]) for i, r in enumerate(results) if isinstance(r, Mapping) and set(r) == {"error"}]
    index, error = failures[0] if failures else (0, {})
    if not isinstance(error, Mapping):
        error = {}
    culprit = member_ids[index] if index < len(member_ids) else "?"
    if error.get("code") == "cancelled":  # revoked (an OJS cancel): what Celery's Redis backend says
        kind, message = "TaskRevokedError", "revoked"
    else:
        kind, message = error.get("type") or error.get("code") or "Error", error.get("message", "")
    exc = ChordError(f"Dependency {culprit} raised {kind}({message!r})")
    callback = app.signature(dict(body))
    callback.options.pop(CHORD_OPTION, None)
    try:
        raise exc
    except ChordError:  # Celery records the failure with the exception being handled (its traceback)
        app.backend.chord_error_from_stack(callback, exc)
    if is_ojs_chord(callback.options.get("chord")):  # the body is in an enclosing chord's header: it failed
        from celery.app.task import Context

        options = callback.options
        report_unrun(
            app, Context({**options, "id": callback.id, "task": callback.task, "group": options.get("group_id")}), exc
        )


def report(
    app: Any, request: Any, state: TerminalState, *, result: Any = None, exc: BaseException | None = None
) -> None:
    """Tell the workflow of ``request``'s job, if it is part of one, that the job ended (:class:`WorkflowHook`).

    Parameters:
        app: the Celery app.
        request: the task's request (its ``ojs_envelope`` header carries ``meta.workflow``), or None.
        state: ``completed``, ``failed`` or ``cancelled``.
        result: the task's return value (completed), as the JSON its result serializer makes of it.
        exc: the exception it failed with.

    Raises:
        Reject: (``requeue=True``) the broker refused the report twice, in a task's execution: the
            attempt is counted and the task runs again (``ojs_celery.request``), to report again.
            In the worker's main process the failure is logged instead.
    """
    envelope = getattr(request, ENVELOPE_HEADER, None) if request is not None else None
    if not isinstance(envelope, Mapping):
        return
    meta = envelope.get("meta")
    if not isinstance(meta, Mapping) or WORKFLOW_META_KEY not in meta:
        return
    job = Job.model_construct(
        id=envelope.get("id") or request.id,
        type=job_type_for(str(request.task)),
        queue=str(envelope.get("queue") or "default"),  # where the workflow's sweep job goes if this ends it
        args=[],
        meta=dict(meta),
        attempt=int(getattr(request, "retries", 0) or 0),
    )
    error = None
    if exc is not None:
        failure = Failure.from_exception(exc)
        error = {"code": failure.code, "type": failure.type, "message": failure.message}
    try:
        workflow_hook(app).on_terminal(job, state, _as_json(result), error)
    except Exception as failed:
        if app.current_worker_task is None:  # the worker's main process (a revoke, a lost worker): nothing to retry
            logger.error("job %s ended %s but its workflow was not told: %r", job.id, state, failed)
            return
        from celery.exceptions import Reject

        logger.warning(
            "job %s ended %s but could not be reported to its workflow (%r): running it again", job.id, state, failed
        )
        # A counted attempt (ojs_celery.request): the task runs again and reports again, counted once.
        raise Reject(
            f"the end of job {job.id} could not be reported to its workflow: {failed!r}", requeue=True
        ) from failed


def report_unrun(app: Any, request: Any, exc: Any) -> None:
    """Report ``failed`` for a header task that will never run (its chain failed before it), as its own run would.

    Parameters:
        app: the Celery app.
        request: the context Celery made of its signature (``chord``, ``group``, ``group_index``, ``id``).
        exc: the chain's error.
    """
    from celery.app.task import Context

    chord_body = getattr(request, "chord", None) or {}
    headers = {"group": getattr(request, "group", None), "group_index": getattr(request, "group_index", None)}
    member = chord_member(headers, {"chord": chord_body})
    if member is None:
        return
    task_id = getattr(request, "id", None) or new_job_id()
    envelope = {
        "id": task_id if JOB_ID_RE.fullmatch(str(task_id)) else new_job_id(),
        "meta": {WORKFLOW_META_KEY: member},
    }
    context = Context({"id": task_id, "task": getattr(request, "task", None) or MEMBER_TYPE, ENVELOPE_HEADER: envelope})
    report(app, context, "failed", exc=exc if isinstance(exc, BaseException) else None)


def workflow_hook(app: Any) -> WorkflowHook:
    """The process's completion hook of ``app``'s workflows (one connection of its own, opened on first use).

    Parameters:
        app: the Celery app.

    Returns:
        The hook (a new one in a forked pool process).
    """
    pid = os.getpid()
    found: tuple[int, WorkflowHook] | None = getattr(app, "_ojs_workflow_hook", None)
    if found is not None and found[0] == pid:
        return found[1]
    with _HOOK_LOCK:
        found = getattr(app, "_ojs_workflow_hook", None)
        if found is None or found[0] != pid:
            settings = Settings.from_options(dict(app.conf.broker_transport_options or {}))
            topology = Topology(
                settings.names,
                queue_options=settings.queue_options,
                per_queue=queue_map(settings.names.prefix).options,
            )
            found = (
                pid,
                WorkflowHook(
                    lambda: _hook_connection(app),
                    topology,
                    app_id=app.main or "celery",
                    sweep_after=settings.workflow_retention,
                ),
            )
            app._ojs_workflow_hook = found
        return found[1]


def close_workflow_hook(app: Any) -> None:
    """Close the connection of this process's completion hook of ``app`` (when it has one).

    Parameters:
        app: the Celery app.
    """
    found = getattr(app, "_ojs_workflow_hook", None)
    app._ojs_workflow_hook = None
    if found is not None and found[0] == os.getpid():  # a forked process leaves its parent's socket alone
        found[1].close()


def _hook_connection(app: Any) -> Any:
    """A plain py-amqp connection to the app's broker without heartbeats, as the core worker's hook uses:
    nothing drains it between reports, and a report after a broker restart reconnects (:class:`WorkflowHook`)."""
    connection = app.connection_for_write()
    options = {k: v for k, v in (connection.transport_options or {}).items() if k not in OJS_OPTIONS}
    tls = isinstance(connection.transport, SSLTransport)  # ojss:// puts its TLS options (verified) in .ssl
    ssl = connection.ssl
    if tls and isinstance(ssl, dict) and ssl.get("server_hostname", "") is None:
        ssl = {**ssl, "server_hostname": connection.hostname}
    return connection.clone(transport="pyamqp", heartbeat=0, transport_options=options, ssl=ssl)


def _internal(root_id: str | None) -> dict[str, Any]:
    """The options of the task message of :data:`CHORD_BODY` or :data:`CHORD_FAILED` (their ids are fixed in the batch)."""
    return {"task_id": new_job_id(), "ignore_result": True, "root_id": root_id}


def _route(app: Any, sig: Any) -> str:
    """The OJS queue a signature's task goes to (Celery's routing)."""
    route = app.amqp.router.route(dict(sig.options), sig.task, tuple(sig.args), dict(sig.kwargs))
    queue = route.get("queue")
    return ojs_queue_for(getattr(queue, "name", None) or str(queue or app.conf.task_default_queue))


def _callback_job(
    app: Any, sig: Any, queue: str, *, reply_to: str, results: bool, correlation_id: str | None = None
) -> Job:
    """The job of a signature's task message, as Celery would publish it, for the fan-in to publish."""
    options = sig.options
    message = app.amqp.create_task_message(
        options["task_id"],
        sig.task,
        tuple(sig.args),
        dict(sig.kwargs),
        group_id=options.get("group_id"),
        group_index=options.get("group_index"),
        expires=options.get("expires"),
        callbacks=options.get("link"),
        errbacks=options.get("link_error"),
        reply_to=reply_to,
        time_limit=options.get("time_limit"),
        soft_time_limit=options.get("soft_time_limit"),
        root_id=options.get("root_id"),
        parent_id=options.get("parent_id"),
        shadow=options.get("shadow"),
        chain=options.get("chain"),
        ignore_result=options.get("ignore_result", False),
    )
    content_type, encoding, body = serialize(message.body, serializer="json")
    properties = {"content_type": content_type, "content_encoding": encoding, **message.properties}
    if options.get("priority") is not None:
        properties["priority"] = options["priority"]
    job, _ = CeleryCodec().to_job(body, properties, dict(message.headers), queue)
    meta = dict(job.meta or {})
    celery_meta = {**meta["celery"], "reply_to": reply_to}
    if results:
        celery_meta[CHORD_RESULTS] = True
    if correlation_id is not None:
        celery_meta["correlation_id"] = correlation_id
    return job.model_copy(update={"meta": {**meta, "celery": celery_meta}})


def _as_json(result: Any) -> Any:
    """A task's result as JSON values (kombu's encoder: dates, UUIDs, decimals as Celery's JSON results carry them)."""
    if result is None or isinstance(result, (str, int, float, bool)):
        return result
    try:
        return json.loads(kombu_json(result))
    except (TypeError, ValueError):
        return result  # not JSON: the workflow records it as failed with invalid_result


__all__ = [
    "CHORD_BODY",
    "CHORDS_SETTING",
    "CHORD_FAILED",
    "MEMBER_TYPE",
    "ChordBackend",
    "chord_backend",
    "chord_body",
    "chord_failed",
    "close_workflow_hook",
    "is_ojs_chord",
    "report",
    "report_unrun",
    "start_chord",
    "workflow_hook",
]
