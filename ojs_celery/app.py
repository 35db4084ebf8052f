"""``ojs_celery.Celery``: a ``celery.Celery`` that speaks the OJS AMQP binding.

::

    from ojs_celery import Celery

    app = Celery("proj", broker="amqp://guest:guest@localhost//", broker_backend="ojs")

    @app.task(bind=True, max_retries=5)
    def send_email(self, to, *, template="welcome"):
        ...

``broker_backend="ojs"`` (or ``"ojss"`` for TLS) selects the ``ojs://``
transport whatever the scheme of ``broker`` is; a ``broker_url="ojs://…"``
from the configuration (``app.config_from_object``, ``CELERY_BROKER_URL``)
does the same without the keyword.  The stock ``celery.Celery`` silently
ignores an unknown ``broker_backend=`` keyword: import this class.

Where the configuration does not set them, the app uses the settings the
binding needs (DESIGN §5): ``task_acks_late=True`` (a job is acked after it
ran), ``task_acks_on_failure=False`` and ``task_acks_on_timeout=False`` (a
failed job is Nacked into its dead letter queue instead of acked and lost), JSON only (``task_serializer``,
``result_serializer``, ``accept_content``; pickle is refused even when
configured) and ``worker_prefetch_multiplier=1``.  Every task gets
:class:`ojs_celery.request.Request` (time limits and lost workers are counted
attempts), and task ids are UUIDv7.

Cancels (:mod:`ojs_celery.control`): an OJS cancel (``ojs_kombu.Client.cancel``)
revokes the task in every worker of its queue, and ``app.control.revoke`` /
``AsyncResult.revoke()`` also publish OJS cancels; the transport option
``on_cancel`` and the worker bootstep :class:`~ojs_celery.control.CancelStep`
are set up here.

Celery's ``rate_limit`` holds across all workers when the app opts in (``app.conf.ojs_rate_limits =
True``, or per task ``ojs_rate_limit=True``): :mod:`ojs_celery.limits`.

In a Flower process (``celery -A proj flower``), Flower's broker page and
``/api/queues/length`` read the OJS queues under their Celery names
(:mod:`ojs_celery.flower`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import celery
import celery.app.task
import celery.canvas
from celery import signals
from celery.app import backends
from celery.app.amqp import AMQP as CeleryAMQP
from celery.exceptions import ImproperlyConfigured

from ojs_kombu.model.ids import new_job_id
from ojs_kombu.transport import register_aliases

from .canvas import (
    CHORD_BODY,
    CHORD_FAILED,
    CHORDS_SETTING,
    chord_backend,
    chord_body,
    chord_failed,
    close_workflow_hook,
)
from .control import ON_CANCEL_HOOK, TRANSPORT_LIFECYCLE_HOOK, CancelStep
from .flower import install_if_loaded
from .lifecycle import INFO_HOOK
from .limits import RATE_LIMITS_HOOK
from .presence import PresenceStep
from .request import REQUEST, STOCK_REQUEST

#: The settings ``ojs_celery.Celery`` uses unless the configuration sets them.
OJS_DEFAULTS: dict[str, Any] = {
    "task_acks_late": True,
    "task_acks_on_failure": False,
    "task_acks_on_timeout": False,
    "task_serializer": "json",
    "result_serializer": "json",
    "event_serializer": "json",
    "accept_content": ["json"],
    "result_accept_content": ["json"],
    "worker_prefetch_multiplier": 1,
    # Countdowns go through the OJS cascade, never Celery's native delayed delivery (quorum task queues).
    "worker_consumer": "ojs_celery.consumer:Consumer",
}
#: Settings that imply ``task_acks_on_failure`` when the user set them.
_ALIASES = {
    "task_acks_on_failure": ("task_acks_on_failure_or_timeout",),
    "task_acks_on_timeout": ("task_acks_on_failure_or_timeout",),
}
_BACKENDS = {"ojs": "ojs", "ojss": "ojss"}
_REFUSED_CONTENT = ("pickle", "application/x-python-serialize", "yaml", "application/x-yaml")

# Flower imports the app's modules once it has loaded Flower and the app: its queue views then read ojs:// too.
signals.import_modules.connect(install_if_loaded, weak=False, dispatch_uid="ojs_celery.flower")


#: The ``(countdown, eta)`` of the task message being built by :meth:`Celery.send_task` (see :class:`AMQP`).
_SCHEDULE: ContextVar[tuple[Any, Any] | None] = ContextVar("ojs_celery_schedule", default=None)


@contextmanager
def _scheduled(countdown: Any, eta: Any) -> Iterator[None]:
    token = _SCHEDULE.set((countdown, eta) if countdown or eta else None)
    try:
        yield
    finally:
        _SCHEDULE.reset(token)


class AMQP(CeleryAMQP):  # type: ignore[misc]  # Celery is untyped
    """``app.amqp`` of :class:`Celery`: task messages get the countdown/ETA :meth:`Celery.send_task` kept aside.

    Celery ≥ 5.5's ``send_task`` reroutes a countdown or ETA task to its native delayed
    delivery (the ``celery_delayed_*`` exchanges, or a warning per call on a direct exchange)
    whenever one of ``task_queues`` is declared ``x-queue-type: quorum``, and Celery 5.7 has no
    setting to turn that off.  On ``ojs://`` a countdown is an OJS ``scheduled_at`` that the
    transport routes into the scheduling cascade, whatever the queue type: so the app hands
    ``send_task`` no countdown, and the message gets it here.
    """

    def as_task_v2(self, task_id: str, name: str, *args: Any, **kwargs: Any) -> Any:
        """Celery's protocol 2 task message, with the countdown/ETA of the ``send_task`` in progress."""
        return super().as_task_v2(task_id, name, *_with_schedule(args, kwargs), **kwargs)

    def as_task_v1(self, task_id: str, name: str, *args: Any, **kwargs: Any) -> Any:
        """Celery's protocol 1 task message, with the countdown/ETA of the ``send_task`` in progress."""
        return super().as_task_v1(task_id, name, *_with_schedule(args, kwargs), **kwargs)


def _install_uuid7_ids() -> None:
    """Make Celery's own task id generator give UUIDv7 ids (idempotent).

    Celery has no per-app hook for the ids it makes itself: :mod:`celery.canvas`
    (``Signature.freeze``: chain, group and chord members, group and chord ids) and
    :mod:`celery.app.task` (``Task.apply``, eager calls) call the ``uuid`` function
    they import from :mod:`kombu.utils.uuid` (UUID4).  Their module-level name is
    replaced by :func:`~ojs_kombu.model.ids.new_job_id`, so every id Celery makes
    is an OJS job id, as the ids of ``send_task``/``delay`` are.  It is
    process-wide, for every Celery app of the process: a UUIDv7 is an RFC 9562
    UUID, and Celery treats task ids as opaque strings.
    """
    for module in (celery.canvas, celery.app.task):
        if module.uuid is not new_job_id:
            module.uuid = new_job_id


def _with_schedule(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """``as_task_v*``'s positional arguments after ``name`` (``args, kwargs, countdown, eta, ...``), scheduled."""
    schedule = _SCHEDULE.get()
    if schedule is None:
        return args
    if len(args) >= 4:
        return (*args[:2], *schedule, *args[4:])
    kwargs["countdown"], kwargs["eta"] = schedule
    return args


class Celery(celery.Celery):  # type: ignore[misc]  # Celery is untyped
    """A Celery app on the OJS wire; see the module documentation.

    Arguments:
        broker_backend: ``"ojs"`` or ``"ojss"`` to use the OJS transport with
            ``broker`` (any AMQP URL); None to rely on ``broker_url`` being ``ojs://``.
        Everything else as for :class:`celery.Celery`.
    """

    task_cls = "ojs_celery.task:Task"
    amqp_cls = "ojs_celery.app:AMQP"
    control_cls = "ojs_celery.control:Control"

    def __init__(self, main: str | None = None, *args: Any, broker_backend: str | None = None, **kwargs: Any) -> None:
        if broker_backend is not None and broker_backend not in _BACKENDS:
            raise ImproperlyConfigured(f"broker_backend must be one of {sorted(_BACKENDS)}, got {broker_backend!r}")
        register_aliases()
        _install_uuid7_ids()
        self.broker_backend = broker_backend
        super().__init__(main, *args, **kwargs)
        if broker_backend is not None:
            self.conf.broker_transport = _BACKENDS[broker_backend]
        self.on_after_finalize.connect(self._install_request, weak=False)
        self.steps["worker"].add(CancelStep)
        self.steps["worker"].add(PresenceStep)
        self.task(name=CHORD_BODY, ignore_result=True, lazy=True, shared=False)(self._chord_body)
        self.task(name=CHORD_FAILED, ignore_result=True, lazy=True, shared=False)(self._chord_failed)

    def _get_backend(self) -> Any:
        # Chords run as OJS batches whatever the result backend (ojs_celery.canvas), unless ojs_chords=False.
        backend, url = backends.by_url(self.backend_cls or self.conf.result_backend, self.loader)
        if self.conf.get(CHORDS_SETTING, True) is not False:
            backend = chord_backend(backend)
        return backend(app=self, url=url)

    def close(self) -> None:
        """As :meth:`celery.Celery.close`; also closes the connection chords report on (:mod:`ojs_celery.canvas`)."""
        close_workflow_hook(self)
        super().close()

    def _chord_body(self, results: list[Any], body: dict[str, Any]) -> None:
        chord_body(self, results, body)

    def _chord_failed(self, results: list[Any], body: dict[str, Any], member_ids: list[str]) -> None:
        chord_failed(self, results, body, member_ids)

    def _load_config(self) -> Any:
        conf = super()._load_config()
        for key, value in OJS_DEFAULTS.items():
            if not any(_user_set(conf, name) for name in (key, *_ALIASES.get(key, ()))):
                conf[key] = value
        _refuse_pickle(conf)
        options = conf.get("broker_transport_options") or {}
        hooks = {
            "on_cancel": ON_CANCEL_HOOK,
            "lifecycle": TRANSPORT_LIFECYCLE_HOOK,
            "info": INFO_HOOK,
            "rate_limits": RATE_LIMITS_HOOK,
        }
        if any(key not in options for key in hooks):
            conf["broker_transport_options"] = {**hooks, **options}
        return conf

    def send_task(
        self,
        name: str,
        args: Any = None,
        kwargs: Any = None,
        countdown: float | None = None,
        eta: Any = None,
        task_id: str | None = None,
        *more: Any,
        **options: Any,
    ) -> Any:
        """As :meth:`celery.Celery.send_task`, with a UUIDv7 task id by default.

        ``countdown`` and ``eta`` reach the task message (an OJS ``scheduled_at``: the
        scheduling cascade) without Celery's native delayed delivery seeing them (see :class:`AMQP`).
        """
        with _scheduled(countdown, eta):
            return super().send_task(name, args, kwargs, None, None, task_id or new_job_id(), *more, **options)

    def _install_request(self, sender: Any = None, **_: Any) -> None:
        # Tasks declared with their own base= class keep Celery's stock Request otherwise.
        for task in self.tasks.values():
            if getattr(task, "Request", None) == STOCK_REQUEST:
                task.Request = REQUEST


def _user_set(conf: Any, key: str) -> bool:
    if key in conf.changes:
        return True
    return any(key in layer for layer in conf.defaults[:-1])


def _refuse_pickle(conf: Any) -> None:
    for key in ("task_serializer", "result_serializer", "event_serializer"):
        if str(conf.get(key) or "").lower() in _REFUSED_CONTENT:
            raise ImproperlyConfigured(f"{key}={conf.get(key)!r}: the OJS wire is JSON only")
    for key in ("accept_content", "result_accept_content"):
        accepted = conf.get(key) or []
        refused = [c for c in accepted if str(c).lower() in _REFUSED_CONTENT]
        if refused:
            raise ImproperlyConfigured(f"{key} includes {refused}: the OJS wire is JSON only (pickle is refused)")


__all__ = ["AMQP", "Celery", "OJS_DEFAULTS"]
