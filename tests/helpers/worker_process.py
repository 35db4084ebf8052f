"""An ``ojs_kombu.Worker`` in its own process, for the resilience tests.

    python tests/helpers/worker_process.py --prefix P --log FILE [--queues a,b] [--concurrency N] [--name N]

The broker is ``$OJS_AMQP_URL``.  The process runs ``worker.run()`` (graceful
shutdown on SIGTERM/SIGINT, exit status 0; status 1 with a ``WorkerError`` traceback
if the worker stops on its own, e.g. its consumer died) with two handlers, each writing one
line per event to ``--log`` (flushed and fsynced, so the lines survive a crash):

* ``crash.job``: ``run <id> <attempt>``, then ``os._exit(1)`` -- the worker dies mid-job;
* ``slow.job``: ``start <id> <attempt>``, sleeps ``--sleep`` seconds, then ``end <id> <attempt>``;
* ``batch.slow`` (a batch handler, ``--batch-size``, 0.5 s timeout): ``batch <id> <attempt>`` per job,
  sleeps ``--sleep`` seconds, then ``batch-end <id> <attempt>`` per job.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from durable_log import append_line

from ojs_kombu import Job, Worker, current_job


def _log_line(path: str, event: str, job: Job | None = None) -> None:
    job = job or current_job()
    append_line(path, f"{event} {job.id} {job.attempt}")


def main() -> None:
    """Parse the arguments, register the handlers and run the worker until signalled."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--log", required=True, help="file the handlers append their events to")
    parser.add_argument("--queues", default="default", help="comma-separated OJS queue names")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--grace", type=float, default=10.0, help="grace period of the shutdown, seconds")
    parser.add_argument("--sleep", type=float, default=1.5, help="duration of a slow.job, seconds")
    parser.add_argument("--batch-size", type=int, default=50, help="size of the batch.slow batch handler")
    parser.add_argument("--name", default=None, help="connection name shown by the broker")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(threadName)s %(name)s: %(message)s")

    worker = Worker(
        queues=args.queues.split(","),
        prefix=args.prefix,
        concurrency=args.concurrency,
        grace_period=args.grace,
        connection_name=args.name,
    )

    @worker.handler("crash.job")
    def crash(*_: object) -> None:
        _log_line(args.log, "run")
        os._exit(1)

    @worker.handler("slow.job")
    def slow(*_: object) -> None:
        _log_line(args.log, "start")
        time.sleep(args.sleep)
        _log_line(args.log, "end")

    @worker.batch_handler("batch.slow", size=args.batch_size, timeout=0.5)
    def batch_slow(jobs: list[Job]) -> None:
        for job in jobs:
            _log_line(args.log, "batch", job)
        time.sleep(args.sleep)
        for job in jobs:
            _log_line(args.log, "batch-end", job)

    worker.run()


if __name__ == "__main__":
    main()
