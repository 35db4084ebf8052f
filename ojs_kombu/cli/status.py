"""``ojs-amqp status`` and ``ojs-amqp top``: one row per OJS queue, once or live.

Where the numbers come from:

* the queues: the management API's ``/api/queues`` (the prefix's ``ojs.queue.*`` job
  queues, or only those named with ``--queue``); without it, the ``--queue`` names;
* ``ready``, ``consumers``, ``dead`` (its dead letter queue), ``retrying`` (the sum of
  its retry queues ``ojs.queue.retry.{q}.{delay}``) and the scheduling cascade's total:
  passive declares, exact at the moment they run.  The retry queues are found through
  the management API only: without it, ``retrying`` is unknown;
* ``unacked`` and the publish / deliver / ack rates: the management API's statistics
  (they lag by up to one sample interval, 5 s by default); unknown without it;
* ``paused``: the queue's control stream, replayed as the workers replay it
  (:meth:`~ojs_kombu.client.Client.paused_queues`); that costs about 0.1 ms per
  retained cancel (5.5 s for 50,000), so ``--no-paused`` skips it (the column is unknown).

The management API is reached at ``--management-url`` (default ``$OJS_MANAGEMENT_URL``)
with the user and password of that URL, else of the broker URL, on the broker URL's vhost.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import click
from rich.console import Group, RenderableType
from rich.live import Live

from ojs_kombu.cli.common import (
    cell,
    connection_options,
    console,
    json_option,
    open_client,
    print_json_lines,
    redact,
    table,
)
from ojs_kombu.cli.control import WORKER_COLUMNS, worker_rows
from ojs_kombu.client import Client
from ojs_kombu.errors import ValidationError
from ojs_kombu.testing.management import ManagementClient, ManagementError


@dataclass
class QueueStatus:
    """One row of ``status``; None where the value is unknown."""

    queue: str
    exists: bool
    ready: int | None = None
    unacked: int | None = None
    consumers: int | None = None
    retrying: int | None = None
    dead: int | None = None
    paused: bool | None = None
    publish_rate: float | None = None
    deliver_rate: float | None = None
    ack_rate: float | None = None


@dataclass
class Snapshot:
    """What ``status`` shows: the rows, the scheduling cascade's total, and where the numbers came from."""

    queues: list[QueueStatus]
    scheduled: int | None
    management: bool
    note: str = ""

    def totals(self) -> dict[str, Any]:
        """The totals line of ``status --json``."""

        def total(field: str) -> int | None:
            values = [getattr(q, field) for q in self.queues if q.exists]
            return None if any(v is None for v in values) else sum(values)

        return {
            "totals": {
                "ready": total("ready"),
                "retrying": total("retrying"),
                "dead": total("dead"),
                "scheduled": self.scheduled,
            },
            "management": self.management,
        }


def management_client(management_url: str | None, broker_url: str) -> ManagementClient | None:
    """A management API client for ``management_url`` (None when not given).

    The credentials are the URL's own, else the broker URL's; the vhost is the broker URL's.
    """
    if not management_url:
        return None
    parts = urlsplit(management_url)
    broker = urlsplit(broker_url.split(";")[0].strip())
    user = unquote(parts.username or broker.username or "guest")
    password = unquote(parts.password or broker.password or "guest")
    vhost = unquote(broker.path[1:]) if broker.path and broker.path != "/" else "/"
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    base = urlunsplit((parts.scheme, host, parts.path, "", ""))  # without the credentials
    return ManagementClient(base, user, password, vhost or "/", timeout=5.0)


def _rate(queue: dict[str, Any], stat: str) -> float:
    return float(((queue.get("message_stats") or {}).get(f"{stat}_details") or {}).get("rate", 0.0))


def snapshot(
    client: Client, management: ManagementClient | None, only: Sequence[str], *, paused: bool = True
) -> Snapshot:
    """Read the status of the OJS queues (see the module docstring).

    Parameters:
        client: the client whose broker and prefix are read.
        management: the management API, or None.
        only: these OJS queues only (required without the management API).
        paused: read the control streams (their replay costs about 0.1 ms per retained cancel).

    Returns:
        The snapshot.

    Raises:
        ValidationError: no management API answered and no queue was named.
        BrokerConnectionError, BrokerRefusedError: the broker could not be read.
    """
    names = client.names
    listed: dict[str, dict[str, Any]] | None = None
    note = ""
    if management is not None:
        try:
            listed = {q["name"]: q for q in management.queues(names.job_queue(""))}
        except ManagementError as exc:
            note = f"management API not used ({redact(str(exc))}): unacked, retrying and rates unknown"
    if listed is None and not only:
        raise ValidationError(
            "name the queues with --queue: the management API "
            + ("is not configured (--management-url, $OJS_MANAGEMENT_URL)" if management is None else "did not answer"),
            field="queue",
        )
    if listed is not None:
        found = sorted(q for q in map(names.queue_from_job_queue, listed) if q is not None)
        queues = [q for q in found if not only or q in only] + [q for q in only if q not in found]
    else:
        queues = list(dict.fromkeys(only))
    retry_head = names.job_queue("retry.")
    retry_queues: dict[str, list[str]] = {q: [] for q in queues}
    for name in listed or ():
        if name.startswith(retry_head) and "." in name[len(retry_head) :]:
            owner = name[len(retry_head) :].rsplit(".", 1)[0]
            if owner in retry_queues:
                retry_queues[owner].append(name)
    cascade = [client.cascade.queue(level) for level in range(client.cascade.levels)]
    counts = client.queue_counts(
        [
            *(names.job_queue(q) for q in queues),
            *(names.dead_letter_queue(q) for q in queues),
            *(r for q in queues for r in retry_queues[q]),
            *cascade,
        ]
    )
    existing = [q for q in queues if counts[names.job_queue(q)] is not None]
    pauses = client.paused_queues(existing) if existing and paused else {}
    rows = []
    for queue in queues:
        own = counts[names.job_queue(queue)]
        if own is None:
            rows.append(QueueStatus(queue, exists=False))
            continue
        stats = (listed or {}).get(names.job_queue(queue))
        dead = counts[names.dead_letter_queue(queue)]
        row = QueueStatus(
            queue,
            exists=True,
            ready=own.ready,
            consumers=own.consumers,
            dead=dead.ready if dead is not None else 0,
            paused=pauses.get(queue),
        )
        if listed is not None:
            row.retrying = sum(c.ready for r in retry_queues[queue] if (c := counts[r]) is not None)
        if stats is not None:
            row.unacked = int(stats.get("messages_unacknowledged", 0) or 0)
            row.publish_rate = _rate(stats, "publish")
            row.deliver_rate = _rate(stats, "deliver_get")
            row.ack_rate = _rate(stats, "ack")
        rows.append(row)
    scheduled = sum(c.ready for level in cascade if (c := counts[level]) is not None)
    return Snapshot(rows, scheduled, listed is not None, note)


STATUS_COLUMNS = (
    "queue",
    "ready",
    "unacked",
    "consumers",
    "retrying",
    "dead",
    "paused",
    "publish/s",
    "deliver/s",
    "ack/s",
)


def status_table(shot: Snapshot) -> RenderableType:
    """The queues of a snapshot as a rich table; unknown values are marked."""
    rows = [
        (
            q.queue if q.exists else f"{q.queue} (missing)",
            cell(q.ready),
            cell(q.unacked),
            cell(q.consumers),
            cell(q.retrying),
            cell(q.dead),
            cell(q.paused),
            cell(q.publish_rate, "{:.1f}"),
            cell(q.deliver_rate, "{:.1f}"),
            cell(q.ack_rate, "{:.1f}"),
        )
        for q in shot.queues
    ]
    source = "management API and passive declares" if shot.management else "passive declares (no management API)"
    caption = f"scheduled (cascade): {cell(shot.scheduled)} · from {source}"
    return table("OJS queues", STATUS_COLUMNS, rows, caption=caption)


_QUEUES = click.option("--queue", "queues", multiple=True, help="only this OJS queue (repeatable)")
_PAUSED = click.option(
    "--paused/--no-paused",
    default=True,
    show_default=True,
    help="read the control streams for the paused column (costs ~0.1 ms per retained cancel)",
)
_MANAGEMENT = click.option(
    "--management-url",
    envvar="OJS_MANAGEMENT_URL",
    help="management API root, e.g. http://localhost:15672 (default $OJS_MANAGEMENT_URL)",
)


@click.command()
@_QUEUES
@_MANAGEMENT
@_PAUSED
@json_option
@connection_options
def status(
    queues: tuple[str, ...], management_url: str | None, paused: bool, as_json: bool, url: str | None, prefix: str
) -> None:
    """One row per OJS queue: ready, unacked, consumers, retrying, dead, paused, rates.

    With --json: one line per queue, then a line {"totals": {...}, "management": bool}.
    """
    with open_client(url, prefix) as client:
        shot = snapshot(client, management_client(management_url, client.url), queues, paused=paused)
    if shot.note:
        click.echo(f"ojs-amqp: {shot.note}", err=True)
    if as_json:
        print_json_lines([*(asdict(q) for q in shot.queues), shot.totals()])
        return
    console().print(status_table(shot))


@click.command()
@_QUEUES
@_MANAGEMENT
@_PAUSED
@click.option("--interval", type=click.FloatRange(min=0.5), default=2.0, show_default=True, help="seconds")
@click.option("--once", is_flag=True, help="render one frame and exit")
@connection_options
def top(
    queues: tuple[str, ...],
    management_url: str | None,
    paused: bool,
    interval: float,
    once: bool,
    url: str | None,
    prefix: str,
) -> None:
    """A live view of the queues and the workers, refreshed every --interval seconds until Ctrl-C."""
    with open_client(url, prefix) as client:
        management = management_client(management_url, client.url)

        def frame() -> RenderableType:
            shot = snapshot(client, management, queues, paused=paused)
            workers = table("workers", WORKER_COLUMNS, worker_rows(client.workers()))
            parts: list[RenderableType] = [status_table(shot), workers]
            if shot.note:
                parts.append(shot.note)
            return Group(*parts)

        if once:
            console().print(frame())
            return
        try:
            with Live(frame(), console=console(), auto_refresh=False, screen=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(frame(), refresh=True)
        except KeyboardInterrupt:
            pass
