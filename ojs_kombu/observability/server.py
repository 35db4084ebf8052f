"""The Prometheus endpoint: every metric of the process over HTTP, on a server that can be stopped.

``Worker(metrics_port=9100)`` and ``ojs-amqp worker --metrics-port 9100`` start one
with the worker and stop it with the worker.  Celery and Dramatiq workers, or any
other process, start one with a single call::

    import ojs_kombu
    ojs_kombu.serve_metrics(9100)          # http://127.0.0.1:9100/metrics

It binds the loopback interface unless told otherwise (``host="0.0.0.0"`` for a
Prometheus on another machine), and serves prometheus_client's default registry:
the binding's ``ojs_amqp_*`` metrics and the per job type ``ojs_job_*`` ones.

The ``ojs_job_*`` metrics come from a job :class:`~ojs_kombu.runtime.lifecycle.Lifecycle`
that :data:`~ojs_kombu.observability.job_metrics.JOB_METRICS` subscribes to: a
:class:`~ojs_kombu.Worker` subscribes its own; for another consumer,
``JOB_METRICS.subscribe(broker.lifecycle)`` (Dramatiq's ``OjsBroker``) or
``JOB_METRICS.subscribe(ojs_celery.lifecycle.worker_lifecycle())`` (in a Celery
worker's main process, e.g. from a ``worker_ready`` signal handler).

One endpoint per process and port: a framework that forks several worker processes
each importing the app (``dramatiq`` with ``--processes`` above 1) must start it in
one process only, or give each its own port; the second bind of a port raises
:class:`~ojs_kombu.errors.MetricsServerError`.
"""

from __future__ import annotations

import logging
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

from ojs_kombu.errors import MetricsServerError, ValidationError

logger = logging.getLogger(__name__)

#: The interface the endpoint binds unless told otherwise.
DEFAULT_METRICS_HOST = "127.0.0.1"


class MetricsServer:
    """A running Prometheus endpoint (``GET /metrics``, any path in fact); see :func:`serve_metrics`.

    Parameters:
        server: the listening WSGI server.
        thread: the thread serving it.
    """

    def __init__(self, server: WSGIServer, thread: threading.Thread):
        self._server = server
        self._thread = thread
        address = server.server_address
        self.host: str = str(address[0])
        self.port: int = int(address[1])

    @property
    def url(self) -> str:
        """``http://{host}:{port}/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        """Stop serving and free the port; a second call does nothing."""
        if not self._thread.is_alive():
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)
        logger.info("metrics endpoint on %s:%d stopped", self.host, self.port)


def check_metrics_port(port: int) -> int:
    """``port`` if it is a TCP port number (0 to 65535; 0: one the system picks).

    Raises:
        ValidationError: it is not.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValidationError(
            f"the metrics port must be an integer from 0 to 65535, got {port!r}", field="metrics_port"
        )
    return port


def serve_metrics(
    port: int, host: str = DEFAULT_METRICS_HOST, *, registry: CollectorRegistry = REGISTRY
) -> MetricsServer:
    """Serve the metrics of ``registry`` to Prometheus over HTTP from a background thread.

    Parameters:
        port: the TCP port (0: one the system picks; read :attr:`MetricsServer.port`).
        host: the interface to bind (default: loopback only).
        registry: what to serve (default: prometheus_client's, where every ``ojs_*`` metric is).

    Returns:
        The running server; :meth:`MetricsServer.stop` frees the port.

    Raises:
        ValidationError: ``port`` is not an integer from 0 to 65535.
        MetricsServerError: the server cannot listen there (port in use, unknown host ...).
    """
    check_metrics_port(port)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise MetricsServerError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from exc
    running = MetricsServer(server, thread)
    logger.info("metrics endpoint on %s", running.url)
    return running


__all__ = ["DEFAULT_METRICS_HOST", "MetricsServer", "check_metrics_port", "serve_metrics"]
