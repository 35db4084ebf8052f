"""The cron stream is bounded (``x-max-age``) and its snapshots keep the registry (DESIGN §20, ``ojs_kombu.wire.cron``).

Tiny values (1 s of retention, 5 kB segments, a snapshot a second) make the stream lose its head
within seconds, as it does after a day in production.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from cron_support import check_tick, wait_for
from kombu import Connection

from ojs_kombu.model.timefmt import parse_timestamp
from ojs_kombu.runtime import cron_registry
from ojs_kombu.runtime.cron_registry import CronRegistry, CronStreamReader
from ojs_kombu.wire import cron as wire_cron


@pytest.fixture
def tiny_retention(monkeypatch):
    monkeypatch.setattr(wire_cron, "CRON_STREAM_MAX_AGE", "1s")
    # Not smaller: with 2 kB segments a consumer's channel of RabbitMQ 4.3 crashed (osiris_log:parse_header,
    # its 4 kB read-ahead spanning segments), closing the connection with INTERNAL_ERROR.
    monkeypatch.setattr(wire_cron, "CRON_STREAM_SEGMENT_BYTES", 5000)
    monkeypatch.setattr(cron_registry, "CRON_SNAPSHOT_INTERVAL", timedelta(seconds=1))


def offsets(amqp_url, names) -> tuple[int, int]:
    """The offsets of the first and the last record the cron stream holds (the last: a read marker)."""
    with Connection(amqp_url) as conn:
        conn.ensure_connection(max_retries=1)
        reader = CronStreamReader(names)
        channel = reader.attach(conn.connection)
        reader.wait(conn.connection, reader.mark(), 10)
        channel.close()
        assert reader.first_offset is not None and reader.book.offset is not None
        return reader.first_offset, reader.book.offset


def test_definitions_and_ticks_survive_the_retention_across_snapshots_and_a_new_leader(
    tiny_retention, registry, schedulers, jobs, amqp_url, names
):
    registry.register_cron("yearly", "0 0 1 1 *", "cron.never", queue="never")  # only snapshots keep it
    registry.register_cron("tick", "@every 1s", "cron.tick", queue="ticks")
    _, registered_through = offsets(amqp_url, names)
    (first,) = schedulers(1)
    ticks = jobs("ticks")
    aged_out = lambda: offsets(amqp_url, names)[0] > registered_through  # noqa: E731
    wait_for(aged_out, 30, "both definitions aged out of the stream", step=0.5)
    first.stop()
    fired_by_first = ticks.count()
    assert fired_by_first >= 2 and first.fired == fired_by_first

    # A reader of the truncated stream (from a snapshot on) knows every definition and every tick.
    assert [c.name for c in registry.list()] == ["tick", "yearly"]
    kept = registry.get("tick")
    last = ticks.bodies[-1]
    assert kept.run_count == fired_by_first and kept.last_job_id == last["id"]
    assert kept.last_run_at == parse_timestamp(last["meta"]["cron_triggered_at"])

    # A new leader replays only the truncated stream: it continues after the last tick, repeating none.
    (second,) = schedulers(1)
    wait_for(lambda: second.fired >= 2, 20, "two ticks of the new leader")
    second.stop()
    assert second.book.snapshot is not None and sorted(second.book.entries) == ["tick", "yearly"]
    bodies = ticks.poll()
    for body in bodies:
        check_tick(body, "tick")
    times = [parse_timestamp(b["meta"]["cron_triggered_at"]) for b in bodies]
    assert len({b["id"] for b in bodies}) == len(bodies) == first.fired + second.fired
    assert times == sorted(set(times))  # none repeated
    # Every tick fired is in the fold (a tick missing there would be fired again by the next leader).
    # Consecutive times are not asserted: a leader stalled over two occurrences fires only the last (CRON-25).
    assert registry.get("tick").run_count == len(bodies)
    assert registry.get("yearly").run_count == 0


def test_a_cron_stream_created_without_retention_is_used_with_one_warning(amqp_url, names, caplog):
    with Connection(amqp_url) as conn:
        conn.ensure_connection(max_retries=1)
        channel = conn.connection.channel()
        channel.queue_declare(
            names.cron_stream, durable=True, auto_delete=False,
            arguments={"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 1_000_000},
        )  # fmt: skip
        channel.close()
    with (
        caplog.at_level(logging.WARNING, logger="ojs_kombu.amqp.topology"),
        CronRegistry.connect(amqp_url, names=names) as registry,
    ):
        registry.register_cron("old", "@every 1h", "cron.tick", queue="ticks")
        assert [c.name for c in registry.list()] == ["old"]
        assert [c.name for c in registry.list()] == ["old"]
    warnings = [r.getMessage() for r in caplog.records if names.cron_stream in r.getMessage()]
    assert len(warnings) == 1 and "x-max-age" in warnings[0]  # the policy of docs/periodic-jobs.md fixes it
