"""An ``ojs_kombu.Worker`` running workflow jobs in its own process, for the workflow drills.

    python tests/helpers/workflow_worker.py --prefix P --log FILE [--queues a,b] [--concurrency N] [--sleep S]

The broker is ``$OJS_AMQP_URL``.  Handlers (each line flushed and fsynced, so it survives a SIGKILL):

* ``member`` ``(n)``: sleeps ``--sleep`` seconds, writes ``done <n> <pid>``, returns ``{"n": n, "square": n*n}``;
* ``callback``: writes ``callback <pid> <parent_results as JSON>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

from durable_log import append_line

from ojs_kombu import Worker, current_job


def main() -> None:
    """Parse the arguments, register the handlers and run the worker until signalled."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--queues", default="wf,cb")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=0.02)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(threadName)s %(name)s: %(message)s")
    worker = Worker(queues=args.queues.split(","), prefix=args.prefix, concurrency=args.concurrency, grace_period=5)
    pid = os.getpid()

    @worker.handler("member")
    def member(n: int) -> dict[str, int]:
        time.sleep(args.sleep)
        append_line(args.log, f"done {n} {pid}")
        return {"n": n, "square": n * n}

    @worker.handler("callback")
    def callback() -> int:
        results = current_job().parent_results
        append_line(args.log, f"callback {pid} {json.dumps(results, separators=(',', ':'))}")
        return len(results)

    worker.run()


if __name__ == "__main__":
    main()
