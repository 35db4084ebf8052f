"""Celery's ``rate_limit`` across all workers: the task option mapped onto an OJS throttle (opt-in).

Celery enforces a task's ``rate_limit`` (``"10/s"``, ``"100/m"``, ``"5/h"``) in each worker process
on its own (celery#5732): two workers run twice the rate.  With ``app.conf.ojs_rate_limits = True``
(for every task that has a ``rate_limit``), or ``@app.task(rate_limit="10/s", ojs_rate_limit=True)``
(for one task; ``ojs_rate_limit=False`` keeps one task per worker when the app opts in), the ``ojs://``
transport admits each task only when the key ``celery.{task name}`` allows it, across every
worker: the :class:`~ojs_kombu.runtime.limits.Limiter` of the transport's channel, the same as an
``ojs_kombu.Worker``'s.

The rate becomes a **throttle** (``ojs-rate-limiting.md`` §5.3: starts spaced evenly, one per slot of
``period / limit``): Celery's token bucket also spaces a task's starts evenly rather than letting a
window's worth start at once.  Admission happens in the worker's main process (the consumer),
before the task reaches the pool: it holds with the prefork pool as with threads.  Celery's own
per-worker token bucket is left out for such a task (``ojs_celery.consumer.Consumer``): it would
hold back a task already admitted and bunch its start with the next slot's.  A task name that is not a valid
key (``^[a-zA-Z0-9][a-zA-Z0-9._:-]*$``, at most 160 characters) keeps Celery's per-worker limit (logged once).
"""

from __future__ import annotations

import logging
import re
import threading
from datetime import timedelta
from typing import Any

from celery import current_app

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.model.ratelimit import RateLimitPolicy

logger = logging.getLogger(__name__)

RATE_LIMITS_HOOK = "ojs_celery.limits:task_rate_limit"
"""The ``rate_limits`` transport option of ``ojs_celery.Celery`` apps."""

_RATE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(?:/\s*([smh]))?\s*$")
_PERIODS = {"s": 1, "m": 60, "h": 3600}

_lock = threading.Lock()
_cache: dict[tuple[int, str], tuple[Any, bool, RateLimitPolicy | None]] = {}


def rate_limit_policy(task_name: str, rate_limit: str | float) -> RateLimitPolicy | None:
    """The OJS policy of a Celery ``rate_limit`` (see the module).

    Parameters:
        task_name: the task's name (the key is ``celery.{task_name}``).
        rate_limit: Celery's rate: ``"10/s"``, ``"100/m"``, ``"5/h"``, or a number (per second).

    Returns:
        A policy with a ``throttle``, or None for no limit (a rate of 0, as Celery reads it).

    Raises:
        ValidationError: a rate Celery would not read, or a task name that is not a valid key.
    """
    found = _RATE.match(str(rate_limit))
    if found is None:
        raise ValidationError(f"rate_limit {rate_limit!r} is not a Celery rate such as '10/s'", field="rate_limit")
    count, unit = float(found.group(1)), found.group(2) or "s"
    if count <= 0:
        return None
    period = _PERIODS[unit]
    if count.is_integer():
        throttle: dict[str, Any] = {"limit": int(count), "period": timedelta(seconds=period)}
    else:
        throttle = {"limit": 1, "period": timedelta(seconds=period / count)}
    return RateLimitPolicy.model_validate({"key": f"celery.{task_name}", "throttle": throttle})


def task_policy(app: Any, task: Any) -> RateLimitPolicy | None:
    """The policy of ``task``'s ``rate_limit`` when ``app`` (or the task) opts in, else None.

    Parameters:
        app: the Celery app.
        task: one of its tasks.

    Returns:
        The policy, or None (no ``rate_limit``, not opted in, or a name that is not a key).
    """
    rate = getattr(task, "rate_limit", None)
    known = _cache.get((id(app), task.name))  # read per delivered job: the settings once per task and rate
    if known is not None and known[0] == rate:
        return known[2]
    opted = getattr(task, "ojs_rate_limit", None)
    enabled = bool(app.conf.get("ojs_rate_limits", False)) if opted is None else bool(opted)
    if not enabled or not rate:
        with _lock:
            _cache[(id(app), task.name)] = (rate, enabled, None)
        return None
    try:
        policy = rate_limit_policy(task.name, rate)
    except ValidationError as exc:
        logger.warning("task %s: its rate_limit stays per worker: %s", task.name, exc)
        policy = None
    with _lock:
        _cache[(id(app), task.name)] = (rate, enabled, policy)
    return policy


def task_rate_limit(job: Job) -> RateLimitPolicy | None:
    """The policy of ``job``'s task ``rate_limit`` (:func:`task_policy`) on the worker's current app.

    The ``rate_limits`` transport option of ``ojs_celery.Celery`` (:data:`RATE_LIMITS_HOOK`), called
    by the transport for every job it delivers.

    Parameters:
        job: the delivered job (its ``type`` is the task's name).

    Returns:
        The policy, or None.
    """
    app = current_app._get_current_object()
    task = app.tasks.get(job.type)
    return None if task is None else task_policy(app, task)


__all__ = ["RATE_LIMITS_HOOK", "rate_limit_policy", "task_policy", "task_rate_limit"]
