"""Celery task messages (protocol v2) <-> OJS envelopes: the codec of the ``ojs://`` transport.

Publishing (:meth:`CeleryCodec.to_job`), a Celery message ``headers`` /
``(args, kwargs, embed)`` becomes::

    type        job_type_for(headers["task"])    ("Reports.BuildPDF" -> "reports.build_pdf")
    id          headers["id"] if it is a UUIDv7, else a new UUIDv7 (the Celery id in meta.celery.id)
    args        args
    meta.kwargs kwargs (omitted when empty)
    meta.celery {"task": name, "id"?, "headers": {...}, "embed": {...}}: every other Celery header
                (root/parent ids, group, time limits, reprs, custom headers) and the canvas
                (callbacks, errbacks, chain, chord), so they round-trip exactly
    attempt     headers["retries"]               (x-ojs-attempt = retries + 1)
    priority    the message priority
    scheduled_at headers["eta"];  expires_at headers["expires"]
    retry       {"max_attempts": task.max_retries + 1} (x-ojs-max-attempts)
    meta.traceparent / tracestate   from the W3C headers (x-ojs-trace-id / x-ojs-trace-state)

A retry (``retries > 0``) also records the failure: ``error``, ``errors[]`` and
the ``x-ojs-error-code`` / ``x-ojs-error-message`` headers, from the exception
being handled when ``Task.retry`` publishes.

Consuming (:meth:`CeleryCodec.from_job`) reverses it.  A job from another
producer becomes a message for the Celery task whose name maps to its
``type``; envelope fields Celery has no place for (the OJS id, retry policy,
error history, foreign ``meta``) travel in the Celery header ``ojs_envelope``,
which Celery copies into a retry's message, so a retried job keeps its id and
history.  JSON only: any other content type is refused.
"""

from __future__ import annotations

import contextvars
import json
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.ids import JOB_ID_RE, new_job_id
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import job_type_for
from ojs_kombu.model.policies import UNLIMITED_ATTEMPTS, RetryPolicy
from ojs_kombu.model.timefmt import format_timestamp
from ojs_kombu.model.workflow import WORKFLOW_META_KEY, FanInRef, WorkflowContext
from ojs_kombu.policy.retry import Failure, record_failure
from ojs_kombu.transport.settings import TaskMessage
from ojs_kombu.wire.codec import CONTENT_ENCODING, OutgoingMessage, encode
from ojs_kombu.wire.headers import DEATH_HEADERS, Header, error_headers, strip_death_headers

#: Celery header carrying the envelope fields Celery does not model, inside Celery only.
ENVELOPE_HEADER = "ojs_envelope"

#: The option of ``apply_async`` and of ``@app.task`` that gives the job its unique policy
#: (a :class:`~ojs_kombu.UniquePolicy` or a dict of its fields: ``docs/unique-jobs.md``).
UNIQUE_OPTION = "ojs_unique"
#: The option of a chord body's signature that makes its header an OJS batch (:mod:`ojs_celery.canvas`):
#: ``{"id": workflow id, "group": group id, "count": header size}``; the header's task messages carry it
#: in their ``chord``.
CHORD_OPTION = "ojs_chord"
#: The ``meta.celery`` key of a chord's callback job: its Celery task gets the header's results
#: (``parent_results`` in index order) as its first argument, as Celery calls a chord body.
CHORD_RESULTS = "chord_results"
JSON_CONTENT_TYPE = "application/json"

#: The exception a running ``Task.retry(exc=…)`` was given (set by :class:`ojs_celery.Task`).
retrying_exception: contextvars.ContextVar[BaseException | None] = contextvars.ContextVar(
    "ojs_celery_retrying_exception", default=None
)

#: Celery headers with a field of their own in the envelope.
_MAPPED = frozenset({"lang", "task", "id", "eta", "expires", "retries", "traceparent", "tracestate", ENVELOPE_HEADER})
#: Envelope fields carried in ``ojs_envelope`` (the rest is rebuilt from Celery's own data).
_CARRIED = ("id", "created_at", "retry", "timeout", "errors", "unique")
_EMBED_KEYS = ("callbacks", "errbacks", "chain", "chord")
#: Celery's protocol 2 headers a task message always has, at their defaults (root_id and timelimit are set per message).
_CELERY_DEFAULTS: dict[str, Any] = dict.fromkeys(
    ("parent_id", "group", "group_index", "shadow", "origin", "ignore_result")
)
_CELERY_DEFAULTS["lang"] = "py"
#: The key of the objects kombu's JSON decoder turns into Python types (datetime, UUID, ...).
_KOMBU_TYPED = b'"__type__"'


class TaskIndex:
    """Finds Celery tasks by OJS job type, and their ``max_retries``, in the process's Celery apps."""

    def __init__(self) -> None:
        self._by_type: dict[str, str] = {}

    @staticmethod
    def _tasks() -> dict[str, Any]:
        from celery import _state

        tasks: dict[str, Any] = {}
        for app in list(_state._get_active_apps()):
            tasks.update(getattr(app, "_tasks", None) or {})
        return tasks

    def name_for(self, job_type: str) -> str:
        """The name of the registered task whose name maps to ``job_type`` (else ``job_type``)."""
        name = self._by_type.get(job_type)
        if name is None:
            self._by_type = {job_type_for(n): n for n in self._tasks() if not n.startswith("celery.")}
            name = self._by_type.get(job_type, job_type)
        return name

    def unique(self, name: str) -> Any:
        """The ``ojs_unique`` option of task ``name`` (``@app.task(ojs_unique={...})``), or None."""
        task = self._tasks().get(name)
        return getattr(task, UNIQUE_OPTION, None) if task is not None else None

    def max_attempts(self, name: str) -> int | None:
        """``max_retries + 1`` of task ``name`` (None when the task is unknown here)."""
        task = self._tasks().get(name)
        if task is None:
            return None
        max_retries = getattr(task, "max_retries", None)
        return UNLIMITED_ATTEMPTS if max_retries is None else int(max_retries) + 1


class CeleryCodec:
    """The ``ojs://`` transport's codec for Celery protocol v2 task messages."""

    def __init__(self, tasks: TaskIndex | None = None):
        self.tasks = tasks or TaskIndex()

    def is_task(self, properties: dict[str, Any], headers: dict[str, Any]) -> bool:
        """A Celery protocol v2 task message has ``task`` and ``id`` headers."""
        return "task" in headers and "id" in headers

    # -- publishing ----------------------------------------------------------------------------

    def to_job(
        self, body: bytes, properties: dict[str, Any], headers: dict[str, Any], queue: str
    ) -> tuple[Job, OutgoingMessage]:
        """The OJS job of a Celery task message for OJS queue ``queue``, and its encoded message."""
        args, kwargs, embed = _payload(body, properties, headers)
        name = str(headers["task"])
        celery_id = str(headers["id"])
        carried = headers.get(ENVELOPE_HEADER)
        carried = dict(carried) if isinstance(carried, dict) else {}
        job_id = _v7(celery_id) or _v7(carried.get("id")) or new_job_id()

        celery_meta: dict[str, Any] = {"task": name}
        if celery_id != job_id:
            celery_meta["id"] = celery_id
        rest = {
            k: _plain(v) for k, v in headers.items() if k not in _MAPPED and not _is_binding_header(k) and not _empty(v)
        }
        if rest:
            celery_meta["headers"] = rest
        embedded = {k: v for k, v in (embed or {}).items() if v}
        if embedded:
            celery_meta["embed"] = embedded
        meta = dict(carried.get("meta") or {})
        meta["celery"] = celery_meta
        if WORKFLOW_META_KEY not in meta:
            member = chord_member(headers, embedded)
            if member is not None:
                meta[WORKFLOW_META_KEY] = member
        for header in ("traceparent", "tracestate"):
            if isinstance(headers.get(header), str):
                meta[header] = headers[header]

        retry = _retry_policy(carried.get("retry"), headers.get(Header.MAX_ATTEMPTS), self.tasks.max_attempts(name))
        retries = int(headers.get("retries") or 0)
        job = Job.create(
            job_type_for(name),
            list(args),
            queue=queue,
            kwargs=dict(kwargs),
            meta=meta,
            priority=properties.get("priority"),
            retry=retry,
            id=job_id,
            scheduled_at=_moment(headers.get("eta")),
            expires_at=_moment(headers.get("expires")),
            unique=properties.get(UNIQUE_OPTION) or carried.get("unique") or self.tasks.unique(name),
        )
        kept = {k: carried[k] for k in ("created_at", "timeout", "errors") if k in carried}
        if kept:
            job = job.model_copy(update=kept)
        extra: dict[str, Any] = {}
        if retries > 0:
            failure = _current_failure()
            job = record_failure(job, retries, failure)
            extra = error_headers(failure.code, failure.message)
        message = encode(job, app_id=properties.get("app_id"), headers=extra)
        for prop in ("correlation_id", "reply_to"):
            if properties.get(prop):
                message.properties[prop] = properties[prop]
        return job, message

    # -- consuming -----------------------------------------------------------------------------

    def from_job(
        self, job: Job, properties: dict[str, Any], headers: dict[str, Any]
    ) -> tuple[bytes, dict[str, Any], dict[str, Any]]:
        """A delivered OJS job as a Celery protocol v2 message: ``(body, properties, headers)``."""
        body, task_properties, task_headers, _ = self.task_message(job, properties, headers)
        return body, task_properties, task_headers

    def task_message(self, job: Job, properties: dict[str, Any], headers: dict[str, Any]) -> TaskMessage:
        """A delivered OJS job as a Celery protocol v2 message, with the ``[args, kwargs, embed]`` its body encodes.

        The ``ojs://`` channel hands Celery that payload with the message, so the worker's
        main process does not parse the body it was just written from (see
        :class:`~ojs_kombu.transport.message.DecodedMessage`).

        Parameters:
            job: the delivered job.
            properties: the delivery's AMQP properties.
            headers: the delivery's AMQP headers.

        Returns:
            The task message; its ``payload`` is None when kombu's JSON decoder would not read the
            body back to the same values (a ``__type__`` object, which it turns into a Python type).
        """
        meta = dict(job.meta or {})
        celery_meta = meta.pop("celery", None) or {}
        kwargs = meta.pop("kwargs", None) or {}
        name = celery_meta.get("task") or self.tasks.name_for(job.type)
        celery_id = celery_meta.get("id") or job.id
        # The delivery's own headers first (x-ojs-attempt & co.: visible to the task), then
        # Celery's defaults, the producer's Celery headers, and what the envelope decides.
        task_headers = strip_death_headers(headers)
        task_headers.update(_CELERY_DEFAULTS)
        task_headers["root_id"] = celery_id
        task_headers["timelimit"] = [None, None]
        celery_headers = celery_meta.get("headers")
        if celery_headers:
            task_headers.update(celery_headers)
        task_headers["task"] = name
        task_headers["id"] = celery_id
        task_headers["retries"] = job.attempt
        task_headers["eta"] = job.scheduled_at
        task_headers["expires"] = job.expires_at
        if "argsrepr" not in task_headers:  # a job from another producer
            task_headers["argsrepr"] = _repr(job.args)
            task_headers["kwargsrepr"] = _repr(kwargs)
        if meta:
            for header in ("traceparent", "tracestate"):
                if meta.get(header):
                    task_headers[header] = meta[header]
        envelope = _carried(job)
        if meta:
            envelope["meta"] = meta
        task_headers[ENVELOPE_HEADER] = envelope
        embed = dict.fromkeys(_EMBED_KEYS)
        embedded = celery_meta.get("embed")
        if embedded:
            embed.update(embedded)
        args = _chord_results(job, celery_meta) if celery_meta.get(CHORD_RESULTS) else job.args
        payload = [args, kwargs, embed]
        body = _task_body(payload)
        task_properties = dict(properties)
        task_properties.pop("application_headers", None)
        if None in task_properties.values():  # py-amqp leaves absent properties out; another reader may not
            task_properties = {k: v for k, v in task_properties.items() if v is not None}
        task_properties.update(
            content_type=JSON_CONTENT_TYPE,
            content_encoding=CONTENT_ENCODING,
            # A chord's callback job was published by the fan-in, which knows no Celery properties.
            correlation_id=properties.get("correlation_id") or celery_meta.get("correlation_id") or celery_id,
            reply_to=properties.get("reply_to") or celery_meta.get("reply_to") or "",
        )
        return TaskMessage(body, task_properties, task_headers, None if _KOMBU_TYPED in body else payload)


def _task_body(payload: list[Any]) -> bytes:
    """A Celery protocol 2 body ``[args, kwargs, embed]`` as JSON.

    Written by ``orjson`` (a tenth of the cost of ``json`` in the worker's main process,
    which converts every delivery); integers beyond 64 bits, which a tolerantly read job
    may hold, go through ``json``.
    """
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError:
        return json.dumps(payload, ensure_ascii=False).encode("utf-8")


def _carried(job: Job) -> dict[str, Any]:
    """The envelope fields that ride along in ``ojs_envelope`` (JSON values, no nulls)."""
    carried: dict[str, Any] = {"id": job.id}
    if job.created_at is not None:
        carried["created_at"] = job.created_at
    if job.timeout is not None:
        carried["timeout"] = job.timeout
    if job.retry is not None:
        carried["retry"] = (
            job.retry.to_dict() if hasattr(job.retry, "to_dict") else job.retry.model_dump(exclude_none=True)
        )
    if job.errors:
        carried["errors"] = _amqp_safe(job.errors)
    if job.unique is not None:
        carried["unique"] = job.unique.to_dict()
    return carried


def _payload(
    body: bytes, properties: dict[str, Any], headers: dict[str, Any]
) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    content_type = (properties.get("content_type") or "").split(";")[0].strip().lower()
    if content_type != JSON_CONTENT_TYPE:
        raise ValidationError(
            f"task {headers.get('task')!r} is serialized as {content_type or 'unknown'!r}; the OJS wire is JSON "
            "only (set task_serializer='json'; pickle is refused)",
            field="content_type",
        )
    if headers.get("compression"):
        raise ValidationError("compressed task messages are not supported on the OJS wire", field="compression")
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise ValidationError(f"task body is not JSON: {exc}", field="args") from None
    if not (isinstance(payload, list) and len(payload) == 3):
        raise ValidationError(
            "not a Celery protocol 2 body [args, kwargs, embed] (task_protocol=1 is not supported)", field="args"
        )
    return payload[0] or [], payload[1] or {}, payload[2] or {}


def chord_member(headers: Mapping[str, Any], embed: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``meta.workflow`` of a task of a chord's header (index ``group_index`` of the chord's batch).

    Parameters:
        headers: the task message's Celery headers (``group``, ``group_index``).
        embed: its embedded canvas (``chord``: the body, marked with :data:`CHORD_OPTION`).

    Returns:
        The ``meta.workflow`` object, or None for a task of no chord started as a batch.
    """
    body = embed.get("chord")
    mark = (body.get("options") or {}).get(CHORD_OPTION) if isinstance(body, Mapping) else None
    if not isinstance(mark, Mapping):
        return None
    chord_id, count, index = mark.get("id"), mark.get("count"), headers.get("group_index")
    if mark.get("group") != headers.get("group") or not isinstance(chord_id, str):
        return None
    if not (isinstance(count, int) and isinstance(index, int) and 0 <= index < count):
        return None
    return WorkflowContext(chord_id, (index,), fan_in=FanInRef(chord_id, index, count)).to_meta()


def _chord_results(job: Job, celery_meta: dict[str, Any]) -> list[Any]:
    """A chord callback's arguments: the header's results in index order, then its own (as Celery calls it).

    Raises:
        ValidationError: the job carries no inline ``parent_results`` (over the inline budget of
            ``MAX_INLINE_RESULTS_BYTES``: read from the fan-in, which a codec cannot).
    """
    context = WorkflowContext.from_meta(job.meta)
    if context is None or context.results_from is not None:
        raise ValidationError(
            f"the chord callback {celery_meta.get('task')!r} has no inline header results "
            "(over the 512 KiB a workflow carries inline: return references to stored data)",
            field="meta.workflow.parent_results",
        )
    results = context.parent_results
    return [[results.get(str(index)) for index in range(len(results))], *job.args]


def _v7(value: Any) -> str | None:
    if isinstance(value, str):
        lowered = value.lower()
        if JOB_ID_RE.fullmatch(lowered):
            return lowered
    return None


def _is_binding_header(key: str) -> bool:
    return key.startswith("x-ojs-") or key in DEATH_HEADERS


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == [] or value == [None, None]


def _plain(value: Any) -> Any:
    """An AMQP header value as JSON (py-amqp decodes tables and arrays; bytes become text)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, datetime):
        return format_timestamp(value if value.tzinfo else value.replace(tzinfo=UTC))
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _amqp_safe(value: Any) -> Any:
    """Drop JSON nulls, which AMQP tables carry poorly across clients."""
    if isinstance(value, dict):
        return {k: _amqp_safe(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_amqp_safe(v) for v in value]
    return value


def _moment(value: Any) -> datetime | None:
    """A Celery ``eta``/``expires`` header (ISO 8601, naive = UTC) as an OJS timestamp."""
    if value in (None, ""):
        return None
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment  # Job.create formats it (scheduled_at rounded up)


def _retry_policy(carried: Any, header: Any, from_task: int | None) -> RetryPolicy | dict[str, Any] | None:
    if isinstance(carried, dict) and carried:
        return carried
    if isinstance(header, int) and not isinstance(header, bool) and header >= 0:
        max_attempts: int | None = header
    else:
        max_attempts = from_task
    if max_attempts is None:
        return None
    policy: RetryPolicy = RetryPolicy.model_validate({"max_attempts": max_attempts})
    return policy


def _current_failure() -> Failure:
    """The failure a retry records: ``Task.retry``'s ``exc``, else the exception being handled."""
    exc = retrying_exception.get() or sys.exc_info()[1]
    if exc is None:
        return Failure("retry", "Retry", "the task asked to be retried")
    return Failure.from_exception(exc)


def _repr(value: Any) -> str:
    try:
        from celery.utils.saferepr import saferepr

        return str(saferepr(value, 1024))
    except ImportError:  # pragma: no cover - the codec is used inside Celery
        return repr(value)[:1024]


__all__ = [
    "CHORD_OPTION",
    "CHORD_RESULTS",
    "UNIQUE_OPTION",
    "CeleryCodec",
    "ENVELOPE_HEADER",
    "chord_member",
    "TaskIndex",
    "UNLIMITED_ATTEMPTS",
]
