"""Drill: the node holding the connections and every queue leader is SIGKILLed and stays down.

Quorum queues everywhere, failover URLs.  A Client enqueues ``TOTAL`` jobs (a quarter scheduled
0-3 s ahead, an eighth failing their first attempt and retried 1 s later through a retry queue)
and a Worker runs them; both are connected first to the node that leads the job queue, its DLQ,
the retry queue and the scheduling cascade.  That node is killed once 40 % of the enqueues have
returned ok and is restarted only at the end: every job whose enqueue returned ok must run on the
two survivors within ``SURVIVORS_WINDOW`` seconds, with ``dead_letter_worker_publisher_confirm_timeout``
left at RabbitMQ's default (180 s).  Duplicates are counted and bounded; the dead letters that
quorum queues hold on their way to the next queue (``messages_dlx``) are sampled throughout, and
none may be left when the window ends.

What RabbitMQ 4.3.6 does (docs/cluster.md, measured with this test): at-least-once dead letters
whose target's leader died are held for a few seconds (up to ~100 at once) and then forwarded,
because the queue client resends on the leader change; and the deliveries the Worker had
prefetched on the killed node stay checked out to that consumer for the queue's
consumer-disconnected timeout (60 s by default: a run without the option waited 62.2 s for its
last job), so the job queue sets ``QueueOptions(consumer_disconnected_timeout=5000)``.
RabbitMQ 3.10 holds dead letters until the node returns or 180 s pass: ``test_failover.py``.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import pytest
from drill import HeldSampler, JobStream, rabbitmq_version
from support import wait_until

from ojs_kombu.amqp.management import ManagementClient
from ojs_kombu.testing.cluster import Cluster
from ojs_kombu.wire.entities import QueueOptions

pytestmark = [pytest.mark.broker, pytest.mark.timeout(300)]

TOTAL = 1500
KILL_AT = 0.4  # the fraction of the stream confirmed when the node is killed
SURVIVORS_WINDOW = 60.0  # seconds after the kill by which every confirmed job has run
# How long a quorum queue keeps the deliveries of a consumer on an unreachable node (RabbitMQ 4.3:
# 60 s by default) before it delivers them again: the jobs the Worker had prefetched on the killed
# node wait that long.  The job queue sets it (QueueOptions, x-consumer-disconnected-timeout).
DISCONNECTED_MS = 5000
DUPLICATES_AT_MOST = 0.02  # of the confirmed jobs (the jobs running or unconfirmed at the kill)


def where(management: ManagementClient, prefix: str) -> dict[str, tuple[int, int, int, int]]:
    """The queues under ``prefix`` holding messages: name -> (messages, ready, unacked, held dead letters)."""
    return {
        q["name"]: (
            q.get("messages", 0),
            q.get("messages_ready", 0),
            q.get("messages_unacknowledged", 0),
            q.get("messages_dlx", 0),
        )
        for q in management.queues(prefix + ".")
        if q.get("messages")
    }


def test_a_killed_node_that_stays_down_loses_and_holds_no_confirmed_job(cluster: Cluster) -> None:
    version = rabbitmq_version(cluster)
    if version < (4, 0):
        pytest.skip(
            f"RabbitMQ {'.'.join(map(str, version))} holds dead letters until the killed node returns or "
            "dead_letter_worker_publisher_confirm_timeout passes (docs/cluster.md): test_failover.py covers it"
        )
    prefix = f"t{uuid.uuid4().hex[:8]}"
    target, *survivors = cluster.nodes
    options = QueueOptions(queue_type="quorum", consumer_disconnected_timeout=DISCONNECTED_MS)
    stream = JobStream([target.url] + [node.url for node in survivors], prefix, TOTAL, queue_options=options)
    sampler = HeldSampler(lambda: cluster.management(survivors[0]), prefix)
    killed_at: float | None = None
    try:
        stream.declare()
        # Placement is client-local: every queue of the prefix is led by the node declared through.
        quorum = [q for q in cluster.management().queues(prefix + ".") if q.get("type") == "quorum"]
        leaders = Counter(
            wait_until(lambda q=q: (cluster.management().queue(q["name"]) or {}).get("leader")) for q in quorum
        )
        assert leaders == Counter({target.name: len(quorum)}), f"leaders {dict(leaders)}, wanted all on {target.name}"

        sampler.start()
        stream.start()
        stream.wait_confirmed(int(TOTAL * KILL_AT))
        killed_at = time.monotonic()
        cluster.kill(target)

        stream.finish_publishing()
        after_kill = sum(1 for at in stream.confirmed.values() if at > killed_at)
        assert after_kill, "the Client published nothing after the kill"
        while stream.missing() and time.monotonic() < killed_at + SURVIVORS_WINDOW:
            time.sleep(0.2)
        missing = stream.missing()
        all_ran_after = time.monotonic() - killed_at
        # Nothing may stay held either: a dead letter held once its job ran is a forward whose confirm
        # was lost, and it must be released (its resend is a duplicate) within the same window.
        checked = time.monotonic()
        deadline = max(killed_at + SURVIVORS_WINDOW, checked + 5)
        while not (sampler.samples[-1][0] > checked and not sampler.now()) and time.monotonic() < deadline:
            time.sleep(0.2)
        held_now = sampler.now()
        duplicates = stream.duplicates()
        with stream.lock:
            first_after = min((t for t in stream.ran_at if t > killed_at), default=float("nan"))
        refused_after = sum(1 for at, _ in stream.refused if at > killed_at)
        print(
            f"\nnode loss drill on RabbitMQ {'.'.join(map(str, version))}: {len(stream.confirmed)} of {TOTAL} enqueues "
            f"ok ({after_kill} after the kill), {len(stream.refused)} refused ({refused_after} after the kill; "
            f"{dict(Counter(type(e).__name__ for _, e in stream.refused))}); lost {len(missing)} "
            f"{dict(Counter(missing.values()))}, duplicates {duplicates}, held dead letters at most "
            f"{sampler.peak(killed_at)} (last seen {sampler.held_for(killed_at):.1f}s after the kill; left {held_now}), "
            f"first run {first_after - killed_at:.1f}s after the kill, "
            f"{'every confirmed job ran' if not missing else 'waited'} {all_ran_after:.1f}s after the kill, "
            f"slowest enqueue {max(stream.durations):.1f}s, worker reconnections {stream.worker.consumer.reconnections}"
        )
        assert not missing, (
            f"{len(missing)} confirmed jobs did not run on the survivors within {SURVIVORS_WINDOW}s "
            f"({dict(Counter(missing.values()))}); queues now: {where(cluster.management(survivors[0]), prefix)}; "
            f"attempts run: {[(kind, stream.attempts.get(job_id)) for job_id, kind in missing.items()]}"
        )
        assert not held_now, f"dead letters still held {SURVIVORS_WINDOW}s after the kill: {held_now}"
        stream.assert_survived(DUPLICATES_AT_MOST)
    finally:
        sampler.stop()
        stream.close()
        if killed_at is not None:
            cluster.restart(target)
        cluster.management().delete_by_prefix(prefix + ".")
