"""Metrics (``ojs_amqp_*``, prometheus_client), W3C trace context (opentelemetry-api) and structured log fields."""

from ojs_kombu.observability.logs import job_log_extra, message_log_extra
from ojs_kombu.observability.metrics import METRICS
from ojs_kombu.observability.tracing import job_span, with_trace_context

__all__ = ["METRICS", "job_log_extra", "job_span", "message_log_extra", "with_trace_context"]
