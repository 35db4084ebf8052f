"""The worker's consumer of ``ojs_celery.Celery``: Celery's, without its native delayed delivery.

Celery ≥ 5.5 switches on *native delayed delivery* as soon as one of ``task_queues`` has
``queue_arguments={"x-queue-type": "quorum"}`` (``celery.utils.quorum_queues.detect_quorum_queues``):
its ``DelayedDelivery`` bootstep declares 28 ``celery_delayed_*`` exchanges and quorum queues
(unprefixed, shared by the vhost) and binds the task queues to them.  On the OJS wire countdowns,
ETAs and retries travel through the binding's scheduling cascade and retry queues (declared
quorum too, see ``docs/cluster.md``), so this consumer leaves that bootstep out.  Global QoS,
which Celery turns off for quorum queues, is always off on ``ojs://`` anyway.

A task whose ``rate_limit`` holds across workers (:mod:`ojs_celery.limits`) gets no per-worker token
bucket: the transport admits it at the shared rate, and a bucket of its own would delay it further.
"""

from __future__ import annotations

from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

from .limits import task_policy

#: Celery's bootstep this consumer does without.
NATIVE_DELAYED_DELIVERY = "celery.worker.consumer.delayed_delivery:DelayedDelivery"


class Consumer(CeleryConsumer):  # type: ignore[misc]  # Celery is untyped
    """Celery's worker consumer without ``DelayedDelivery`` (the ``worker_consumer`` of ``ojs_celery.Celery``)."""

    class Blueprint(CeleryConsumer.Blueprint):  # type: ignore[misc]
        """Celery's consumer steps but native delayed delivery."""

        default_steps: list[Any] = [s for s in CeleryConsumer.Blueprint.default_steps if s != NATIVE_DELAYED_DELIVERY]

    def bucket_for_task(self, type: Any) -> Any:
        """Celery's per-worker token bucket of a task, none when its ``rate_limit`` holds across workers."""
        if task_policy(self.app, type) is not None and _on_ojs(self.app):
            return None
        return super().bucket_for_task(type)


def _on_ojs(app: Any) -> bool:
    """Whether ``app``'s broker is the ``ojs://`` transport (which applies the shared limits)."""
    conf = app.conf
    return conf.broker_transport in ("ojs", "ojss") or str(conf.broker_url or "").startswith(("ojs://", "ojss://"))


__all__ = ["NATIVE_DELAYED_DELIVERY", "Consumer"]
