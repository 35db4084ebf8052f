"""A real RabbitMQ for tests and demos: a node or a cluster on demand (DESIGN §22).

For users' test suites as for this repository's.  It installs and runs RabbitMQ only;
the repository's other tooling (Redis, Java, Chromium) lives in its own ``tools/``,
outside the wheel.  Production code never imports this package (an import-linter contract).

* :func:`provision_broker` yields a :class:`BrokerHandle` for the broker named by
  ``OJS_AMQP_URL``, a Docker container, or a :class:`PrivateNode` started from the
  local ``rabbitmq-server`` beside any other broker, and tears down what it started.
* :class:`Cluster` starts N private nodes joined into one RabbitMQ cluster (one epmd, one
  cookie) for failover tests, and partitions one node off (:meth:`Cluster.isolate`,
  :meth:`Cluster.heal`); ``python -m ojs_kombu.testing.cluster {start,urls,url,stop}``.
* :class:`ManagementClient` (from :mod:`ojs_kombu.amqp.management`, re-exported here) inspects
  and cleans up queues, exchanges, bindings and connections through the management HTTP API.
* ``python -m ojs_kombu.testing.broker {install,start,stop,url,run}`` does the same from a shell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ojs_kombu.lazy import lazy_exports

if TYPE_CHECKING:
    from ojs_kombu.amqp.management import ManagementClient, ManagementError

    from .broker import (
        BrokerError,
        BrokerHandle,
        PrivateNode,
        ensure_rabbitmq_installed,
        mask_url,
        provision_broker,
    )
    from .cluster import Cluster

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
    "ManagementClient": "ojs_kombu.amqp.management",
    "ManagementError": "ojs_kombu.amqp.management",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
