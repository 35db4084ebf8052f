"""``ojs-amqp cron run|list|add|remove``: periodic jobs (ojs-cron.md; DESIGN §20).

``cron run`` runs a :class:`~ojs_kombu.runtime.cron.CronScheduler` until SIGTERM or SIGINT
(any number may run: one fires).  ``cron list`` reads the definitions back from the cron
stream (name, expression, time zone, next run, last run, enabled) and the scheduler elected
last; ``--json`` prints one spec §8.3 object per line, then ``{"leader": …}``.
"""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import click

from ojs_kombu.cli.common import (
    MISSING,
    cell,
    connection_options,
    json_arg,
    json_option,
    print_json_lines,
    print_table,
    remember_secrets,
)
from ojs_kombu.model.cron import OVERLAP_POLICIES
from ojs_kombu.model.naming import Names
from ojs_kombu.model.timefmt import format_timestamp
from ojs_kombu.runtime.cron import CronRegistry, CronScheduler

_LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


@contextmanager
def open_registry(url: str | None, prefix: str) -> Iterator[CronRegistry]:
    """A :class:`CronRegistry` with its own connection for one command."""
    remember_secrets(url)
    registry = CronRegistry.connect(url, names=Names(prefix))
    with registry:
        yield registry


@click.group()
def cron() -> None:
    """Periodic jobs: run the scheduler, list, add and remove cron jobs."""


@cron.command()
@click.option("--log-level", type=click.Choice(_LOG_LEVELS, case_sensitive=False), default="INFO", show_default=True)
@connection_options
def run(log_level: str, url: str | None, prefix: str) -> None:
    """Run a cron scheduler until SIGTERM/SIGINT; any number may run, the leader fires."""
    logging.getLogger().setLevel(log_level.upper())
    remember_secrets(url)
    scheduler = CronScheduler(url, prefix=prefix)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        scheduler.stop(timeout=0)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        scheduler.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _time(value: Any) -> str:
    return MISSING if value is None else format_timestamp(value)


@cron.command(name="list")
@click.option("--enabled/--disabled", "enabled", default=None, help="only the enabled (or disabled) cron jobs")
@json_option
@connection_options
def list_(enabled: bool | None, as_json: bool, url: str | None, prefix: str) -> None:
    """The registered cron jobs with their next and last runs, and the scheduler elected last."""
    with open_registry(url, prefix) as registry:
        crons = registry.list(enabled=enabled)
        leader = registry.leader()
    leader_json = (
        None
        if leader is None
        else {
            "scheduler_id": leader.scheduler_id,
            "host": leader.host,
            "pid": leader.pid,
            "elected_at": format_timestamp(leader.elected_at),
        }
    )
    if as_json:
        print_json_lines([*(c.to_dict() for c in crons), {"leader": leader_json}])
        return
    rows = [
        (
            c.name,
            c.cron,
            c.timezone,
            c.type,
            c.queue,
            _time(c.next_run_at),
            _time(c.last_run_at),
            cell(c.run_count),
            "yes" if c.enabled else "no",
        )
        for c in crons
    ]
    caption = (
        "leader: none elected yet"
        if leader is None
        else f"leader: {leader.scheduler_id} (elected {format_timestamp(leader.elected_at)})"
    )
    print_table(
        "cron jobs",
        ["name", "cron", "timezone", "type", "queue", "next run", "last run", "runs", "enabled"],
        rows,
        caption=caption,
    )


@cron.command()
@click.argument("name")
@click.argument("expression")
@click.argument("job_type")
@click.argument("args", required=False)
@click.option("--queue", default="default", show_default=True, help="the queue each occurrence's job goes to")
@click.option("--timezone", default="UTC", show_default=True, help="IANA time zone of the expression")
@click.option("--overlap-policy", type=click.Choice(OVERLAP_POLICIES), default="skip", show_default=True)
@click.option("--disabled", is_flag=True, help="register it disabled")
@click.option("--description", help="free text")
@connection_options
def add(
    name: str,
    expression: str,
    job_type: str,
    args: str | None,
    queue: str,
    timezone: str,
    overlap_policy: str,
    disabled: bool,
    description: str | None,
    url: str | None,
    prefix: str,
) -> None:
    """Register (or replace) the cron job NAME: EXPRESSION, JOB_TYPE and ARGS (a JSON array)."""
    values = json_arg(args, list, "ARGS") if args is not None else []
    with open_registry(url, prefix) as registry:
        found = registry.register_cron(
            name,
            expression,
            job_type,
            values,
            queue=queue,
            timezone=timezone,
            overlap_policy=overlap_policy,  # type: ignore[arg-type]
            enabled=not disabled,
            description=description,
        )
    click.echo(json.dumps(found.to_dict(), separators=(",", ":")))


@cron.command()
@click.argument("name")
@connection_options
def remove(name: str, url: str | None, prefix: str) -> None:
    """Remove the cron job NAME (exit status 1 when there is none); jobs it enqueued stay."""
    with open_registry(url, prefix) as registry:
        registry.remove(name)
    click.echo(json.dumps({"deleted": True, "name": name}))


__all__ = ["cron", "open_registry"]
