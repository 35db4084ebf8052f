"""W3C trace context across enqueue, retries and delays (binding §12.2, AMQP-023).

The producer writes the current trace context into the envelope
(``meta.traceparent`` / ``meta.tracestate``), which the codec copies to the
``x-ojs-trace-id`` / ``x-ojs-trace-state`` headers; retries and re-delays carry
the envelope unchanged, so the context survives them.  The worker runs each
handler inside a ``{queue} process`` span whose parent is that context (a
child span, as the binding asks).  Everything goes through
``opentelemetry-api``: without an SDK configured the spans are no-ops, but the
context still propagates.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from .envelope import Job

_tracer = trace.get_tracer("ojs_kombu")


def current_trace_meta() -> dict[str, str]:
    """The current trace context as ``{"traceparent": …, "tracestate": …}``; empty without one."""
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")}


def with_trace_context(job: Job) -> Job:
    """``job`` carrying the caller's trace context, unless it already has one."""
    meta = job.meta or {}
    if "traceparent" in meta:
        return job
    trace_meta = current_trace_meta()
    if not trace_meta:
        return job
    return job.model_copy(update={"meta": {**meta, **trace_meta}})


@contextmanager
def job_span(job: Job, attempt: int) -> Iterator[Any]:
    """Run the handler of ``job`` in a consumer span, a child of the producer's context."""
    meta = job.meta or {}
    carrier = {k: meta[k] for k in ("traceparent", "tracestate") if isinstance(meta.get(k), str)}
    parent = propagate.extract(carrier) if carrier else otel_context.get_current()
    with _tracer.start_as_current_span(
        f"{job.queue} process", context=parent, kind=trace.SpanKind.CONSUMER,
        attributes={"messaging.system": "ojs", "ojs.job.id": job.id, "ojs.job.type": job.type,
                    "ojs.job.queue": job.queue, "ojs.job.attempt": attempt},
    ) as span:
        yield span


__all__ = ["current_trace_meta", "job_span", "with_trace_context"]
