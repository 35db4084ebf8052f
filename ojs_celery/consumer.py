"""The worker's consumer of ``ojs_celery.Celery``: Celery's, without its native delayed delivery.

Celery ≥ 5.5 switches on *native delayed delivery* as soon as one of ``task_queues`` has
``queue_arguments={"x-queue-type": "quorum"}`` (``celery.utils.quorum_queues.detect_quorum_queues``):
its ``DelayedDelivery`` bootstep declares 28 ``celery_delayed_*`` exchanges and quorum queues
(unprefixed, shared by the vhost) and binds the task queues to them.  On the OJS wire countdowns,
ETAs and retries travel through the binding's scheduling cascade and retry queues (declared
quorum too, see ``docs/cluster.md``), so this consumer leaves that bootstep out.  Global QoS,
which Celery turns off for quorum queues, is always off on ``ojs://`` anyway.
"""

from __future__ import annotations

from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

#: Celery's bootstep this consumer does without.
NATIVE_DELAYED_DELIVERY = "celery.worker.consumer.delayed_delivery:DelayedDelivery"


class Consumer(CeleryConsumer):  # type: ignore[misc]  # Celery is untyped
    """Celery's worker consumer without ``DelayedDelivery`` (the ``worker_consumer`` of ``ojs_celery.Celery``)."""

    class Blueprint(CeleryConsumer.Blueprint):  # type: ignore[misc]
        """Celery's consumer steps but native delayed delivery."""

        default_steps: list[Any] = [s for s in CeleryConsumer.Blueprint.default_steps if s != NATIVE_DELAYED_DELIVERY]


__all__ = ["NATIVE_DELAYED_DELIVERY", "Consumer"]
