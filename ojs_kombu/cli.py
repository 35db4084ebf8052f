"""``ojs-amqp``: enqueue jobs, declare queues, inspect and replay dead letters, run a worker.

::

    ojs-amqp enqueue email.send '["ada@example.com", "welcome"]' --queue email --delay 30
    ojs-amqp declare email --max-priority 10
    ojs-amqp dlq list email
    ojs-amqp dlq replay email [--id JOB_ID ...] [--limit N]
    ojs-amqp dlq purge email --yes
    ojs-amqp worker myapp.jobs:worker [--queues email,sms] [--concurrency 20] [--log-level debug]
    ojs-amqp cancel JOB_ID --queue email
    ojs-amqp info JOB_ID --queue email [--timeout 2]
    ojs-amqp pause email
    ojs-amqp resume email
    ojs-amqp workers [--stale-after 15]
    ojs-amqp events [--since 10m] [--queue email] [--limit N]

Every command but ``worker`` takes ``--url`` (default ``$OJS_AMQP_URL``) and
``--prefix``; the worker takes them from its :class:`~ojs_kombu.Worker`.
Output is one JSON document per line where it is data, so it pipes into ``jq``.
Passwords are never printed.

``ojs-amqp worker`` imports ``module:attribute`` (default attribute: ``worker``)
with the current directory first on ``sys.path``, as ``celery -A`` and
``dramatiq`` do, so it runs from the project directory.  ``--queues`` replaces
the Worker's queues (it does not add to them); ``--concurrency`` replaces its
concurrency.  Exit status: 0 after a graceful shutdown (SIGTERM / SIGINT); 1
when the worker stopped on its own (:class:`~ojs_kombu.errors.WorkerError`:
the broker refused it, its connection retries ran out...) so that a supervisor
restarts it; a handler's ``sys.exit(n)`` ends it with ``n``.

``ojs-amqp info`` prints the job's info as one JSON line (``state``, ``worker_id``,
``attempt``, times); it exits with status 1, printing nothing on stdout, when no
live worker of the queue knows the job within ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from importlib import import_module
from typing import Any

from ojs_kombu.client import Client
from ojs_kombu.errors import OjsError, ValidationError
from ojs_kombu.model.timefmt import parse_timestamp
from ojs_kombu.runtime.worker import Worker

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _json_arg(text: str | None, kind: type, what: str) -> Any:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise SystemExit(f"ojs-amqp: {what} is not JSON: {exc}") from None
    if not isinstance(value, kind):
        raise SystemExit(f"ojs-amqp: {what} must be a JSON {kind.__name__}")
    return value


def _client(args: argparse.Namespace) -> Client:
    return Client(args.url, prefix=args.prefix)


def cmd_enqueue(args: argparse.Namespace) -> int:
    """Enqueue one job and print it."""
    options: dict[str, Any] = {"queue": args.queue}
    if args.kwargs:
        options["kwargs"] = _json_arg(args.kwargs, dict, "--kwargs")
    if args.delay:
        options["scheduled_at"] = timedelta(seconds=args.delay)
    if args.priority is not None:
        options["priority"] = args.priority
    if args.max_attempts is not None:
        options["retry"] = {"max_attempts": args.max_attempts}
    with _client(args) as client:
        job = client.enqueue(args.type, _json_arg(args.args, list, "ARGS") or [], **options)
    print(job.to_json())
    return 0


def cmd_declare(args: argparse.Namespace) -> int:
    """Declare a job queue and its dead letter queue."""
    options: dict[str, Any] = {
        k: v
        for k, v in (
            ("max_priority", args.max_priority),
            ("max_length", args.max_length),
            ("overflow", args.overflow),
            ("queue_type", "quorum" if args.quorum else None),
        )
        if v is not None
    }
    with _client(args) as client:
        print(client.declare_queue(args.queue, **options))
    return 0


def cmd_dlq_list(args: argparse.Namespace) -> int:
    """Print the dead letters of a queue, one JSON object per line, without removing them."""
    with _client(args) as client:
        for entry in client.dead_letters(args.queue, limit=args.limit):
            print(
                json.dumps(
                    {
                        "id": entry.job.id if entry.job else entry.message_id,
                        "type": entry.job.type if entry.job else None,
                        "attempt": entry.job.attempt if entry.job else None,
                        "reason": entry.reason,
                        "error_code": entry.error_code,
                        "error_message": entry.error_message,
                        "decode_error": entry.decode_error,
                    },
                    ensure_ascii=False,
                )
            )
    return 0


def cmd_dlq_replay(args: argparse.Namespace) -> int:
    """Move dead letters back to their queue (attempt reset)."""
    with _client(args) as client:
        replayed = client.replay_dead_letters(args.queue, limit=args.limit, ids=args.id or None)
    print(json.dumps({"replayed": replayed}))
    return 0


def cmd_dlq_purge(args: argparse.Namespace) -> int:
    """Delete every dead letter of a queue."""
    if not args.yes:
        raise SystemExit("ojs-amqp: purge deletes jobs for good; add --yes")
    with _client(args) as client:
        print(json.dumps({"purged": client.purge_dead_letters(args.queue)}))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel a job (binding §5.6): it never runs, or its running handler is stopped."""
    with _client(args) as client:
        client.cancel(args.job_id, queue=args.queue)
    print(json.dumps({"cancelled": args.job_id.strip().lower(), "queue": args.queue}))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """Ask the workers of a queue what they know about a job (binding §5.8); exit 1 when none does."""
    with _client(args) as client:
        info = client.info(args.job_id, queue=args.queue, timeout=args.timeout)
    if info is None:
        print(f"ojs-amqp: no live worker of {args.queue} knows job {args.job_id}", file=sys.stderr)
        return 1
    print(info.to_json())
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    """Pause a queue: its workers stop consuming it (running jobs finish)."""
    with _client(args) as client:
        client.pause(args.queue)
    print(json.dumps({"paused": args.queue}))
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    """Resume a paused queue."""
    with _client(args) as client:
        client.resume(args.queue)
    print(json.dumps({"resumed": args.queue}))
    return 0


def _add_control_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """The control-plane commands: cancel, info, pause, resume."""
    cancel = sub.add_parser("cancel", parents=[common], help="cancel a job")
    cancel.add_argument("job_id")
    cancel.add_argument("--queue", required=True, help="the OJS queue of the job")
    cancel.set_defaults(func=cmd_cancel)
    info = sub.add_parser("info", parents=[common], help="what the live workers know about a job (JSON)")
    info.add_argument("job_id")
    info.add_argument("--queue", required=True, help="the OJS queue of the job")
    info.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for answers (default 2)")
    info.set_defaults(func=cmd_info)
    pause = sub.add_parser("pause", parents=[common], help="stop the workers of a queue consuming it")
    pause.add_argument("queue")
    pause.set_defaults(func=cmd_pause)
    resume = sub.add_parser("resume", parents=[common], help="resume a paused queue")
    resume.add_argument("queue")
    resume.set_defaults(func=cmd_resume)


def load_worker(target: str) -> Worker:
    """The :class:`Worker` at ``module:attribute`` (default attribute ``worker``), imported
    with the current directory first on ``sys.path``.

    Parameters:
        target: ``"myapp.jobs:worker"``.

    Returns:
        The worker.

    Raises:
        SystemExit: the module cannot be imported, or the attribute is not a Worker.
    """
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    module_name, _, attribute = target.partition(":")
    try:
        module = import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"ojs-amqp: cannot import {module_name!r} (from {cwd}): {exc}") from None
    worker = getattr(module, attribute or "worker", None)
    if not isinstance(worker, Worker):
        raise SystemExit(f"ojs-amqp: {target} is not an ojs_kombu.Worker")
    return worker


def cmd_worker(args: argparse.Namespace) -> int:
    """Run the :class:`Worker` found at ``module:attribute`` until SIGTERM/SIGINT."""
    worker = load_worker(args.target)
    queues = [q.strip() for q in args.queues.split(",") if q.strip()] if args.queues is not None else None
    worker.configure(queues=queues, concurrency=args.concurrency)
    worker.run()
    return 0


_SINCE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(s|m|h|d)$")
_SINCE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def since_arg(text: str) -> datetime | timedelta:
    """``--since``: how long ago (``90s``, ``10m``, ``1h``, ``2d``) or an RFC 3339 timestamp.

    Raises:
        argparse.ArgumentTypeError: neither.
    """
    match = _SINCE.fullmatch(text.strip())
    if match:
        return timedelta(**{_SINCE_UNITS[match[2]]: float(match[1])})
    try:
        return parse_timestamp(text.strip())
    except ValidationError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration (30s, 10m, 1h, 2d) nor an RFC 3339 timestamp"
        ) from None


def cmd_workers(args: argparse.Namespace) -> int:
    """Print the live workers, one JSON object per line (their latest presence)."""
    with _client(args) as client:
        for presence in client.workers(stale_after=args.stale_after):
            print(json.dumps(presence.to_json(), ensure_ascii=False))
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    """Print job lifecycle events from the events stream, one JSON object per line, oldest first."""
    with _client(args) as client:
        for record in client.events(args.since, queue=args.queue, limit=args.limit):
            print(json.dumps(record.to_json(), ensure_ascii=False))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``ojs-amqp``."""
    parser = argparse.ArgumentParser(prog="ojs-amqp", description=__doc__.split("\n\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help="broker URL (default $OJS_AMQP_URL)")
    common.add_argument("--prefix", default="", help="entity name prefix (multi-tenancy)")
    sub = parser.add_subparsers(dest="command", required=True)

    enqueue = sub.add_parser("enqueue", parents=[common], help="enqueue a job")
    enqueue.add_argument("type")
    enqueue.add_argument("args", nargs="?", help="JSON array of positional arguments")
    enqueue.add_argument("--queue", default="default")
    enqueue.add_argument("--kwargs", help="JSON object of keyword arguments (meta.kwargs)")
    enqueue.add_argument("--delay", type=float, help="seconds until the job is due")
    enqueue.add_argument("--priority", type=int)
    enqueue.add_argument("--max-attempts", type=int)
    enqueue.set_defaults(func=cmd_enqueue)

    declare = sub.add_parser("declare", parents=[common], help="declare a job queue and its DLQ")
    declare.add_argument("queue")
    declare.add_argument("--max-priority", type=int)
    declare.add_argument("--max-length", type=int)
    declare.add_argument("--overflow", choices=["drop-head", "reject-publish", "reject-publish-dlx"])
    declare.add_argument("--quorum", action="store_true")
    declare.set_defaults(func=cmd_declare)

    dlq = sub.add_parser("dlq", help="dead letter queues").add_subparsers(dest="dlq_command", required=True)
    listing = dlq.add_parser("list", parents=[common], help="list dead letters (non-destructive)")
    listing.add_argument("queue")
    listing.add_argument("--limit", type=int, default=100)
    listing.set_defaults(func=cmd_dlq_list)
    replay = dlq.add_parser("replay", parents=[common], help="move dead letters back to their queue")
    replay.add_argument("queue")
    replay.add_argument("--id", action="append", help="replay only this job id (repeatable)")
    replay.add_argument("--limit", type=int)
    replay.set_defaults(func=cmd_dlq_replay)
    purge = dlq.add_parser("purge", parents=[common], help="delete every dead letter")
    purge.add_argument("queue")
    purge.add_argument("--yes", action="store_true")
    purge.set_defaults(func=cmd_dlq_purge)

    worker = sub.add_parser("worker", help="run an ojs_kombu.Worker: module:attribute")
    worker.add_argument("target", help="module:attribute of the Worker (attribute default: worker)")
    worker.add_argument("--queues", help="comma-separated OJS queues to consume instead of the Worker's own")
    worker.add_argument("--concurrency", type=int, help="handler threads and prefetch (default: the Worker's)")
    worker.add_argument("--log-level", type=str.upper, choices=_LOG_LEVELS, default="INFO")
    worker.set_defaults(func=cmd_worker)

    _add_control_commands(sub, common)
    workers = sub.add_parser("workers", parents=[common], help="list the live workers (events stream)")
    workers.add_argument(
        "--stale-after", type=float, default=15.0, help="seconds after which a silent worker is gone (default 15)"
    )
    workers.set_defaults(func=cmd_workers)
    events = sub.add_parser("events", parents=[common], help="print job lifecycle events (Worker(events=True))")
    events.add_argument("--since", type=since_arg, default=timedelta(minutes=10), help="10m, 1h, … or a timestamp")
    events.add_argument("--queue", help="only the events of this OJS queue")
    events.add_argument("--limit", type=int, help="at most this many events")
    events.set_defaults(func=cmd_events)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ojs-amqp``; returns the exit status."""
    args = build_parser().parse_args(argv)
    level = getattr(args, "log_level", "INFO")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    command: Callable[[argparse.Namespace], int] = args.func
    try:
        return command(args)
    except OjsError as exc:
        print(f"ojs-amqp: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # re-raised by Worker.run from a handler, after the graceful shutdown
        return 130


if __name__ == "__main__":
    sys.exit(main())
