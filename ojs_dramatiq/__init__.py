"""ojs_dramatiq: existing Dramatiq actors over the Open Job Spec AMQP binding.

::

    import dramatiq
    from ojs_dramatiq import OjsBroker

    dramatiq.set_broker(OjsBroker("amqp://guest:guest@localhost:5672/%2F"))  # before importing actors

Actors, ``send()``, ``send_with_options(delay=...)``, middleware, pipelines,
groups, results and the ``dramatiq`` CLI work unchanged (group completion callbacks without
Redis: :class:`OjsGroupCallbacks` in ``GroupCallbacks``' place); the messages on the
wire are OJS job envelopes that any OJS worker (``ojs_kombu``, ``ojs_celery``,
other SDKs) can run, and jobs from any OJS producer reach the actor whose name
maps to their type.  See the README, "Migrating a Dramatiq project".

Control plane: ``broker.cancel(message.message_id, queue_name=...)`` cancels a message
wherever it is (queued, delayed, waiting for a retry, or running: see
:mod:`ojs_dramatiq.running` and :func:`current_cancelled`); ``broker.pause(queue_name)`` /
``broker.resume(queue_name)`` stop and restart its consumers in every worker.

Limits: :class:`OjsConcurrentRateLimiter` is Dramatiq's ``ConcurrentRateLimiter`` without Redis
(permits on the broker, across processes; ``docs/limits.md``).
"""

from .broker import OjsBroker
from .consumer import OjsMessageProxy
from .cron import cron, cron_job
from .encoder import (
    OjsEncoder,
    job_id_for,
    job_to_message,
    message_to_job,
    ojs_queue_for,
    retry_policy_for,
)
from .groups import OjsGroupCallbacks
from .limits import OjsConcurrentRateLimiter
from .running import OjsRunning, RunningMessage, current_cancelled

__all__ = [
    "OjsBroker",
    "OjsConcurrentRateLimiter",
    "OjsEncoder",
    "OjsGroupCallbacks",
    "OjsMessageProxy",
    "OjsRunning",
    "RunningMessage",
    "cron",
    "cron_job",
    "current_cancelled",
    "job_id_for",
    "job_to_message",
    "message_to_job",
    "ojs_queue_for",
    "retry_policy_for",
]
