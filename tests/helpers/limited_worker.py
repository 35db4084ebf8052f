"""An ``ojs_kombu.Worker`` running rate-limited jobs in its own process, for the limits drill.

    python tests/helpers/limited_worker.py --prefix P --log FILE [--concurrency N] [--sleep S]

The broker is ``$OJS_AMQP_URL``.  The handler of ``limited.run`` ``(n)`` writes ``start <monotonic> <n> <pid>``,
sleeps ``--sleep`` seconds, then writes ``end <monotonic> <n> <pid>`` (each line flushed and fsynced, so it
survives a SIGKILL; ``time.monotonic`` is one clock for every process of the machine).
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from durable_log import append_line

from ojs_kombu import Worker


def main() -> None:
    """Parse the arguments, register the handler and run the worker until signalled."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--queue", default="limited")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--sleep", type=float, default=0.2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(threadName)s %(name)s: %(message)s")
    worker = Worker(queues=[args.queue], prefix=args.prefix, concurrency=args.concurrency, grace_period=5)
    pid = os.getpid()

    @worker.handler("limited.run")
    def run(n: int) -> None:
        append_line(args.log, f"start {time.monotonic():.6f} {n} {pid}")
        time.sleep(args.sleep)
        append_line(args.log, f"end {time.monotonic():.6f} {n} {pid}")

    worker.run()


if __name__ == "__main__":
    main()
