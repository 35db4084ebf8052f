"""The broker-kill drill: duplicate executions and lost jobs when RabbitMQ is SIGKILLed mid-stream.

    python benchmarks/broker_kill.py [--total 4000] [--kill-at 0.4] [--kill-when ran|confirmed]
                                     [--deduplicate] [--queue-type quorum]
                                     [--delay-queue-type quorum|classic|same] [--json]

A private RabbitMQ node of its own (never the session's broker).  ``--total`` jobs, a quarter of
them scheduled 0-3 s ahead; a ``Worker`` (``--concurrency`` 8, ``deduplicate=--deduplicate``)
runs them and counts how often each id ran.  The node's Erlang VM is SIGKILLed and started again
(same data):

* ``--kill-when ran`` (default): every job is enqueued first (``enqueue_many``, confirmed), and the
  node is killed once ``--kill-at`` of them ran (a backlog: acks the broker had not written yet);
* ``--kill-when confirmed``: a ``Client`` enqueues the jobs one after the other (a publish that is
  not confirmed is published again with the same id until it is) while the worker runs them, and
  the node is killed once ``--kill-at`` of them are confirmed.

Once every confirmed job has run and nothing has run for ``--quiet`` seconds (or nothing has run
for 60 s), it prints: confirmed, lost (confirmed and never run; how many of them scheduled),
duplicate executions (runs beyond the first) as a share of the confirmed jobs, how many
deliveries were acked without running (``deduplicate``), and the messages left in the prefix's
queues.  ``--json`` prints one JSON line instead.

DESIGN §19 / issue 30: without de-duplication our first drill counted 719 of 4,000 (18 %).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
import uuid
from collections import Counter
from datetime import timedelta

from ojs_kombu import Client, Job, OjsError, Worker, current_job
from ojs_kombu.testing.broker import PrivateNode
from ojs_kombu.wire.entities import QueueOptions

QUEUE = "drill"


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--total", type=int, default=4000)
    parser.add_argument("--kill-at", type=float, default=0.4, help="share of the jobs when the node is killed")
    parser.add_argument(
        "--kill-when",
        choices=["ran", "confirmed"],
        default="ran",
        help="ran: every job is enqueued first and the node is killed once --kill-at of them ran (a backlog); "
        "confirmed: jobs are enqueued one by one while the worker runs them, the node killed once --kill-at "
        "are confirmed",
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--deduplicate", action="store_true", help="Worker(deduplicate=True)")
    parser.add_argument("--queue-type", choices=["classic", "quorum"], default=None)
    parser.add_argument(
        "--delay-queue-type",
        choices=["classic", "quorum", "same"],
        default="quorum",
        help="QueueOptions.delay_queue_type, the retry queues' and cascade levels' type (same: None, the job "
        "queue's type, as before the quorum default)",
    )
    parser.add_argument("--work-ms", type=float, default=1.0, help="each job's run time")
    parser.add_argument("--quiet", type=float, default=10.0, help="seconds without a run that end the drill")
    parser.add_argument("--rabbitmq", default=None, help="the release of the private node (default 4.3)")
    parser.add_argument("--json", action="store_true")
    return parser.parse_args()


def drill(args: argparse.Namespace) -> dict[str, object]:
    """Run the drill; return what it measured."""
    runs: Counter[str] = Counter()
    lock = threading.Lock()
    confirmed: set[str] = set()
    scheduled_ids: set[str] = set()
    prefix = f"drill{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory(prefix="ojs-drill-") as base, PrivateNode(base, rabbitmq=args.rabbitmq) as node:
        options = {"deduplicate": True} if args.deduplicate else {}
        delay_queue_type = None if args.delay_queue_type == "same" else args.delay_queue_type
        queue_options = QueueOptions(queue_type=args.queue_type, delay_queue_type=delay_queue_type)
        worker = Worker(
            node.url,
            queues=[QUEUE],
            prefix=prefix,
            concurrency=args.concurrency,
            grace_period=5,
            queue_options=queue_options,
            **options,  # type: ignore[arg-type]
        )

        paused = threading.Event()

        @worker.handler("drill.job")
        def run(_: int) -> None:
            while paused.is_set():
                time.sleep(0.01)
            with lock:
                runs[current_job().id] += 1
            time.sleep(args.work_ms / 1000)

        worker.start()
        assert worker.wait_until_ready(60), "the worker did not start"
        killed = threading.Event()
        rng = random.Random(7)
        with Client(
            node.url,
            prefix=prefix,
            queue_options=queue_options,
            connect_retries=10,
            publish_timeout=None,
            confirm_timeout=15,
        ) as client:
            client.declare_queue(QUEUE)
            kill_after = int(args.total * args.kill_at)

            def kill() -> None:
                node.kill()
                node.start()
                killed.set()

            def enqueue(job: Job) -> None:
                while True:
                    try:
                        client.enqueue_job(job)
                    except OjsError:  # not confirmed: the same job again
                        time.sleep(0.2)
                        continue
                    confirmed.add(job.id)
                    return

            jobs = []
            for i in range(args.total):
                scheduled = timedelta(seconds=rng.uniform(0, 3)) if i % 4 == 0 else None
                jobs.append(Job.create("drill.job", [i], queue=QUEUE, scheduled_at=scheduled))
                if scheduled is not None:
                    scheduled_ids.add(jobs[-1].id)
            started = time.monotonic()
            if args.kill_when == "ran":
                paused.set()  # the backlog first: the worker's handlers wait
                for result in client.enqueue_many(jobs):
                    assert result.ok, result
                confirmed.update(job.id for job in jobs)
                paused.clear()
                while True:
                    with lock:
                        if sum(runs.values()) >= kill_after:
                            break
                    time.sleep(0.001)
                kill()
            else:
                for job in jobs:
                    enqueue(job)
                    if len(confirmed) == kill_after:
                        threading.Thread(target=kill, name="drill-kill", daemon=True).start()
            killed.wait(180)
            last, last_change = -1, time.monotonic()
            while True:
                with lock:
                    total_runs = sum(runs.values())
                    done = confirmed <= runs.keys()
                quiet = time.monotonic() - last_change
                if total_runs != last:
                    last, last_change = total_runs, time.monotonic()
                elif (done and quiet >= args.quiet) or quiet >= 60:  # all ran, or nothing more will
                    break
                time.sleep(0.2)
            elapsed = time.monotonic() - started
        deduplicated = getattr(worker, "deduplicated", None)
        # Where the jobs that never ran are: messages still held by the prefix's queues.
        left = {q["name"]: q.get("messages") for q in node.management().queues(prefix) if q.get("messages")}
        worker.stop(timeout=10)
    with lock:
        duplicates = sum(count - 1 for count in runs.values())
        lost_ids = confirmed - runs.keys()
        lost = len(lost_ids)
        twice = sum(1 for count in runs.values() if count > 1)
    return {
        "deduplicate": args.deduplicate,
        "queue_type": args.queue_type or "default",
        "delay_queue_type": args.delay_queue_type,
        "kill_when": args.kill_when,
        "total": args.total,
        "confirmed": len(confirmed),
        "lost": lost,
        "lost_scheduled": len(lost_ids & scheduled_ids),
        "duplicate_executions": duplicates,
        "jobs_run_more_than_once": twice,
        "duplicates_pct": round(100 * duplicates / max(1, len(confirmed)), 2),
        "deduplicated": deduplicated,
        "left_in_queues": left,
        "seconds": round(elapsed, 1),
    }


def main() -> None:
    args = _args()
    result = drill(args)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"deduplicate={result['deduplicate']} queue={result['queue_type']} delay={result['delay_queue_type']} "
        f"kill_when={result['kill_when']}: "
        f"{result['confirmed']} confirmed, {result['lost']} lost ({result['lost_scheduled']} of them scheduled), "
        f"{result['duplicate_executions']} duplicate executions "
        f"({result['duplicates_pct']} % of confirmed; {result['jobs_run_more_than_once']} jobs ran more than once), "
        f"deduplicated deliveries: {result['deduplicated']}, {result['seconds']} s; "
        f"messages left in queues: {result['left_in_queues']}"
    )


if __name__ == "__main__":
    main()
