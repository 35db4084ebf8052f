"""``tracing.job_span`` with and without an OpenTelemetry SDK (pure logic, no broker).

OpenTelemetry's global tracer provider can be set once per process, so the case
with a provider runs in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from opentelemetry import trace

from ojs_kombu import Job
from ojs_kombu.observability.tracing import job_span, tracing_configured

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7


def test_without_an_sdk_the_producer_context_is_current_in_the_handler():
    assert not tracing_configured()
    job = Job.create("traced.job", [], meta={"traceparent": TRACEPARENT})
    before = trace.get_current_span()
    with job_span(job, 1) as span:
        inside = trace.get_current_span().get_span_context()
    assert span is None
    assert (inside.trace_id, inside.span_id) == (TRACE_ID, SPAN_ID)
    assert trace.get_current_span() is before  # detached again


def test_without_an_sdk_and_without_a_producer_context_nothing_changes():
    before = trace.get_current_span()
    with job_span(Job.create("untraced.job", []), 1) as span:
        assert trace.get_current_span() is before
    assert span is None


_WITH_PROVIDER = textwrap.dedent(
    """
    import json
    from contextlib import contextmanager
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
    from ojs_kombu import Job
    from ojs_kombu.observability.tracing import job_span, tracing_configured

    started = []

    class Tracer(trace.Tracer):
        def start_span(self, name, context=None, kind=trace.SpanKind.INTERNAL, attributes=None, **_):
            parent = trace.get_current_span(context).get_span_context()
            started.append({"name": name, "kind": kind.name, "attributes": dict(attributes or {}),
                            "parent": [parent.trace_id, parent.span_id]})
            return NonRecordingSpan(SpanContext(parent.trace_id, 0x1234, is_remote=False,
                                                trace_flags=TraceFlags(TraceFlags.SAMPLED)))

        @contextmanager
        def start_as_current_span(self, name, context=None, kind=trace.SpanKind.INTERNAL, attributes=None, **kw):
            with trace.use_span(self.start_span(name, context, kind, attributes), end_on_exit=True) as span:
                yield span

    class Provider(trace.TracerProvider):
        def get_tracer(self, *args, **kwargs):
            return Tracer()

    job = Job.create("traced.job", [], queue="mail", meta={"traceparent": "TRACEPARENT"})
    with job_span(job, 1) as before_span:  # no provider yet: the producer's context only
        pass
    configured_before = tracing_configured()
    trace.set_tracer_provider(Provider())  # set later, as a program may: counts from now on
    with job_span(job, 2) as span:
        inside = trace.get_current_span().get_span_context()
    print(json.dumps({"configured": tracing_configured(), "started": started, "span": span is not None,
                      "before": [configured_before, before_span is None],
                      "inside": [inside.trace_id, inside.span_id], "job_id": job.id}))
""".replace("TRACEPARENT", TRACEPARENT)
)


def test_with_an_sdk_the_handler_runs_in_a_consumer_span_child_of_the_producer():
    done = subprocess.run([sys.executable, "-c", _WITH_PROVIDER], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["before"] == [False, True]
    assert result["configured"] is True
    [started] = result["started"]
    assert started["name"] == "mail process"
    assert started["kind"] == "CONSUMER"
    assert started["parent"] == [TRACE_ID, SPAN_ID]
    assert started["attributes"] == {
        "messaging.system": "ojs",
        "ojs.job.id": result["job_id"],
        "ojs.job.type": "traced.job",
        "ojs.job.queue": "mail",
        "ojs.job.attempt": 2,
    }
    assert result["span"] is True
    assert result["inside"] == [TRACE_ID, 0x1234]  # the handler sees the new child span
