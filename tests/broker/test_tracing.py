"""W3C trace context from the producer's span to the handler, across a retry (AMQP-023)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from support import get_messages, wait_until

from ojs_kombu import Header, RetryPolicy, Worker

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7


def test_trace_context_reaches_the_handler_across_a_retry(amqp_url, prefix, client, names):
    producer_span = NonRecordingSpan(
        SpanContext(TRACE_ID, SPAN_ID, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    )
    with trace.use_span(producer_span):
        job = client.enqueue("traced.job", [], retry=RetryPolicy(max_attempts=2, initial_interval="PT0.1S"))
    assert job.meta["traceparent"] == f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"

    seen = []
    worker = Worker(amqp_url, prefix=prefix, grace_period=2)

    @worker.handler("traced.job")
    def handle():
        seen.append(trace.get_current_span().get_span_context().trace_id)
        if len(seen) == 1:
            raise RuntimeError("retry me")

    with worker:
        wait_until(lambda: len(seen) == 2, timeout=15, message="two attempts")
    assert seen == [TRACE_ID, TRACE_ID]  # the handler ran inside the producer's trace, both times


def test_trace_header_on_the_wire(client, names):
    with trace.use_span(NonRecordingSpan(SpanContext(TRACE_ID, SPAN_ID, is_remote=False))):
        client.enqueue("traced.job", [])
    [(_, properties, _)] = get_messages(client.url, names.job_queue("default"), 1)
    assert properties.headers[Header.TRACE_ID] == f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-00"


def test_no_trace_no_header(client, names):
    job = client.enqueue("untraced.job", [])
    assert "traceparent" not in (job.meta or {})
    [(_, properties, _)] = get_messages(client.url, names.job_queue("default"), 1)
    assert Header.TRACE_ID not in properties.headers
