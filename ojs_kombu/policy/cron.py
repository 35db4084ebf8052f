"""When a cron job fires: next fire times in a time zone, and the catch-up rule (``ojs-cron.md`` §4.1, §5.2, §7.3).

Pure arithmetic over :class:`~ojs_kombu.model.cron.CronExpression`; the clock is a parameter.

* Calendar expressions are matched against the *wall clock* of the job's zone (cronsim on
  naive local times), then each wall-clock match becomes an instant by the spec's DST rules:
  a time in the spring-forward gap does not exist and never fires (CRON-16: ``30 2 * * *`` in
  ``America/New_York`` skips the second Sunday of March); a time in the fall-back overlap fires
  once, at its first occurrence (CRON-17: ``30 1 * * *`` fires at 01:30 EDT, not again at
  01:30 EST).  The rule applies to every expression alike, so ``*/15 * * * *`` also fires only
  at the first 01:00, 01:15, 01:30, 01:45 of the repeated hour: its wall times repeat, the
  fall-back hour gets them once.
* ``@every <interval>`` fires at ``anchor + k × interval`` (k ≥ 1), the anchor being the
  registration time or the last trigger (spec §4.1); time zones do not matter to it.
* :func:`due` is the evaluation loop's rule (CRON-25): when one or more occurrences were
  missed (a pause, a failover), exactly one fires — the latest one not after ``now`` — and
  the next run moves to the first occurrence after ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo

from cronsim import CronSim

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.cron import CronExpression, nearest_weekday

MIN_EVALUATION_INTERVAL = 1.0
"""Seconds: the evaluation loop runs at most once a second (CRON-24)."""
MAX_EVALUATION_INTERVAL = 60.0
"""Seconds: the longest sleep of the evaluation loop (spec §7.3, RECOMMENDED)."""


def _aware(value: datetime, name: str) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(f"{name} must be an aware datetime, got {value!r}", field=name)
    return value


def _instant(wall: datetime, zone: tzinfo) -> datetime | None:
    """The first instant whose wall clock in ``zone`` is ``wall`` (naive), or None in a gap."""
    first = wall.replace(tzinfo=zone, fold=0)
    as_utc = first.astimezone(UTC)
    if as_utc.astimezone(zone).replace(tzinfo=None) != wall:
        return None  # the spring-forward gap: this wall time does not exist
    return as_utc


def next_fire(
    expression: CronExpression, zone: tzinfo, after: datetime, *, anchor: datetime | None = None
) -> datetime | None:
    """The first occurrence strictly after ``after`` (spec §2.2 ``next_run_at``, §5.2).

    Parameters:
        expression: the parsed ``cron`` field.
        zone: the job's time zone (:func:`~ojs_kombu.model.cron.parse_timezone`).
        after: an aware instant.
        anchor: for ``@every``, the registration time or the last trigger; default ``after``.

    Returns:
        The occurrence as an aware UTC datetime, or ``None`` when none comes within 50 years
        (``0 0 30 2 *`` is refused at registration, but ``0 0 * 2 MON#5``-like rarities exist).

    Raises:
        ValidationError: ``after`` or ``anchor`` is not an aware datetime.
    """
    after = _aware(after, "after").astimezone(UTC)
    if expression.interval is not None:
        start = after if anchor is None else _aware(anchor, "anchor").astimezone(UTC)
        step = expression.interval
        if start > after:
            return start + step
        periods = (after - start) // step + 1
        return start + periods * step
    fields = expression.matcher_fields
    assert fields is not None
    day = expression.nearest_weekday
    local = after.astimezone(zone).replace(tzinfo=None)
    try:
        for wall in CronSim(fields, local):
            if day is not None and wall.day != nearest_weekday(wall.year, wall.month, day):
                continue  # a day around the Nth that is not its nearest weekday
            instant = _instant(wall, zone)
            # In the fall-back overlap ``after`` may lie in the second pass; wall times whose
            # first occurrence has passed already fired then (CRON-17).
            if instant is not None and instant > after:
                return instant
    except StopIteration:  # cronsim gives up after 50 years without a match
        return None
    return None


def dst_skipped(expression: CronExpression, zone: tzinfo, after: datetime, until: datetime) -> list[datetime]:
    """The occurrences a spring-forward gap swallowed in ``(after, until]`` (CRON-16, CRON-30 ``dst_skip``).

    A wall time the expression matches inside a gap does not exist, so :func:`next_fire` never
    returns it; the scheduler reports each as a ``cron.skipped`` event with reason ``dst_skip``.

    Parameters:
        expression: the parsed ``cron`` field (``@every`` has no wall times: always empty).
        zone: the job's time zone.
        after, until: aware instants.

    Returns:
        Each swallowed occurrence as the instant its wall time would have had at the offset before
        the gap (``02:30`` in New York on the spring-forward day → ``07:30Z``), in order.

    Raises:
        ValidationError: a naive datetime.
    """
    after = _aware(after, "after").astimezone(UTC)
    until = _aware(until, "until").astimezone(UTC)
    if expression.interval is not None or until <= after:
        return []
    fields = expression.matcher_fields
    assert fields is not None
    found: list[datetime] = []
    start = after.replace(microsecond=0)
    while start < until:
        end = min(until, start + timedelta(days=7))  # at most one transition a week in any zone
        before_offset, after_offset = start.astimezone(zone).utcoffset(), end.astimezone(zone).utcoffset()
        if before_offset is not None and after_offset is not None and before_offset < after_offset:
            low, high = start, end.replace(microsecond=0) + timedelta(seconds=1)
            while high - low > timedelta(seconds=1):  # the first second of the new offset
                middle = low + timedelta(seconds=(high - low).total_seconds() // 2)
                low, high = (middle, high) if middle.astimezone(zone).utcoffset() == before_offset else (low, middle)
            gap_end = high.astimezone(zone).replace(tzinfo=None)
            gap_start = gap_end - (after_offset - before_offset)
            for wall in CronSim(fields, gap_start - timedelta(seconds=1)):
                if wall >= gap_end:
                    break
                day = expression.nearest_weekday
                if day is not None and wall.day != nearest_weekday(wall.year, wall.month, day):
                    continue
                instant = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
                if after < instant <= until:
                    found.append(instant)
        start = end
    return found


@dataclass(frozen=True)
class Due:
    """What the evaluation loop does for one cron job at ``now`` (:func:`due`).

    Attributes:
        fire_at: the scheduled time of the occurrence to fire now, or ``None`` (not due yet).
        caught_up: occurrences before ``fire_at`` were missed and are not fired (CRON-25).
        next_run_at: the first occurrence after ``now`` (``None``: none within 50 years).
    """

    fire_at: datetime | None
    caught_up: bool
    next_run_at: datetime | None


def _latest_not_after(
    expression: CronExpression, zone: tzinfo, now: datetime, floor: datetime, anchor: datetime | None
) -> datetime:
    """The latest occurrence in ``[floor, now]``; ``floor`` is one."""
    if expression.interval is not None:
        start = floor if anchor is None else anchor.astimezone(UTC)
        periods = (now - start) // expression.interval
        return max(floor, start + periods * expression.interval)
    # Gallop backwards from ``now`` for a window holding an occurrence, then walk forward in it:
    # a long outage of an every-second job costs a few dozen steps, not one per missed second.
    window = timedelta(seconds=1)
    while True:
        probe = max(floor, now - window)
        found = floor if probe == floor else next_fire(expression, zone, probe - timedelta(microseconds=1))
        if found is not None and found <= now:
            latest = found
            while (following := next_fire(expression, zone, latest)) is not None and following <= now:
                latest = following
            return latest
        window *= 2


def due(
    expression: CronExpression,
    zone: tzinfo,
    next_run_at: datetime,
    now: datetime,
    *,
    anchor: datetime | None = None,
) -> Due:
    """Whether a cron job fires at ``now``, and its next run (spec §7.3, CRON-25).

    Parameters:
        expression: the parsed ``cron`` field.
        zone: the job's time zone.
        next_run_at: the occurrence the job waits for (computed at registration or the last trigger).
        now: the evaluation time (aware).
        anchor: for ``@every``, the registration time or the last trigger; default ``next_run_at``.

    Returns:
        Not due (``next_run_at > now``): no fire, the same next run.  Due: the latest occurrence
        in ``[next_run_at, now]`` fires — one, however many were missed — and the next run is the
        first occurrence after ``now``.

    Raises:
        ValidationError: a naive datetime.
    """
    next_run_at = _aware(next_run_at, "next_run_at").astimezone(UTC)
    now = _aware(now, "now").astimezone(UTC)
    if next_run_at > now:
        return Due(None, False, next_run_at)
    fire_at = _latest_not_after(expression, zone, now, next_run_at, anchor)
    following = next_fire(expression, zone, now, anchor=anchor if anchor is not None else next_run_at)
    return Due(fire_at, fire_at != next_run_at, following)


def first_due(
    expression: CronExpression, zone: tzinfo, registered_at: datetime, last_run_at: datetime | None
) -> datetime | None:
    """The occurrence a registered cron job waits for (spec §2.2 ``next_run_at``, CRON-07).

    Parameters:
        expression: the parsed ``cron`` field.
        zone: the job's time zone.
        registered_at: when the definition was registered.
        last_run_at: the latest occurrence handled, or None.

    Returns:
        The first occurrence after ``last_run_at`` (after ``registered_at`` when it never ran);
        for ``@every``, counted from that same instant.  It may lie in the past: :func:`due`
        then fires it (or the latest missed one) once.

    Raises:
        ValidationError: a naive datetime.
    """
    since = last_run_at if last_run_at is not None else registered_at
    return next_fire(expression, zone, since, anchor=since)


def evaluation_delay(next_runs: list[datetime | None], now: datetime) -> float:
    """Seconds the evaluation loop sleeps: until the earliest next run, within 1 s and 60 s (CRON-24, §7.3).

    Parameters:
        next_runs: the enabled jobs' ``next_run_at`` (``None`` entries are ignored).
        now: the current time (aware).

    Returns:
        The sleep in seconds.
    """
    upcoming = [(run - now).total_seconds() for run in next_runs if run is not None]
    wait = min(upcoming, default=MAX_EVALUATION_INTERVAL)
    return min(MAX_EVALUATION_INTERVAL, max(MIN_EVALUATION_INTERVAL, wait))


__all__ = [
    "MAX_EVALUATION_INTERVAL",
    "MIN_EVALUATION_INTERVAL",
    "Due",
    "dst_skipped",
    "due",
    "evaluation_delay",
    "first_due",
    "next_fire",
]
