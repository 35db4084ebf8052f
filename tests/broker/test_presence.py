"""BEAT (binding §5.7, AMQP-020): heartbeats, worker presence and job events on the events stream (DESIGN §14)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from support import raw_channel, read_stream, wait_until

from ojs_kombu import ActiveJob, Client, EventsOptions, RetryPolicy, Topology, TopologyError
from ojs_kombu.amqp.topology import existing_value
from ojs_kombu.model.timefmt import parse_timestamp, utcnow
from ojs_kombu.runtime.presence import Beacon
from ojs_kombu.wire.entities import normalise_argument

WORKER_SCRIPT = Path(__file__).resolve().parent.parent / "helpers" / "worker_process.py"


def presence_of(worker_id: str):
    def match(method, properties, body) -> bool:
        return properties.type == "ojs.event.worker" and json.loads(body)["worker_id"] == worker_id

    return match


# -- AMQP-020: the wire ----------------------------------------------------------------------------


def test_amqp_020_heartbeat_negotiated_and_presence_on_the_events_stream(worker_factory, amqp_url, management, names):
    name = f"presence-{uuid.uuid4().hex[:8]}"
    worker = worker_factory(queues=("default", "email"), concurrency=3, presence_interval=0.5, connection_name=name)
    worker.start()
    assert worker.wait_until_ready()

    # Liveness: both of the worker's connections negotiated the AMQP heartbeat (60 s, DESIGN §9).
    def connections():
        found = {
            c["client_properties"].get("connection_name"): c
            for c in management.connections()
            if c.get("client_properties", {}).get("connection_name") in (name, f"{name} events")
        }
        return found if len(found) == 2 else None

    found = wait_until(connections, timeout=15, interval=0.5, message="the worker's connections")
    assert found[name]["timeout"] == 60
    assert found[f"{name} events"]["timeout"] == 60

    # Topology: a topic exchange, a stream that trims, bound with '#'.
    exchange = management.exchange(names.events_exchange)
    assert exchange["type"] == "topic" and exchange["durable"] is True
    stream = management.queue(names.events_stream)
    assert stream["type"] == "stream" and stream["durable"] is True
    assert stream["arguments"] == EventsOptions().arguments()
    bindings = management.bindings(source=names.events_exchange, destination=names.events_stream)
    assert [b["routing_key"] for b in bindings] == ["#"]

    # The presence: two of them, 0.5 s apart (the interval is configurable).
    records = read_stream(amqp_url, names.events_stream, predicate=presence_of(worker.worker_id), timeout=15.0)
    method, properties, body = records[-1]
    assert method.exchange == names.events_exchange
    assert method.routing_key == f"worker.{worker.worker_id}"
    assert properties.type == "ojs.event.worker"
    assert properties.content_type == "application/json"
    assert properties.message_id
    assert abs(properties.timestamp - time.time()) < 60
    presence = json.loads(body)
    assert presence["worker_id"] == worker.worker_id
    assert presence["host"] == socket.gethostname()
    assert presence["pid"] == os.getpid()
    assert presence["queues"] == ["default", "email"]
    assert presence["concurrency"] == 3
    assert presence["state"] == "online"
    assert presence["active"] == []
    assert presence["version"] == "0.1.0"
    assert parse_timestamp(presence["started_at"]) <= parse_timestamp(presence["sent_at"])
    second = read_stream(
        amqp_url,
        names.events_stream,
        timeout=15.0,
        predicate=lambda m, p, b: p.type == "ojs.event.worker" and json.loads(b)["sent_at"] > presence["sent_at"],
    )
    later = json.loads(second[-1][2])
    gap = parse_timestamp(later["sent_at"]) - parse_timestamp(presence["sent_at"])
    assert timedelta(seconds=0.4) <= gap <= timedelta(seconds=3)


def test_presence_lists_active_jobs_with_their_start_times(amqp_url, names, client):
    started = utcnow() - timedelta(seconds=30)
    running = [ActiveJob("0190a7e2-0000-7000-8000-0000000000a1", "email", "email.send", 2, started)]
    beacon = Beacon(
        amqp_url, names, Topology(names), worker_id="w-active", queues=["email"], concurrency=1, active=lambda: running
    )
    beacon.start()
    try:
        (presence,) = wait_until(lambda: client.workers(), timeout=10, message="the beacon's presence")
    finally:
        beacon.stop()
    assert presence.worker_id == "w-active"
    assert len(presence.active) == 1
    active = presence.active[0]
    assert (active.job_id, active.queue, active.job_type, active.attempt) == (
        running[0].job_id,
        "email",
        "email.send",
        2,
    )
    assert abs(active.started_at - started) < timedelta(milliseconds=1)


def test_a_node_that_confirms_the_presences_is_never_left(amqp_url, names, client):
    """The beacon leaves a node whose presences stay unconfirmed (cut off from the cluster's majority:
    ``tests/cluster/test_minority_node.py``).  A healthy broker confirms each one at once: with a
    confirm timeout far below the presence interval, the beacon never leaves it, and the presences
    it published were all confirmed (a confirm that never reached the beacon would make every worker
    change nodes every 30 s)."""
    left: list[str] = []
    beacon = Beacon(
        amqp_url,
        names,
        Topology(names),
        worker_id="w-confirmed",
        queues=["email"],
        concurrency=1,
        active=list,
        interval=0.2,
        confirm_timeout=0.5,
        on_stalled=lambda url, reason: left.append(reason),
    )
    beacon.start()
    try:
        wait_until(lambda: beacon.published >= 10, timeout=10, message="ten presences")
        assert client.workers()
    finally:
        beacon.stop()
    assert left == []
    assert beacon.stalls == 0


def test_a_workers_presence_lists_the_job_its_handler_runs(worker_factory, client):
    release = threading.Event()
    worker = worker_factory(presence_interval=0.5)
    worker.handler("block", lambda: release.wait(30))
    worker.start()
    assert worker.wait_until_ready()
    before = utcnow()
    job = client.enqueue("block", [])
    try:
        (presence,) = wait_until(
            lambda: [p for p in client.workers() if p.active], timeout=10, message="a presence with the running job"
        )
    finally:
        release.set()
    (active,) = presence.active
    assert (active.job_id, active.queue, active.job_type, active.attempt) == (job.id, "default", "block", 1)
    assert before - timedelta(seconds=1) <= active.started_at <= presence.sent_at
    wait_until(lambda: [p for p in client.workers() if not p.active], timeout=10, message="the job gone from it")


# -- Client.workers() --------------------------------------------------------------------------------


def test_client_workers_lists_live_workers_and_drops_a_stopped_one_at_once(worker_factory, client):
    first = worker_factory(queues=("default",), concurrency=2)
    second = worker_factory(queues=("default", "email"), concurrency=5)
    for worker in (first, second):
        worker.start()
        assert worker.wait_until_ready()
    assert first.worker_id != second.worker_id

    def two_workers():
        live = client.workers()
        return live if len(live) == 2 else None

    live = wait_until(two_workers, timeout=10, message="two workers")
    by_id = {presence.worker_id: presence for presence in live}
    assert by_id.keys() == {first.worker_id, second.worker_id}
    assert by_id[first.worker_id].queues == ("default",) and by_id[first.worker_id].concurrency == 2
    assert by_id[second.worker_id].queues == ("default", "email") and by_id[second.worker_id].concurrency == 5
    assert all(p.host == socket.gethostname() and p.pid == os.getpid() for p in live)

    second.stop()
    assert [p.worker_id for p in client.workers()] == [first.worker_id]  # at once: its offline presence


@pytest.fixture
def worker_process(amqp_url: str, prefix: str, tmp_path: Path):
    processes: list[subprocess.Popen] = []

    def spawn() -> subprocess.Popen:
        with open(tmp_path / "worker.stderr", "ab") as stderr:
            process = subprocess.Popen(
                [sys.executable, str(WORKER_SCRIPT), "--prefix", prefix, "--log", str(tmp_path / "events.log")],
                env={**os.environ, "OJS_AMQP_URL": amqp_url},
                stdout=stderr,
                stderr=stderr,
            )
        processes.append(process)
        return process

    yield spawn
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_killed_worker_drops_out_within_15s(worker_process, client):
    process = worker_process()

    def listed() -> bool:
        return any(p.pid == process.pid for p in client.workers())

    wait_until(listed, timeout=30, interval=0.2, message="the worker process's presence")
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    killed = time.monotonic()
    assert listed()  # no offline presence: only its silence takes it out
    wait_until(lambda: not listed(), timeout=20, interval=0.2, message="the killed worker to drop out")
    assert time.monotonic() - killed <= 15.5


# -- job lifecycle events --------------------------------------------------------------------------------


def test_job_events_come_back_through_client_events_when_opted_in(worker_factory, client):
    since = utcnow()
    worker = worker_factory(events=True)
    worker.handler("ok", lambda: None)

    def fail():
        raise ValueError("boom")

    worker.handler("bad", fail)
    worker.start()
    assert worker.wait_until_ready()
    ok = client.enqueue("ok", [])
    bad = client.enqueue("bad", [], retry=RetryPolicy(max_attempts=2, initial_interval="PT0.1S", jitter=False))

    def events_of(job_id: str, count: int):
        found = [e for e in client.events(since) if e.job_id == job_id]
        return found if len(found) >= count else None

    ok_events = wait_until(lambda: events_of(ok.id, 2), timeout=15, message="the ok job's events")
    assert [(e.event, e.attempt) for e in ok_events] == [("started", 1), ("succeeded", 1)]
    assert all(e.worker_id == worker.worker_id and e.queue == "default" and e.job_type == "ok" for e in ok_events)
    assert ok_events[0].at <= ok_events[1].at

    bad_events = wait_until(lambda: events_of(bad.id, 6), timeout=20, message="the failing job's events")
    assert [(e.event, e.attempt) for e in bad_events] == [
        ("started", 1),
        ("failed", 1),
        ("retried", 1),
        ("started", 2),
        ("failed", 2),
        ("dead-lettered", 2),
    ]
    failed = bad_events[1]
    assert failed.error is not None and "boom" in json.dumps(failed.error)

    assert {e.job_id for e in client.events(since, queue="default")} == {ok.id, bad.id}
    assert client.events(since, queue="email") == []
    assert [e.event for e in client.events(since, limit=1)] == ["started"]
    assert client.events(timedelta(seconds=0)) == []  # nothing at or after now


def test_job_events_are_off_by_default(worker_factory, client, amqp_url, names):
    worker = worker_factory(presence_interval=0.5)
    done: list = []
    worker.handler("ok", lambda: done.append(utcnow()))
    worker.start()
    assert worker.wait_until_ready()
    since = utcnow()
    client.enqueue("ok", [])
    wait_until(lambda: done, timeout=10, message="the job to run")
    # A presence sent two intervals after the job ran: events, had they been published, come before it.
    records = read_stream(
        amqp_url,
        names.events_stream,
        timeout=15.0,
        predicate=lambda m, p, b: (
            p.type == "ojs.event.worker" and parse_timestamp(json.loads(b)["sent_at"]) > done[0] + timedelta(seconds=1)
        ),
    )
    assert {p.type for _, p, _ in records} == {"ojs.event.worker"}
    assert client.events(since) == []


def test_reading_a_non_stream_events_queue_is_a_typed_error(amqp_url, prefix, names):
    with raw_channel(amqp_url) as channel:
        channel.queue_declare(names.events_stream, durable=True)  # someone else's classic queue
    with Client(amqp_url, prefix=prefix) as client:
        with pytest.raises(TopologyError, match="not a stream"):
            client.workers()
        assert [c.entity for c in client.topology.conflicts] == [names.events_stream]


def test_cli_workers_and_events_print_json_lines(worker_factory, client, amqp_url, prefix, capsys):
    from ojs_kombu.cli import main

    worker = worker_factory(events=True)
    worker.handler("ok", lambda: None)
    worker.start()
    assert worker.wait_until_ready()
    wait_until(lambda: client.workers(), timeout=10, message="the worker's presence")
    capsys.readouterr()
    assert main(["workers", "--json", "--url", amqp_url, "--prefix", prefix]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    presence = json.loads(line)
    assert presence["worker_id"] == worker.worker_id and presence["queues"] == ["default"]
    assert "guest" not in line

    job = client.enqueue("ok", [])
    wait_until(lambda: len(client.events(timedelta(minutes=1))) >= 2, timeout=10, message="the job's events")
    assert main(["events", "--json", "--url", amqp_url, "--prefix", prefix, "--since", "1m", "--queue", "default"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(e["event"], e["job_id"]) for e in lines] == [("started", job.id), ("succeeded", job.id)]
    assert main(["events", "--json", "--url", amqp_url, "--prefix", prefix, "--queue", "other"]) == 0
    assert capsys.readouterr().out == ""


def test_an_events_stream_with_other_retention_is_used_as_it_is(amqp_url, prefix, names, management):
    arguments = {**EventsOptions().arguments(), "x-max-age": "2h"}
    with raw_channel(amqp_url) as channel:
        channel.queue_declare(names.events_stream, durable=True, arguments=arguments)
    with Client(amqp_url, prefix=prefix, on_conflict="raise") as client:  # events conflicts are never raised
        assert client.workers() == []
        (conflict,) = client.topology.conflicts
        assert conflict.entity == names.events_stream
        (difference,) = conflict.differences
        assert difference.argument == "x-max-age"
        # RabbitMQ shows the existing value as it was declared ('2h') up to 4.2, in milliseconds on 4.3.
        _, existing = existing_value(difference.existing, EventsOptions().max_age, "x-max-age")
        assert normalise_argument("x-max-age", existing) == normalise_argument("x-max-age", "2h")
    assert management.queue(names.events_stream)["arguments"]["x-max-age"] == "2h"  # never re-declared
    bindings = management.bindings(source=names.events_exchange, destination=names.events_stream)
    assert [b["routing_key"] for b in bindings] == ["#"]


def test_the_beacon_reconnects_after_its_connection_is_closed(worker_factory, client, management):
    name = f"beacon-{uuid.uuid4().hex[:8]}"
    worker = worker_factory(presence_interval=0.5, connection_name=name)
    worker.start()
    assert worker.wait_until_ready()
    wait_until(lambda: client.workers(), timeout=10, message="the first presence")

    def beacon_connection():
        return next(
            (c for c in management.connections() if c["client_properties"].get("connection_name") == f"{name} events"),
            None,
        )

    closed = wait_until(beacon_connection, timeout=15, interval=0.5, message="the beacon's connection")
    assert management.close_connection(closed["name"])
    closed_at = utcnow()
    wait_until(
        lambda: any(p.sent_at > closed_at + timedelta(seconds=0.5) for p in client.workers()),
        timeout=15,
        message="a presence after the reconnect",
    )
    reopened = wait_until(
        lambda: (c := beacon_connection()) is not None and c["name"] != closed["name"] and c,
        timeout=15,
        interval=0.5,
        message="a new beacon connection",
    )
    assert reopened["timeout"] == 60
