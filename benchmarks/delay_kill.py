"""Which dead-lettering hop of a delayed job loses it when RabbitMQ is SIGKILLed (issue 30, issue 27 item 6).

    python benchmarks/delay_kill.py [--jobs 1000] [--kill-after 0.5] [--rounds 1] [--rabbitmq 4.3] [--json]

A private RabbitMQ node of its own.  Two prefixes side by side on it, killed by the same SIGKILL:
``classic`` (``QueueOptions(delay_queue_type=None)``: retry queues and cascade levels classic, as
before the quorum default) and ``quorum`` (the default: quorum retry queues and cascade levels with
``x-dead-letter-strategy=at-least-once``); every job queue is classic.  Each prefix has three job
queues, ``--jobs`` confirmed persistent messages each, isolating one kind of hop:

* ``last``: scheduled exactly 2,048 ms ahead: one level (11), then its dead-lettering into the job queue;
* ``levels``: scheduled 1,024-4,095 ms ahead: several level -> level hops, then the last one;
* ``retry``: published to a 2,000 ms retry queue, which dead-letters into the job queue.

Every entity is declared ``--settle`` seconds before the first publish (a quorum queue declared
just before a SIGKILL can restart as a new, empty member: RabbitMQ 4.3 logs "configured member ...
was not found on this node. Starting member as a new one").  No consumer until the kill: ``--kill-after`` seconds after the last confirm the node is SIGKILLed
and started again; then each job queue is drained (``basic.get``) until every message arrived or
``--wait`` seconds passed.  Prints, per prefix and job queue, how many confirmed messages never
arrived, how many arrived twice, when the last one arrived (seconds after the restart: an
at-least-once dead-lettering held by the broker resends after a time-out), and how many messages
the prefix's cascade and retry queues still hold at the end (``held``).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
import uuid
from datetime import timedelta

import amqp
from kombu import Connection

from ojs_kombu import Client, Job
from ojs_kombu.model.naming import Names
from ojs_kombu.testing.broker import PrivateNode
from ojs_kombu.wire.entities import QueueOptions

RETRY_MS = 2000
KINDS = ("last", "levels", "retry")


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000, help="messages per job queue and prefix")
    parser.add_argument("--kill-after", type=float, default=0.5, help="seconds after the last confirm")
    parser.add_argument("--wait", type=float, default=240, help="seconds after the restart to wait for the rest")
    parser.add_argument(
        "--settle",
        type=float,
        default=10,
        help="seconds between declaring the queues and publishing: a quorum queue declared just before a SIGKILL "
        "can come back as a new, empty member (its Ra registration was not on disk yet)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="kills, each on fresh prefixes")
    parser.add_argument("--rabbitmq", default=None, help="the release of the private node (default 4.3)")
    parser.add_argument("--json", action="store_true")
    return parser.parse_args()


def _declare(client: Client, url: str) -> None:
    """Every entity, before anything is published (see ``--settle``)."""
    for queue in KINDS:
        client.declare_queue(queue, scheduling=True)
    with Connection(url) as kombu_connection:
        client.topology.ensure_retry_queue(kombu_connection.connection, "retry", RETRY_MS)


def _publish(client: Client, url: str, jobs: int, rng: random.Random) -> None:
    """The ``--jobs`` messages of each job queue, confirmed."""
    last = [Job.create("k.job", [i], queue="last", scheduled_at=timedelta(milliseconds=2048)) for i in range(jobs)]
    levels = [
        Job.create("k.job", [i], queue="levels", scheduled_at=timedelta(milliseconds=rng.randint(1024, 4095)))
        for i in range(jobs)
    ]
    for batch in (last, levels):
        for result in client.enqueue_many(batch):
            assert result.ok, result
    names = client.topology.names
    with Connection(url) as kombu_connection:
        channel = kombu_connection.connection.channel()  # py-amqp's
        channel.confirm_select()
        for i in range(jobs):
            channel.basic_publish(
                amqp.Message(json.dumps({"i": i}), delivery_mode=2, content_type="application/json"),
                exchange=names.retry_exchange,
                routing_key=names.retry_routing_key("retry", RETRY_MS),
                confirm_timeout=30,
            )


def _drain(url: str, queue: str, seen: set[str]) -> int:
    """Take every message from ``queue``, adding its job id (or retry index) to ``seen``; return how many."""
    taken = 0
    with Connection(url) as connection:
        channel = connection.default_channel
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            body = json.loads(message.body)
            seen.add(str(body.get("id", body.get("i"))))
            taken += 1
    return taken


def round_(node: PrivateNode, args: argparse.Namespace, rng: random.Random) -> dict[str, dict[str, float]]:
    """One kill; return ``{prefix kind: {job queue: missing, ...}}``."""
    prefixes = {"classic": f"k{uuid.uuid4().hex[:6]}", "quorum": f"k{uuid.uuid4().hex[:6]}"}
    delay_types = {"classic": None, "quorum": "quorum"}
    clients = {
        kind: Client(node.url, prefix=prefix, queue_options=QueueOptions(delay_queue_type=delay_types[kind]))
        for kind, prefix in prefixes.items()
    }
    for client in clients.values():
        _declare(client, node.url)
    time.sleep(args.settle)
    for client in clients.values():
        _publish(client, node.url, args.jobs, rng)
        client.close()
    time.sleep(args.kill_after)
    node.kill()
    node.start()
    restarted = time.monotonic()
    seen = {(kind, q): set[str]() for kind in prefixes for q in KINDS}
    taken = dict.fromkeys(seen, 0)
    last_arrival = dict.fromkeys(seen, 0.0)
    while time.monotonic() - restarted < args.wait:
        for (kind, q), ids in seen.items():
            if len(ids) < args.jobs:
                got = _drain(node.url, Names(prefixes[kind]).job_queue(q), ids)
                if got:
                    taken[kind, q] += got
                    last_arrival[kind, q] = time.monotonic() - restarted
        if all(len(ids) == args.jobs for ids in seen.values()):
            break
        time.sleep(0.5)
    result: dict[str, dict[str, float]] = {}
    for (kind, q), ids in seen.items():
        result.setdefault(kind, {})[q] = args.jobs - len(ids)
        result[kind][f"{q}_duplicates"] = taken[kind, q] - len(ids)
        result[kind][f"{q}_last_s"] = round(last_arrival[kind, q], 1)
    for kind, prefix in prefixes.items():  # still held (a quorum queue counts dead letters not yet confirmed)
        result[kind]["held"] = sum(
            q.get("messages") or 0
            for q in node.management().queues(prefix)
            if ".ojs.schedule." in q["name"] or ".ojs.queue.retry." in q["name"]
        )
    return result


def main() -> None:
    args = _args()
    rng = random.Random(11)
    results = []
    with (
        tempfile.TemporaryDirectory(prefix="ojs-delay-kill-") as base,
        PrivateNode(base, rabbitmq=args.rabbitmq) as node,
    ):
        for _ in range(args.rounds):
            results.append(round_(node, args, rng))
            if not args.json:
                print(results[-1])
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
