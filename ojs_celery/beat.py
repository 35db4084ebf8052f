"""``celery -A proj beat -S ojs_celery.beat:Scheduler``: Celery beat with failover (ojs-cron.md; DESIGN §20).

Stock Celery beat must run exactly once: two beat processes send every task twice, and
none sends nothing (celery#1495).  This scheduler turns the app's ``beat_schedule`` into
OJS cron jobs of the same names, registered on the broker's cron stream
(:class:`~ojs_kombu.runtime.cron.CronRegistry`), and fires them through a
:class:`~ojs_kombu.runtime.cron.CronScheduler`: any number of beat processes may run, the
one holding the leader lease fires, and another takes over within about a second when it
dies.  Each tick is the OJS job a Celery ``apply_async`` of the entry would publish over
``ojs://`` (:mod:`ojs_celery.protocol`): the task name in ``meta.celery.task``, its
``args``, its ``kwargs`` in ``meta.kwargs``, the queue Celery's router picks (``task_routes``,
the entry's ``queue`` / ``routing_key`` / ``exchange`` options), ``max_retries`` as the retry
policy, the time limits and extra ``headers``.  Its job id is the tick's
(:func:`~ojs_kombu.model.cron.tick_job_id`), which becomes the Celery task id.

Schedules: ``crontab`` becomes a 5-field expression in its time zone (the app's
``timezone``); a ``timedelta``, a number of seconds or a ``schedule`` becomes
``@every <duration>``; ``solar`` (and any other schedule class) is refused with
:class:`~ojs_kombu.errors.ValidationError`, as are entry names that no cron name can keep.
Entry options that a cron tick cannot carry (``expires``, ``priority``, ``countdown``, ``eta``)
are logged and dropped.  The overlap policy is ``allow`` (what Celery beat does: every tick is
sent, whether the previous task still runs or not); the entry option ``overlap_policy``
(``"skip"``, ``"cancel_previous"``, ``"enqueue"``) chooses another (spec §6).

Every cron this app registers carries ``meta.celery_beat = {"app": owner, "entry": name}``
(owner: the setting ``ojs_beat_owner``, default the app's ``main`` name).  At start the
scheduler registers the entries that changed and removes the crons of the same owner that
left ``beat_schedule``; crons registered otherwise (``Client.register_cron``, another app)
are left alone, and fired too: a beat process is a full OJS cron scheduler.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from celery import beat
from celery.exceptions import ImproperlyConfigured
from celery.schedules import crontab, maybe_schedule, schedule, solar

from ojs_kombu.errors import NotFoundError, ValidationError
from ojs_kombu.model.cron import CRON_NAME_RE, MAX_CRON_NAME_LENGTH, CronJob, job_options
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import Names, job_type_for, ojs_queue_for
from ojs_kombu.runtime.cron import CronRegistry, CronScheduler
from ojs_kombu.transport import Transport

from .presence import beacon_url
from .protocol import TaskIndex

logger = logging.getLogger(__name__)

#: The ``meta`` key marking the crons a beat scheduler registered (and may remove).
MARKER = "celery_beat"
#: Setting: the owner name written in :data:`MARKER` (default: the app's ``main``).
OWNER_SETTING = "ojs_beat_owner"
#: Entry options the router reads (they choose the queue).
_ROUTING_OPTIONS = frozenset({"queue", "routing_key", "exchange", "exchange_type"})
#: Entry options a tick carries.
_CARRIED_OPTIONS = frozenset({"headers", "time_limit", "soft_time_limit", "overlap_policy"})
_INVALID_NAME_RUN = re.compile(r"[^a-z0-9.\-]+")


def cron_name_for(entry_name: str) -> str:
    """The cron name of the beat entry ``entry_name``: itself when valid, else a normalised form.

    Lowercased, every run of characters outside ``[a-z0-9.-]`` becomes ``-``, and leading
    ``-``/``.`` are dropped (``"Send report"`` -> ``send-report``).

    Raises:
        ValidationError: ``field="name"``: nothing valid is left, or it is longer than 255 characters.
    """
    if CRON_NAME_RE.fullmatch(entry_name) and len(entry_name) <= MAX_CRON_NAME_LENGTH:
        return entry_name
    name = _INVALID_NAME_RUN.sub("-", entry_name.lower()).lstrip("-.").rstrip("-")
    if not name or len(name) > MAX_CRON_NAME_LENGTH or CRON_NAME_RE.fullmatch(name) is None:
        raise ValidationError(
            f"beat_schedule entry {entry_name!r}: no cron name can be made of it (use letters, digits, '-' and '.')",
            field="name",
        )
    return name


def _field(value: Any) -> str:
    """A crontab field as Celery keeps it (``"*/15"``, ``3``, ``{1, 2}``) as cron text."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, int):
        return str(value)
    return ",".join(str(v) for v in sorted(value))


def _zone_name(tz: Any) -> str:
    key = getattr(tz, "key", None)
    if isinstance(key, str):
        return key
    zone = getattr(tz, "zone", None)  # pytz
    if isinstance(zone, str):
        return zone
    return "UTC" if tz is None or str(tz) in ("UTC", "UTC+00:00") else str(tz)


def _every(interval: timedelta) -> str:
    ms = round(interval.total_seconds() * 1000)
    if ms < 1:
        raise ValidationError(f"the interval {interval} is shorter than 1ms", field="cron")
    return f"@every {ms // 1000}s" if ms % 1000 == 0 else f"@every {ms}ms"


def expression_for(value: Any, app: Any) -> tuple[str, str]:
    """The cron expression and time zone of a ``beat_schedule`` ``schedule`` value.

    Parameters:
        value: a ``crontab``, a ``schedule``, a ``timedelta`` or a number of seconds.
        app: the Celery app (its time zone for ``crontab``).

    Returns:
        ``(expression, timezone)``: ``("*/15 9-17 * * mon-fri", "Europe/Paris")``, ``("@every 30s", "UTC")``.

    Raises:
        ValidationError: ``field="cron"``: ``solar`` or another schedule class; ``field="timezone"``: a zone that
            is not an IANA name.
    """
    value = maybe_schedule(value, False, app)
    if isinstance(value, solar):
        raise ValidationError(
            f"{value!r}: solar schedules have no cron expression (sunrise and sunset move every day); "
            "use a crontab near the time, or run the task from a cron job that checks the sun",
            field="cron",
        )
    if isinstance(value, crontab):
        fields = (
            value._orig_minute,
            value._orig_hour,
            value._orig_day_of_month,
            value._orig_month_of_year,
            value._orig_day_of_week,
        )
        return " ".join(_field(f) for f in fields), _zone_name(value.tz)
    if type(value) is schedule:
        return _every(value.run_every), "UTC"
    raise ValidationError(
        f"{type(value).__name__}: only crontab, schedule, timedelta and numbers become cron expressions", field="cron"
    )


def cron_for(app: Any, entry_name: str, entry: Mapping[str, Any], owner: str) -> CronJob:
    """The OJS cron job of one ``beat_schedule`` entry (a dict, or a ``ScheduleEntry``'s fields).

    Parameters:
        app: the Celery app (router, time zone, tasks).
        entry_name: the entry's key in ``beat_schedule``.
        entry: ``task``, ``schedule``, ``args``, ``kwargs``, ``options``.
        owner: the name marking the crons of this app (:data:`MARKER`).

    Returns:
        The definition; its ticks are the task messages ``apply_async`` would send.

    Raises:
        ValidationError: naming the entry: no task, a schedule, name, argument or option the wire cannot carry.
    """
    try:
        task = entry.get("task")
        if not isinstance(task, str) or not task:
            raise ValidationError("the entry names no task", field="task")
        expression, timezone = expression_for(entry.get("schedule"), app)
        args = list(entry.get("args") or ())
        kwargs = dict(entry.get("kwargs") or {})
        options = dict(entry.get("options") or {})
        dropped = sorted(set(options) - _ROUTING_OPTIONS - _CARRIED_OPTIONS)
        if dropped:
            logger.warning("beat entry %r: option(s) %s are not carried by OJS cron ticks", entry_name, dropped)
        routed = app.amqp.router.route({k: options[k] for k in _ROUTING_OPTIONS if k in options}, task, args, kwargs)
        queue = routed["queue"]
        celery_meta: dict[str, Any] = {"task": task}
        headers = dict(options.get("headers") or {})
        if options.get("time_limit") is not None or options.get("soft_time_limit") is not None:
            headers["timelimit"] = [options.get("time_limit"), options.get("soft_time_limit")]
        if headers:
            celery_meta["headers"] = headers
        max_attempts = TaskIndex().max_attempts(task)
        job = Job.create(
            job_type_for(task),
            args,
            queue=ojs_queue_for(getattr(queue, "name", queue)),
            kwargs=kwargs,
            meta={"celery": celery_meta, MARKER: {"app": owner, "entry": entry_name}},
            retry={"max_attempts": max_attempts} if max_attempts is not None else None,
        )
        return CronJob(
            name=cron_name_for(entry_name),
            cron=expression,
            type=job.type,
            args=job.args,
            timezone=timezone,
            options=job_options(job),
            overlap_policy=options.get("overlap_policy", "allow"),
            description=f"celery beat: {task}",
        )
    except ValidationError as exc:
        raise ValidationError(f"beat_schedule entry {entry_name!r}: {exc}", field=exc.field) from None


def owner_of(app: Any) -> str:
    """The owner name written in :data:`MARKER` for ``app`` (setting ``ojs_beat_owner``, else ``app.main``)."""
    return str(app.conf.get(OWNER_SETTING) or app.main or "celery")


def crons_for(app: Any, entries: Mapping[str, Any]) -> list[CronJob]:
    """The cron jobs of ``entries`` (``beat_schedule``, or the scheduler's ``ScheduleEntry`` objects).

    Raises:
        ValidationError: an entry cannot be a cron job, or two entries get the same cron name.
    """
    owner = owner_of(app)
    app.finalize(auto=True)  # the app's tasks registered: their max_retries are the ticks' retry policy
    crons: dict[str, CronJob] = {}
    for entry_name, entry in entries.items():
        if isinstance(entry, beat.ScheduleEntry):
            fields = {
                "task": entry.task,
                "schedule": entry.schedule,
                "args": entry.args,
                "kwargs": entry.kwargs,
                "options": entry.options,
            }
        else:
            fields = dict(entry)
        cron = cron_for(app, entry_name, fields, owner)
        if cron.name in crons:
            raise ValidationError(
                f"beat_schedule entries {crons[cron.name].options['meta'][MARKER]['entry']!r} and {entry_name!r} "
                f"both become the cron job {cron.name!r}: rename one",
                field="name",
            )
        crons[cron.name] = cron
    return list(crons.values())


def synchronise(registry: CronRegistry, crons: list[CronJob], owner: str) -> tuple[list[str], list[str]]:
    """Register the crons that changed and remove those of ``owner`` that are gone.

    Parameters:
        registry: where the crons live.
        crons: the definitions of the schedule now.
        owner: the owner marking the crons this schedule may remove.

    Returns:
        ``(registered, removed)`` cron names.
    """
    existing = {c.name: c for c in registry.list()}
    wanted = {c.name for c in crons}
    registered = []
    for cron in crons:
        found = existing.get(cron.name)
        if found is None or CronJob.to_dict(found) != cron.to_dict():
            registry.register(cron)
            registered.append(cron.name)
    removed = []
    for name, found in existing.items():
        marker = (found.options.get("meta") or {}).get(MARKER)
        if name not in wanted and isinstance(marker, dict) and marker.get("app") == owner:
            try:
                registry.remove(name)
            except NotFoundError:
                continue  # another beat process removed it first
            removed.append(name)
    return registered, removed


class Scheduler(beat.Scheduler):  # type: ignore[misc]  # Celery is untyped
    """A Celery beat scheduler whose entries are OJS cron jobs fired by the leader (see the module).

    ``celery -A proj beat -S ojs_celery.beat:Scheduler``; the broker must be ``ojs://`` (or
    ``broker_backend="ojs"``), and the entity prefix is the transport option ``prefix``.
    ``--max-interval`` is how often beat checks that the cron scheduler is still running.
    """

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self._cron: CronScheduler | None = None
        self._was_leader = False
        super().__init__(app, *args, **kwargs)

    def _names(self) -> Names:
        options = self.app.conf.broker_transport_options or {}
        return Names(options.get("prefix") or "")

    def _url(self) -> str:
        """The AMQP URL of the app's broker.

        Raises:
            ImproperlyConfigured: the broker is not ``ojs://``: a worker would not run the ticks' OJS jobs.
        """
        connection = self.app.connection_for_write()
        try:
            if not isinstance(connection.transport, Transport):
                raise ImproperlyConfigured(
                    f"ojs_celery.beat.Scheduler needs the ojs:// transport (broker_backend='ojs' or an ojs:// "
                    f"broker_url), got {connection.transport_cls!r}"
                )
            return beacon_url(connection)
        finally:
            connection.release()

    def setup_schedule(self) -> None:
        """Read ``beat_schedule`` into the cron registry and start firing as a candidate leader.

        Raises:
            ValidationError: an entry cannot be a cron job.
            ImproperlyConfigured: the broker is not ``ojs://``.
        """
        self.data: dict[str, Any] = {}
        self.install_default_entries(self.data)
        self.merge_inplace(self.app.conf.beat_schedule)
        crons = crons_for(self.app, self.data)
        url, names, ssl = self._url(), self._names(), self.app.conf.broker_use_ssl or None
        with CronRegistry.connect(url, names=names, ssl=ssl) as registry:
            registered, removed = synchronise(registry, crons, owner_of(self.app))
        logger.info(
            "beat: %d entr%s as OJS cron jobs (%d registered, %d removed)",
            len(crons),
            "y" if len(crons) == 1 else "ies",
            len(registered),
            len(removed),
        )
        self._cron = CronScheduler(url, names=names, ssl=ssl).start()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Check on the cron scheduler (the leader fires, not this loop).

        Returns:
            Seconds until the next check: ``max_interval``.

        Raises:
            OjsError: the cron scheduler stopped for good (the broker refused it).
        """
        cron = self._cron
        if cron is not None:
            if cron.error is not None:
                raise cron.error
            if cron.is_leader != self._was_leader:
                self._was_leader = cron.is_leader
                logger.info("beat: %s", "firing (leader)" if self._was_leader else "standing by")
        return float(self.max_interval)

    def close(self) -> None:
        """Stop firing and hand the leader lease over (SIGTERM, SIGINT); idempotent."""
        cron, self._cron = self._cron, None
        if cron is not None:
            cron.stop()
        super().close()

    @property
    def info(self) -> str:
        """The banner line of ``celery beat``."""
        return f"    . ojs cron -> {self._names().cron_stream} (the leader of the beat processes fires)"


__all__ = [
    "MARKER",
    "OWNER_SETTING",
    "Scheduler",
    "cron_for",
    "cron_name_for",
    "crons_for",
    "expression_for",
    "owner_of",
    "synchronise",
]
