"""``ojs-amqp``: see the queues, browse and replay dead letters, control workers, enqueue, run a worker.

::

    ojs-amqp status [--queue email ...] [--management-url http://localhost:15672] [--json]
    ojs-amqp top [--interval 2] [--once]
    ojs-amqp dlq list email [--type T ...] [--error CODE_OR_TEXT] [--since 1h] [--ids ID,ID] [--limit N] [--json]
    ojs-amqp dlq show email JOB_ID [--json]
    ojs-amqp dlq replay email [filters] [--yes]
    ojs-amqp dlq purge email [filters] [--yes]
    ojs-amqp dlq export email [filters] [-o dead.jsonl]
    ojs-amqp workers [--stale-after 15] [--json]
    ojs-amqp events [--since 10m] [--queue email] [--limit N] [--json]
    ojs-amqp info JOB_ID --queue email [--timeout 2] [--json]
    ojs-amqp cancel JOB_ID --queue email
    ojs-amqp pause email
    ojs-amqp resume email
    ojs-amqp enqueue email.send '["ada@example.com", "welcome"]' --queue email --delay 30
    ojs-amqp declare email --max-priority 10
    ojs-amqp dashboard [--port 8787] [--host 127.0.0.1] [--read-only] [--auth-token T]
    ojs-amqp worker myapp.jobs:worker [--queues email,sms] [--concurrency 20] [--log-level debug]
    ojs-amqp cron run [--log-level info]
    ojs-amqp cron list [--enabled|--disabled] [--json]
    ojs-amqp cron add daily-report '0 9 * * *' report.generate '[{"kind": "daily"}]' --queue reports --timezone Europe/Paris
    ojs-amqp cron remove daily-report
    ojs-amqp manifest [--unique-backend redis://host:6379/0]

Every command but ``worker`` and ``manifest`` takes ``--url`` (default ``$OJS_AMQP_URL``) and
``--prefix``; the worker takes them from its :class:`~ojs_kombu.Worker`; ``manifest`` connects to
nothing and prints the OJS conformance manifest as one indented JSON document.

Output: read commands (``status``, ``dlq list|show``, ``workers``, ``events``,
``info``) print rich tables, or with ``--json`` one JSON document per line, so
they pipe into ``jq``; ``dlq export`` writes JSON Lines.  Commands that change
something (``enqueue``, ``declare``, ``cancel``, ``pause``, ``resume``, ``dlq
replay``, ``dlq purge``) print one JSON line.  ``status --json`` prints one line
per queue (``queue``, ``exists``, ``ready``, ``unacked``, ``consumers``,
``retrying``, ``dead``, ``held``, ``paused``, ``publish_rate``, ``deliver_rate``,
``ack_rate``; ``null`` where unknown) and then ``{"totals": {...}, "management":
true|false}``; see :mod:`ojs_kombu.cli.status` for where each number comes from.

Dead letter filters (:mod:`ojs_kombu.cli.dlq`): every ``dlq`` subcommand acts on
exactly the letters matching all of ``--type``, ``--error``, ``--since``,
``--ids`` and ``--limit``.  ``replay`` and ``purge`` ask for confirmation on the
terminal unless ``--yes``, and show a progress bar on stderr.  ``purge`` without
any filter empties the dead letter queue.

Exit status: 0 ok; 1 an error (one line on stderr, ``ojs-amqp: Type: message``,
never a traceback nor a password), a declined confirmation, or ``info`` finding
no worker that knows the job; 2 a usage error.

``ojs-amqp worker`` imports ``module:attribute`` (default attribute: ``worker``)
with the current directory first on ``sys.path``, as ``celery -A`` and
``dramatiq`` do, so it runs from the project directory.  ``--queues`` replaces
the Worker's queues (it does not add to them); ``--concurrency`` replaces its
concurrency.  Exit status: 0 after a graceful shutdown (SIGTERM / SIGINT); 1
when the worker stopped on its own (:class:`~ojs_kombu.errors.WorkerError`:
the broker refused it, its connection retries ran out...) so that a supervisor
restarts it; a handler's ``sys.exit(n)`` ends it with ``n``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import click

from ojs_kombu.cli.common import error_line, since_arg
from ojs_kombu.cli.control import cancel, events, info, pause, resume, workers
from ojs_kombu.cli.cron import cron
from ojs_kombu.cli.dashboard import dashboard
from ojs_kombu.cli.dlq import dlq
from ojs_kombu.cli.jobs import declare, enqueue, load_worker, worker
from ojs_kombu.cli.manifest import manifest
from ojs_kombu.cli.status import status, top
from ojs_kombu.errors import OjsError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
def cli() -> None:
    """Operate OJS jobs on RabbitMQ (the ojs-amqp command)."""


for _command in (
    status,
    top,
    dlq,
    workers,
    events,
    info,
    cancel,
    pause,
    resume,
    enqueue,
    declare,
    worker,
    dashboard,
    cron,
    manifest,
):
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ojs-amqp``; returns the exit status.

    Parameters:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        0 ok, 1 an error (:class:`OjsError` printed as one line on stderr) or an aborted
        confirmation, 2 a usage error, 130 a worker a handler interrupted (``KeyboardInterrupt``).
    """
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        result = cli.main(args=list(argv) if argv is not None else None, prog_name="ojs-amqp", standalone_mode=False)
    except click.exceptions.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("ojs-amqp: aborted", err=True)
        return 1
    except OjsError as exc:
        click.echo(error_line(exc), err=True)
        return 1
    return result if isinstance(result, int) else 0


__all__ = ["cli", "load_worker", "main", "since_arg"]
