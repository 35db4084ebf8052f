"""``ojs-amqp dlq list|show|replay|purge|export``: dead letters as decoded jobs, filtered.

Every subcommand takes the same filters (:class:`~ojs_kombu.runtime.deadletter.DeadLetterFilter`),
and each acts on exactly the letters that match all of them: ``--type`` (repeatable),
``--error`` (an error code, or text of the error message), ``--since`` (dead-lettered at
or after), ``--ids`` (comma-separated, repeatable) and ``--limit``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import IO, Any, ParamSpec, TypeVar

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ojs_kombu.cli.common import (
    Since,
    cell,
    connection_options,
    console,
    json_option,
    open_client,
    print_json_lines,
    print_table,
    since_datetime,
)
from ojs_kombu.client import Client
from ojs_kombu.errors import NotFoundError
from ojs_kombu.model.timefmt import format_timestamp
from ojs_kombu.runtime.deadletter import DeadLetterEntry, DeadLetterFilter, ReplayProgress

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Selection:
    """The filters of a ``dlq`` subcommand: which letters, and at most how many."""

    filter: DeadLetterFilter
    limit: int | None

    @property
    def filtered(self) -> bool:
        """Whether any criterion is set (an unfiltered purge empties the queue at once)."""
        return self.filter != DeadLetterFilter() or self.limit is not None

    def describe(self) -> str:
        """The criteria in words, for the confirmation prompt."""
        f = self.filter
        parts = [
            f"type in {sorted(f.types)}" if f.types else "",
            f"error ~ {f.error!r}" if f.error else "",
            f"dead since {format_timestamp(f.since)}" if f.since else "",
            f"{len(f.ids)} id(s)" if f.ids else "",
            f"at most {self.limit}" if self.limit is not None else "",
        ]
        return ", ".join(p for p in parts if p) or "all"


def _split_ids(values: tuple[str, ...]) -> list[str]:
    return [i.strip() for value in values for i in value.split(",") if i.strip()]


def filter_options(default_limit: int | None) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Add the dead letter filters to a command; it receives them as one ``selection`` (:class:`Selection`)."""

    def decorate(command: Callable[P, R]) -> Callable[P, R]:
        options = [
            click.option("--limit", type=click.IntRange(min=1), default=default_limit, help="at most this many"),
            click.option("--id", "ids_one", multiple=True, hidden=True),  # 0.x spelling of --ids
            click.option("--ids", multiple=True, help="only these job ids (comma-separated, repeatable)"),
            click.option("--since", type=Since(), help="dead-lettered at or after: 10m, 1h, … or a timestamp"),
            click.option("--error", help="an error code (exact), or text of the error message"),
            click.option("--type", "types", multiple=True, help="only jobs of this type (repeatable)"),
        ]
        for option in options:
            command = option(command)
        return command

    return decorate


def selection_of(
    types: tuple[str, ...],
    error: str | None,
    since: datetime | timedelta | None,
    ids: tuple[str, ...],
    ids_one: tuple[str, ...],
    limit: int | None,
) -> Selection:
    """The :class:`Selection` the filter options name."""
    return Selection(
        DeadLetterFilter.of(
            types=types,
            error=error,
            since=since_datetime(since) if since is not None else None,
            ids=_split_ids(ids + ids_one),
        ),
        limit,
    )


def summary(entry: DeadLetterEntry) -> dict[str, Any]:
    """What ``dlq list --json`` prints of a letter: its final failure (``attempt``, ``error_code``,
    ``error_type``, ``error_message``, ``failed_at``), ``reason`` and ``dead_at``."""
    return {
        "id": entry.job.id if entry.job is not None else entry.message_id,
        "type": entry.job.type if entry.job else None,
        "attempt": entry.attempt,
        "reason": entry.reason,
        "error_code": entry.error_code,
        "error_type": entry.error_type,
        "error_message": entry.error_message,
        "failed_at": format_timestamp(entry.failed_at) if entry.failed_at else None,
        "decode_error": entry.decode_error,
        "dead_at": format_timestamp(entry.dead_at) if entry.dead_at else None,
    }


def record(entry: DeadLetterEntry) -> dict[str, Any]:
    """Everything known of a letter (``dlq show --json``, ``dlq export``): the summary, the decoded job,
    ``x-death``, and the raw body when it is not a job."""
    return {
        **summary(entry),
        "death_count": entry.death_count,
        "x_death": entry.headers.get("x-death"),
        "job": json.loads(entry.job.to_json()) if entry.job is not None else None,
        "body": entry.body.decode("utf-8", "replace") if entry.job is None else None,
    }


@click.group()
def dlq() -> None:
    """Dead letter queues: list, show, replay, purge, export."""


def _entries(client: Client, queue: str, selection: Selection) -> list[DeadLetterEntry]:
    return client.dead_letters(queue, selection.limit, select=selection.filter)


@dlq.command("list")
@click.argument("queue")
@filter_options(default_limit=100)
@json_option
@connection_options
def list_(queue: str, as_json: bool, url: str | None, prefix: str, **filters: Any) -> None:
    """List dead letters of QUEUE, oldest first, leaving them in place."""
    selection = selection_of(**filters)
    with open_client(url, prefix) as client:
        entries = _entries(client, queue, selection)
    if as_json:
        print_json_lines(summary(e) for e in entries)
        return
    print_table(
        f"dead letters of {queue} ({selection.describe()})",
        ("id", "type", "attempt", "reason", "error", "dead at"),
        [
            (
                s["id"],
                cell(s["type"]),
                cell(s["attempt"]),
                cell(s["reason"]),
                cell(
                    ": ".join(str(part) for part in (s["error_code"], s["error_message"]) if part) or s["decode_error"]
                ),
                cell(s["dead_at"]),
            )
            for s in map(summary, entries)
        ],
    )


@dlq.command()
@click.argument("queue")
@click.argument("job_id")
@json_option
@connection_options
def show(queue: str, job_id: str, as_json: bool, url: str | None, prefix: str) -> None:
    """Show one dead letter of QUEUE in full: the decoded job, its errors and x-death."""
    with open_client(url, prefix) as client:
        found = client.dead_letters(queue, 1, select=DeadLetterFilter.of(ids=[job_id]))
    if not found:
        raise NotFoundError(f"no dead letter {job_id} in the dead letter queue of {queue}", reply_code=404)
    document = record(found[0])
    if as_json:
        print_json_lines([document])
        return
    console().print_json(json.dumps(document, ensure_ascii=False, default=str))


@dlq.command()
@click.argument("queue")
@filter_options(default_limit=None)
@click.option("--output", "-o", type=click.File("w", encoding="utf-8"), default="-", help="file (default stdout)")
@connection_options
def export(queue: str, output: IO[str], url: str | None, prefix: str, **filters: Any) -> None:
    """Write dead letters of QUEUE as JSON Lines (one full record per letter), leaving them in place."""
    with open_client(url, prefix) as client:
        entries = _entries(client, queue, selection_of(**filters))
    for entry in entries:
        output.write(json.dumps(record(entry), ensure_ascii=False, default=str) + "\n")


class _Bar:
    """A progress bar on stderr, advanced by a replay's or a purge's :class:`ReplayProgress` reports."""

    def __init__(self, what: str, total: int | None):
        self.progress = Progress(
            TextColumn("scanned"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[done]} " + what),
            TimeElapsedColumn(),
            console=console(stderr=True),
        )
        self.task = self.progress.add_task("", total=total, done=0)

    def report(self, progress: ReplayProgress) -> None:
        """Show where the scan stands (a :class:`ReplayProgress` callback)."""
        self.progress.update(self.task, total=progress.total, completed=progress.scanned, done=progress.replayed)

    def finish(self, done: int) -> None:
        """Show the final count (the last report comes before its window's letters are acked)."""
        self.progress.update(self.task, done=done)


@contextmanager
def _progress(what: str, total: int | None) -> Iterator[_Bar]:
    bar = _Bar(what, total)
    with bar.progress:
        yield bar


def _confirm(client: Client, queue: str, action: str, selection: Selection, yes: bool) -> int | None:
    """Ask before ``action`` unless ``yes``; returns how many letters the dead letter queue holds."""
    dead_letter_queue = client.names.dead_letter_queue(queue)
    counts = client.queue_counts([dead_letter_queue])[dead_letter_queue]
    if counts is None:
        raise NotFoundError(f"the dead letter queue {dead_letter_queue} does not exist", reply_code=404)
    if not yes:
        click.confirm(
            f"{action} the dead letters of {queue} matching: {selection.describe()} "
            f"({counts.ready} letter(s) in the queue)?",
            abort=True,
            err=True,
        )
    return counts.ready


@dlq.command()
@click.argument("queue")
@filter_options(default_limit=None)
@click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation")
@connection_options
def replay(queue: str, yes: bool, url: str | None, prefix: str, **filters: Any) -> None:
    """Move the matching dead letters of QUEUE back to it (attempt reset); print the replayed ids as JSON."""
    selection = selection_of(**filters)
    with open_client(url, prefix) as client:
        total = _confirm(client, queue, "Replay", selection, yes)
        with _progress("replayed", total) as bar:
            replayed = client.replay_dead_letters(
                queue, limit=selection.limit, select=selection.filter, progress=bar.report
            )
            bar.finish(len(replayed))
    click.echo(json.dumps({"replayed": replayed}))


@dlq.command()
@click.argument("queue")
@filter_options(default_limit=None)
@click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation")
@connection_options
def purge(queue: str, yes: bool, url: str | None, prefix: str, **filters: Any) -> None:
    """Delete the matching dead letters of QUEUE for good (all of them without filters); print how many."""
    selection = selection_of(**filters)
    with open_client(url, prefix) as client:
        total = _confirm(client, queue, "Delete", selection, yes)
        if not selection.filtered:
            purged = client.purge_dead_letters(queue)
        else:
            with _progress("deleted", total) as bar:
                purged = client.purge_dead_letters(
                    queue, select=selection.filter, limit=selection.limit, progress=bar.report
                )
                bar.finish(purged)
    click.echo(json.dumps({"purged": purged}))
