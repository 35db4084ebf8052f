"""Periodic Dramatiq messages: OJS cron jobs whose ticks are an actor's messages (ojs-cron.md; DESIGN §20).

Dramatiq has no scheduler of its own (dramatiq#19).  :func:`cron` registers an OJS cron job
whose every tick is the message ``actor.send_with_options(args=..., kwargs=..., **options)``
would publish through the :class:`~ojs_dramatiq.OjsBroker`: same job type, queue, ``meta.dramatiq``
(actor name and message options), keyword arguments, retry policy (the actor's ``max_retries`` /
backoff) and ``time_limit``.  Any OJS cron scheduler fires it (``ojs-amqp cron run``, a
:class:`~ojs_kombu.CronScheduler`, or ``celery beat -S ojs_celery.beat:Scheduler``): any number may
run, the leader fires, and the broker's Dramatiq workers run each tick as an ordinary message whose
``message_id`` is the tick's job id.

::

    import dramatiq
    from ojs_dramatiq import OjsBroker, cron

    broker = OjsBroker("amqp://guest:guest@localhost:5672/%2F")
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name="reports", max_retries=3)
    def build_report(kind): ...

    cron(build_report, "0 9 * * MON-FRI", "daily", name="daily-report", timezone="Europe/Paris")
"""

from __future__ import annotations

import logging
from typing import Any

import dramatiq

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.cron import CronJob, OverlapPolicy, job_options
from ojs_kombu.runtime.cron import RegisteredCron

from .broker import OjsBroker
from .encoder import META_KEY

logger = logging.getLogger(__name__)


def cron_job(
    actor: dramatiq.Actor[Any, Any],
    expression: str,
    *args: Any,
    name: str,
    kwargs: dict[str, Any] | None = None,
    timezone: str = "UTC",
    overlap_policy: OverlapPolicy = "skip",
    enabled: bool = True,
    description: str | None = None,
    **options: Any,
) -> CronJob:
    """The OJS cron job whose ticks are ``actor``'s message with ``args``, ``kwargs`` and ``options``.

    Parameters:
        actor: a Dramatiq actor of an :class:`~ojs_dramatiq.OjsBroker`.
        expression: the cron expression (5 or 6 fields, a macro, ``@every <duration>``).
        args: the actor's positional arguments (JSON-native).
        name: the cron job's name (``[a-z0-9][a-z0-9-.]*``).
        kwargs: the actor's keyword arguments (JSON-native).
        timezone, overlap_policy, enabled, description: as for ``Client.register_cron``.
        options: Dramatiq message options (``max_retries``, ``time_limit``, ...), as ``send_with_options`` takes.

    Returns:
        The definition (not registered: see :func:`cron`).

    Raises:
        ValidationError: the actor's broker is not an OjsBroker, or a field is invalid (naming it).
    """
    broker = actor.broker
    if not isinstance(broker, OjsBroker):
        raise ValidationError(
            f"actor {actor.actor_name!r} belongs to a {type(broker).__name__}, not an OjsBroker", field="actor"
        )
    message = actor.message_with_options(args=tuple(args), kwargs=kwargs or {}, **options)
    job = broker.job_for(message)
    if job.priority is not None:
        logger.warning("cron %s: broker_priority is not carried by OJS cron ticks", name)
    section = {k: v for k, v in ((job.meta or {}).get(META_KEY) or {}).items() if k != "message_id"}
    job = job.model_copy(update={"meta": {**(job.meta or {}), META_KEY: section}})
    return CronJob(
        name=name,
        cron=expression,
        type=job.type,
        args=job.args,
        timezone=timezone,
        options=job_options(job),
        overlap_policy=overlap_policy,
        enabled=enabled,
        description=description if description is not None else f"dramatiq: {actor.actor_name}",
    )


def cron(
    actor: dramatiq.Actor[Any, Any],
    expression: str,
    *args: Any,
    name: str,
    kwargs: dict[str, Any] | None = None,
    timezone: str = "UTC",
    overlap_policy: OverlapPolicy = "skip",
    enabled: bool = True,
    description: str | None = None,
    **options: Any,
) -> RegisteredCron:
    """Register (or replace) the cron job ``name`` that sends ``actor``'s message (see :func:`cron_job`).

    Registered through the actor's broker's client on the cron stream; remove it with
    ``broker.client.remove_cron(name)``.

    Parameters:
        actor, expression, args, name, kwargs, timezone, overlap_policy, enabled, description, options:
            as for :func:`cron_job`.

    Returns:
        The cron job as registered (its next run computed).

    Raises:
        ValidationError: as :func:`cron_job`.
        PublishError, BrokerConnectionError, BrokerRefusedError: the broker did not take it.
    """
    definition = cron_job(
        actor,
        expression,
        *args,
        name=name,
        kwargs=kwargs,
        timezone=timezone,
        overlap_policy=overlap_policy,
        enabled=enabled,
        description=description,
        **options,
    )
    broker = actor.broker
    assert isinstance(broker, OjsBroker)  # cron_job refused any other broker
    return broker.client.register_cron_job(definition)


__all__ = ["cron", "cron_job"]
