"""CompletedLog (execution de-duplication's store, DESIGN §19) on a real broker: the stream, replay, live sharing, bounds."""

from __future__ import annotations

import threading

from support import wait_until

from ojs_kombu.model.ids import new_job_id
from ojs_kombu.runtime.completed import CompletedLog
from ojs_kombu.wire.completed import CompletedOptions


class Recorded:
    def __init__(self):
        self.results: list[bool] = []
        self.lock = threading.Lock()

    def __call__(self, ok: bool) -> None:
        with self.lock:
            self.results.append(ok)


def test_the_stream_is_declared_with_its_bounds(amqp_url, names, management):
    options = CompletedOptions(max_age="1h", max_length_bytes=5_000_000, max_segment_size_bytes=500_000)
    log = CompletedLog(amqp_url, ["q"], names=names, options=options)
    try:
        assert log.start(30)
        queue = management.queue(names.completed_stream("q"))
        assert queue["type"] == "stream"
        assert queue["arguments"] == {**options.arguments()}
    finally:
        log.stop()


def test_records_are_confirmed_replayed_by_a_later_log_and_shared_live(amqp_url, names):
    first = CompletedLog(amqp_url, ["q"], names=names)
    later: CompletedLog | None = None
    try:
        assert first.start(30)
        ids = [new_job_id() for _ in range(2500)]
        recorded = Recorded()
        for job_id in ids:
            first.record(job_id, "q", recorded)
        assert all(first.is_completed(i) for i in ids)  # known here at once
        wait_until(lambda: len(recorded.results) == len(ids), timeout=30, message="every record confirmed")
        assert all(recorded.results)
        assert first.recorded == len(ids)

        later = CompletedLog(amqp_url, ["q"], names=names)
        assert later.start(30)
        assert later.replayed == len(ids)
        assert all(later.is_completed(i) for i in ids)
        assert not later.is_completed(new_job_id())

        live = new_job_id()
        first.record(live, "q")
        wait_until(lambda: later.is_completed(live), timeout=10, message="the other log to read it live")
    finally:
        first.stop()
        if later is not None:
            later.stop()


def test_ids_older_than_max_age_are_not_replayed(amqp_url, names):
    log = CompletedLog(amqp_url, ["q"], names=names, options=CompletedOptions(max_age="2s"))
    later: CompletedLog | None = None
    try:
        assert log.start(30)
        old = new_job_id()
        recorded = Recorded()
        log.record(old, "q", recorded)
        wait_until(lambda: recorded.results == [True], timeout=10, message="the record confirmed")
        wait_until(lambda: (log.ids.expire(), old not in log.ids)[1], timeout=10, message="the id forgotten")
        later = CompletedLog(amqp_url, ["q"], names=names, options=CompletedOptions(max_age="2s"))
        assert later.start(30)
        assert not later.is_completed(old)
    finally:
        log.stop()
        if later is not None:
            later.stop()


def test_stop_publishes_what_is_pending(amqp_url, names):
    log = CompletedLog(amqp_url, ["q"], names=names)
    assert log.start(30)
    recorded = Recorded()
    ids = [new_job_id() for _ in range(300)]
    for job_id in ids:
        log.record(job_id, "q", recorded)
    log.stop()
    assert recorded.results == [True] * len(ids)
    reader = CompletedLog(amqp_url, ["q"], names=names)
    try:
        assert reader.start(30)
        assert all(reader.is_completed(i) for i in ids)
    finally:
        reader.stop()
