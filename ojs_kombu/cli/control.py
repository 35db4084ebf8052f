"""``ojs-amqp cancel``, ``info``, ``pause``, ``resume`` (the control plane) and ``workers``, ``events``."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import click

from ojs_kombu.cli.common import (
    Since,
    cell,
    connection_options,
    json_option,
    open_client,
    print_json_lines,
    print_table,
)
from ojs_kombu.client import DEFAULT_STALE_AFTER
from ojs_kombu.model.ids import EXAMPLE_JOB_ID, UUID_RE
from ojs_kombu.model.timefmt import format_timestamp, utcnow
from ojs_kombu.wire.events import WorkerPresence

_QUEUE = click.option("--queue", required=True, help="the OJS queue of the job")


def job_id_arg(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """The ``JOB_ID`` argument of ``cancel`` and ``info``: a UUID, in any case; returned stripped, lowercase.

    An OJS job id is a UUIDv7; a Celery task id and a Dramatiq ``message_id`` (what
    ``send()`` returned) are UUIDs too, and the workers of those adapters know jobs by them,
    so any UUID version is accepted.

    Raises:
        click.BadParameter: not a UUID (a usage error: exit status 2).
    """
    job_id = value.strip().lower()
    if not UUID_RE.fullmatch(job_id):
        raise click.BadParameter(
            f"{value!r} is not a job id: expected a UUID such as {EXAMPLE_JOB_ID} "
            "(an OJS job id, a Celery task id or a Dramatiq message id)"
        )
    return job_id


@click.command()
@click.argument("job_id", callback=job_id_arg)
@_QUEUE
@connection_options
def cancel(job_id: str, queue: str, url: str | None, prefix: str) -> None:
    """Cancel a job (binding §5.6): it never runs, or its running handler is stopped."""
    with open_client(url, prefix) as client:
        client.cancel(job_id, queue=queue)
    click.echo(json.dumps({"cancelled": job_id, "queue": queue}))


@click.command()
@click.argument("job_id", callback=job_id_arg)
@_QUEUE
@click.option("--timeout", type=float, default=2.0, show_default=True, help="seconds to wait for answers")
@json_option
@connection_options
def info(job_id: str, queue: str, timeout: float, as_json: bool, url: str | None, prefix: str) -> None:
    """What the live workers of a queue know about a job (binding §5.8); exit status 1 when none does."""
    with open_client(url, prefix) as client:
        found = client.info(job_id, queue=queue, timeout=timeout)
    if found is None:
        click.echo(f"ojs-amqp: no live worker of {queue} knows job {job_id}", err=True)
        raise click.exceptions.Exit(1)
    if as_json:
        click.echo(found.to_json())
        return
    print_table(f"job {found.job_id}", ["field", "value"], [(k, cell(v)) for k, v in found.to_dict().items()])


def _queue_switch(name: str, outcome: str, help_text: str) -> click.Command:
    """``ojs-amqp pause`` / ``resume``: call ``Client.<name>(queue)`` and print ``{outcome: queue}``."""

    @click.command(name=name, help=help_text)
    @click.argument("queue")
    @connection_options
    def command(queue: str, url: str | None, prefix: str) -> None:
        with open_client(url, prefix) as client:
            getattr(client, name)(queue)
        click.echo(json.dumps({outcome: queue}))

    return command


pause = _queue_switch("pause", "paused", "Pause a queue: its workers stop consuming it (running jobs finish).")
resume = _queue_switch("resume", "resumed", "Resume a paused queue.")


def _age(moment: datetime) -> str:
    seconds = max(0.0, (utcnow() - moment).total_seconds())
    return f"{seconds:.0f}s" if seconds < 120 else str(timedelta(seconds=int(seconds)))


def worker_rows(presences: list[WorkerPresence]) -> list[tuple[str, ...]]:
    """One table row per running job of each worker (a row with no job for an idle one)."""
    rows: list[tuple[str, ...]] = []
    for presence in presences:
        head = (presence.worker_id, f"{presence.host}:{presence.pid}", ",".join(presence.queues))
        busy = f"{len(presence.active)}/{presence.concurrency}"
        for job in presence.active or ():
            rows.append((*head, busy, job.job_id, job.job_type, _age(job.started_at)))
        if not presence.active:
            rows.append((*head, busy, "", "", ""))
    return rows


WORKER_COLUMNS = ("worker", "host:pid", "queues", "busy", "job", "type", "running for")


@click.command()
@click.option(
    "--stale-after",
    type=float,
    default=DEFAULT_STALE_AFTER,
    show_default=True,
    help="seconds after which a silent worker is gone",
)
@json_option
@connection_options
def workers(stale_after: float, as_json: bool, url: str | None, prefix: str) -> None:
    """List the live workers and what they run (their latest presence on the events stream)."""
    with open_client(url, prefix) as client:
        presences = client.workers(stale_after=stale_after)
    if as_json:
        print_json_lines(p.to_json() for p in presences)
        return
    print_table("workers", WORKER_COLUMNS, worker_rows(presences))


@click.command()
@click.option("--since", type=Since(), default="10m", show_default=True, help="10m, 1h, … or an RFC 3339 timestamp")
@click.option("--queue", help="only the events of this OJS queue")
@click.option("--limit", type=click.IntRange(min=1), help="at most this many events")
@json_option
@connection_options
def events(
    since: datetime | timedelta, queue: str | None, limit: int | None, as_json: bool, url: str | None, prefix: str
) -> None:
    """Print job lifecycle events from the events stream, oldest first (workers need Worker(events=True))."""
    with open_client(url, prefix) as client:
        records = client.events(since, queue=queue, limit=limit)
    if as_json:
        print_json_lines(r.to_json() for r in records)
        return
    print_table(
        "events",
        ("at", "event", "queue", "type", "job", "attempt", "worker", "error"),
        [
            (
                format_timestamp(r.at),
                r.event,
                r.queue,
                r.job_type,
                r.job_id,
                r.attempt,
                r.worker_id,
                cell((r.error or {}).get("message")),
            )
            for r in records
        ],
    )
