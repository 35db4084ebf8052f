"""Test and demo support: a real RabbitMQ broker on demand, and a management API client.

* :func:`provision_broker` yields a :class:`BrokerHandle` for the broker named by
  ``OJS_AMQP_URL``, a Docker container, or a :class:`PrivateNode` started from the
  local ``rabbitmq-server`` beside any other broker, and tears down what it started.
* :func:`provision_redis` yields the URL of ``OJS_REDIS_URL`` or of a :class:`PrivateRedis`
  (a ``redis-server`` of our own on a free port, no persistence) for Celery's Redis result
  backend, and stops what it started.
* :class:`ManagementClient` inspects and cleans up queues, exchanges, bindings and
  connections through the management HTTP API (standard library only).
* :class:`Cluster` starts N private nodes joined into one RabbitMQ cluster (one epmd, one
  cookie) for failover tests; ``python -m ojs_kombu.testing.cluster {start,urls,url,stop}``.
* ``python -m ojs_kombu.testing.broker {start,stop,url,run}`` and
  ``python -m ojs_kombu.testing.redis {install,start,stop,url}`` do the same from a shell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ojs_kombu.lazy import lazy_exports

if TYPE_CHECKING:
    from .broker import (
        BrokerError,
        BrokerHandle,
        PrivateNode,
        ensure_rabbitmq_installed,
        mask_url,
        provision_broker,
    )
    from .cluster import Cluster
    from .management import ManagementClient, ManagementError
    from .redis import PrivateRedis, RedisServerError, ensure_redis_installed, provision_redis

# Imported lazily (PEP 562) so that `python -m ojs_kombu.testing.broker` does not load the
# module twice (runpy warns when a package has already imported the module it runs).
_EXPORTS = {
    "BrokerError": ".broker",
    "Cluster": ".cluster",
    "BrokerHandle": ".broker",
    "PrivateNode": ".broker",
    "ensure_rabbitmq_installed": ".broker",
    "mask_url": ".broker",
    "provision_broker": ".broker",
    "ManagementClient": ".management",
    "ManagementError": ".management",
    "PrivateRedis": ".redis",
    "RedisServerError": ".redis",
    "ensure_redis_installed": ".redis",
    "provision_redis": ".redis",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
