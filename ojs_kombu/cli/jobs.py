"""``ojs-amqp enqueue``, ``declare`` and ``worker``."""

from __future__ import annotations

import logging
import os
import sys
from datetime import timedelta
from importlib import import_module
from typing import Any

import click

from ojs_kombu.cli.common import connection_options, json_arg, open_client
from ojs_kombu.runtime.worker import Worker

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@click.command()
@click.argument("job_type", metavar="TYPE")
@click.argument("args", required=False, metavar="[ARGS]")
@click.option("--queue", default="default", show_default=True, help="the OJS queue")
@click.option("--kwargs", help="JSON object of keyword arguments (meta.kwargs)")
@click.option("--delay", type=float, help="seconds until the job is due")
@click.option("--priority", type=int)
@click.option("--max-attempts", type=int)
@connection_options
def enqueue(
    job_type: str,
    args: str | None,
    queue: str,
    kwargs: str | None,
    delay: float | None,
    priority: int | None,
    max_attempts: int | None,
    url: str | None,
    prefix: str,
) -> None:
    """Enqueue one job (ARGS: a JSON array) and print it as JSON."""
    options: dict[str, Any] = {"queue": queue}
    if kwargs:
        options["kwargs"] = json_arg(kwargs, dict, "--kwargs")
    if delay:
        options["scheduled_at"] = timedelta(seconds=delay)
    if priority is not None:
        options["priority"] = priority
    if max_attempts is not None:
        options["retry"] = {"max_attempts": max_attempts}
    positional = json_arg(args, list, "ARGS") or []
    with open_client(url, prefix) as client:
        job = client.enqueue(job_type, positional, **options)
    click.echo(job.to_json())


@click.command()
@click.argument("queue")
@click.option("--max-priority", type=int)
@click.option("--max-length", type=int)
@click.option("--overflow", type=click.Choice(["drop-head", "reject-publish", "reject-publish-dlx"]))
@click.option("--quorum", is_flag=True, help="a quorum queue")
@connection_options
def declare(
    queue: str,
    max_priority: int | None,
    max_length: int | None,
    overflow: str | None,
    quorum: bool,
    url: str | None,
    prefix: str,
) -> None:
    """Declare a job queue and its dead letter queue; print the AMQP queue name."""
    options: dict[str, Any] = {
        k: v
        for k, v in (
            ("max_priority", max_priority),
            ("max_length", max_length),
            ("overflow", overflow),
            ("queue_type", "quorum" if quorum else None),
        )
        if v is not None
    }
    with open_client(url, prefix) as client:
        click.echo(client.declare_queue(queue, **options))


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


@click.command()
@click.argument("target")
@click.option("--queues", help="comma-separated OJS queues to consume instead of the Worker's own")
@click.option("--concurrency", type=int, help="handler threads and prefetch (default: the Worker's)")
@click.option("--metrics-port", type=int, help="serve Prometheus metrics on this port (default: none)")
@click.option("--metrics-host", help="interface of the metrics endpoint (default: the Worker's, 127.0.0.1)")
@click.option("--log-level", type=click.Choice(_LOG_LEVELS, case_sensitive=False), default="INFO", show_default=True)
def worker(
    target: str,
    queues: str | None,
    concurrency: int | None,
    metrics_port: int | None,
    metrics_host: str | None,
    log_level: str,
) -> None:
    """Run the ojs_kombu.Worker at TARGET (module:attribute, attribute default: worker) until SIGTERM/SIGINT."""
    logging.getLogger().setLevel(log_level.upper())
    found = load_worker(target)
    names = [q.strip() for q in queues.split(",") if q.strip()] if queues is not None else None
    found.configure(queues=names, concurrency=concurrency, metrics_port=metrics_port, metrics_host=metrics_host)
    try:
        found.run()
    except KeyboardInterrupt:  # re-raised by Worker.run from a handler, after the graceful shutdown
        raise click.exceptions.Exit(130) from None
