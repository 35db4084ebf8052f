"""``ojs-amqp manifest``: print the OJS conformance manifest (:func:`~ojs_kombu.runtime.manifest.conformance_manifest`).

It connects to nothing: ``--unique-backend`` (a Redis URL, as ``Client(unique_backend=...)``) only
chooses the unique-jobs mechanism the manifest declares; its password is never printed.
"""

from __future__ import annotations

import json

import click

from ojs_kombu.cli.common import remember_secrets
from ojs_kombu.runtime.manifest import conformance_manifest


@click.command()
@click.option(
    "--unique-backend",
    metavar="URL",
    default=None,
    help="the deployment's unique_backend: a redis:// URL (default: the locks are RabbitMQ queues)",
)
def manifest(unique_backend: str | None) -> None:
    """Print the OJS conformance manifest of this implementation as JSON."""
    remember_secrets(unique_backend)
    click.echo(json.dumps(conformance_manifest(unique_backend), indent=2))
