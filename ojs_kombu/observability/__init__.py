"""Metrics (``ojs_amqp_*``, prometheus_client) and W3C trace context (opentelemetry-api)."""

from ojs_kombu.observability.metrics import METRICS
from ojs_kombu.observability.tracing import job_span, with_trace_context

__all__ = ["METRICS", "job_span", "with_trace_context"]
