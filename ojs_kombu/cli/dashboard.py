"""``ojs-amqp dashboard``: serve the web dashboard (:mod:`ojs_kombu.dashboard`; needs the ``dashboard`` extra)."""

from __future__ import annotations

import click

from ojs_kombu.amqp.management import management_client
from ojs_kombu.cli.common import connection_options, open_client


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), default=8787, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="interface to bind (0.0.0.0: every one)")
@click.option("--read-only", is_flag=True, help="no actions: buttons hidden, every POST refused (403)")
@click.option(
    "--auth-token",
    envvar="OJS_DASHBOARD_TOKEN",
    help="required on every request: 'Authorization: Bearer TOKEN', or open /?token=TOKEN once "
    "(sets an HttpOnly cookie); default $OJS_DASHBOARD_TOKEN",
)
@click.option(
    "--management-url",
    envvar="OJS_MANAGEMENT_URL",
    help="management API root, for the queue list, retry queues and rates (default $OJS_MANAGEMENT_URL, "
    "else the broker URL's first host on port 15672 with its credentials)",
)
@click.option(
    "--refresh",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="seconds between the live updates of an open page (0: pages update only when reloaded)",
)
@connection_options
def dashboard(
    port: int,
    host: str,
    read_only: bool,
    auth_token: str | None,
    management_url: str | None,
    refresh: float,
    url: str | None,
    prefix: str,
) -> None:
    """Serve the web dashboard: queues, dead letters (replay, purge), workers (pause, resume), jobs,
    crons (enable, disable), limits and unique locks."""
    try:
        from ojs_kombu.dashboard.app import create_app
        from ojs_kombu.dashboard.server import DashboardServer
    except ImportError as exc:
        raise click.ClickException(
            f"the dashboard needs its extra: pip install 'ojs-amqp[dashboard]' ({exc})"
        ) from None
    with open_client(url, prefix) as client:
        app = create_app(
            client,
            management_client(management_url, client.url),
            read_only=read_only,
            token=auth_token or None,
            refresh=refresh,
        )
        click.echo(f"ojs-amqp dashboard on http://{host}:{port}/" + (" (read-only)" if read_only else ""), err=True)
        DashboardServer(app, host=host, port=port).run()
