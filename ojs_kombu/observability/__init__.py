"""Metrics (``ojs_amqp_*``, per job type ``ojs_job_*``, per rate limit key ``ojs_rate_limit_*``;
prometheus_client) and their HTTP endpoint, W3C trace context (opentelemetry-api) and structured log fields."""

from ojs_kombu.observability.job_metrics import JOB_METRICS, JobMetrics
from ojs_kombu.observability.limit_metrics import LIMIT_METRICS, LimitMetrics
from ojs_kombu.observability.logs import job_log_extra, message_log_extra
from ojs_kombu.observability.metrics import METRICS
from ojs_kombu.observability.server import MetricsServer, serve_metrics
from ojs_kombu.observability.tracing import job_span, with_trace_context

__all__ = [
    "JOB_METRICS",
    "LIMIT_METRICS",
    "METRICS",
    "JobMetrics",
    "LimitMetrics",
    "MetricsServer",
    "job_log_extra",
    "job_span",
    "message_log_extra",
    "serve_metrics",
    "with_trace_context",
]
