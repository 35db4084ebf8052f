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

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from ojs_kombu.model.job import Job

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


#: Whether this version of opentelemetry-api keeps its global provider where
#: :func:`tracing_configured` reads it (it has since 1.0); if not, it asks the public API.
_READS_GLOBAL = hasattr(trace, "_TRACER_PROVIDER")


def tracing_configured() -> bool:
    """Whether an OpenTelemetry SDK (a real tracer provider) has been installed.

    Asked per job.  ``trace.get_tracer_provider()`` looks ``$OTEL_PYTHON_TRACER_PROVIDER`` up
    in the environment on every call while no provider is set (0.75 µs), so this reads the
    global provider OpenTelemetry sets, once per process, instead: a provider set at any time
    (``trace.set_tracer_provider``) counts from then on.  The variable is read when a provider
    is first asked for, which this module does when it is imported (``trace.get_tracer``).

    Returns:
        True once a tracer provider other than OpenTelemetry's proxy is installed.
    """
    provider = trace._TRACER_PROVIDER if _READS_GLOBAL else trace.get_tracer_provider()
    return provider is not None and not isinstance(provider, trace.ProxyTracerProvider)


_NO_SPAN = nullcontext()


def job_span(job: Job, attempt: int) -> AbstractContextManager[Any]:
    """A context manager that runs the handler of ``job`` in a consumer span, a child of the
    producer's context.

    Without an SDK every span would be a no-op (about 10 µs per job for the attributes,
    the proxy and no-op tracers and two context switches): then only the producer's
    context is made current, so that jobs the handler enqueues carry it (about 2 µs, and
    nothing at all for a job without one), and the span is ``None``.
    """
    meta = job.meta
    carrier = _carrier(meta) if meta and ("traceparent" in meta or "tracestate" in meta) else {}
    if not tracing_configured():
        return _producer_context(carrier) if carrier else _NO_SPAN
    return _consumer_span(job, attempt, carrier)


def _carrier(meta: dict[str, Any]) -> dict[str, str]:
    """The producer's trace context in ``meta``, as a propagation carrier."""
    return {k: meta[k] for k in ("traceparent", "tracestate") if isinstance(meta.get(k), str)}


@contextmanager
def _producer_context(carrier: dict[str, str]) -> Iterator[None]:
    token = otel_context.attach(propagate.extract(carrier))
    try:
        yield None
    finally:
        otel_context.detach(token)


@contextmanager
def _consumer_span(job: Job, attempt: int, carrier: dict[str, str]) -> Iterator[Any]:
    parent = propagate.extract(carrier) if carrier else otel_context.get_current()
    with _tracer.start_as_current_span(
        f"{job.queue} process",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes={
            "messaging.system": "ojs",
            "ojs.job.id": job.id,
            "ojs.job.type": job.type,
            "ojs.job.queue": job.queue,
            "ojs.job.attempt": attempt,
        },
    ) as span:
        yield span


__all__ = ["current_trace_meta", "job_span", "tracing_configured", "with_trace_context"]
