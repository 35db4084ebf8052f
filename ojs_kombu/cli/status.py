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
* ``held``: dead letters of the job queue and its retry queues not yet routed to their
  target (a dead letter queue, or the job queue for a retry): a quorum queue dead-letters
  at least once and holds each until the target confirms it (``messages_dlx`` in the
  management API's statistics; a few at a time while a target's leader moves, more when a
  target is missing or full).  0 for classic queues, unknown without the management API;
* ``paused``: the queue's control stream, replayed as the workers replay it
  (:meth:`~ojs_kombu.client.Client.paused_queues`); that costs about 0.1 ms per
  retained cancel (5.5 s for 50,000), so ``--no-paused`` skips it (the column is unknown).

The management API is reached at ``--management-url`` (default ``$OJS_MANAGEMENT_URL``, else
derived from the broker URL as rabbitmqadmin does: its first host, ``http``, port 15672) with the
user and password of that URL, else of the broker URL, on the broker URL's vhost;
``--management-url ''`` goes without it.  When it does not answer, ``status`` says which URL it
tried and what to set; a broker that refuses the login or does not answer is reported as such.
The data (:func:`~ojs_kombu.dashboard.overview.snapshot`) is shared with the web dashboard.
"""

from __future__ import annotations

import time
from dataclasses import asdict

import click
from rich.console import Group, RenderableType
from rich.live import Live

from ojs_kombu.amqp.management import management_client
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
from ojs_kombu.dashboard.overview import Snapshot, snapshot

STATUS_COLUMNS = (
    "queue",
    "ready",
    "unacked",
    "consumers",
    "retrying",
    "dead",
    "held",
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
            cell(q.held),
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
    help="management API root, e.g. http://localhost:15672 (default $OJS_MANAGEMENT_URL, else the broker "
    "URL's first host on port 15672 with its credentials; '' for none)",
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
        click.echo(f"ojs-amqp: {redact(shot.note)}", err=True)
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
                parts.append(redact(shot.note))
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
