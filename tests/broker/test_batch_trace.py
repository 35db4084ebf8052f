"""enqueue_many reads the caller's trace context once per batch and puts it on every job (AMQP-023)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext
from support import get_messages

from ojs_kombu import Header, Job

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331


def test_every_job_of_a_batch_carries_the_trace_unless_it_has_its_own(client, names):
    own = "00-11111111111111111111111111111111-2222222222222222-01"
    jobs = [Job.create("traced.job", [i]) for i in range(3)] + [
        Job.create("traced.job", [3], meta={"traceparent": own})
    ]
    with trace.use_span(NonRecordingSpan(SpanContext(TRACE_ID, SPAN_ID, is_remote=False))):
        results = client.enqueue_many(jobs)
    assert all(r.ok for r in results)
    expected = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-00"
    assert [r.job.meta["traceparent"] for r in results] == [expected] * 3 + [own]
    messages = get_messages(client.url, names.job_queue("default"), 4)
    assert sorted(p.headers[Header.TRACE_ID] for _, p, _ in messages) == sorted([expected] * 3 + [own])


def test_a_batch_without_a_trace_gets_no_trace_header(client, names):
    results = client.enqueue_many([Job.create("untraced.job", [i]) for i in range(2)])
    assert all(r.ok and "traceparent" not in (r.job.meta or {}) for r in results)
    for _, properties, _ in get_messages(client.url, names.job_queue("default"), 2):
        assert Header.TRACE_ID not in properties.headers
