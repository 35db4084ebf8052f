"""What every ``ojs-amqp`` command shares: the connection options, ``--json``, output, ``--since``, errors."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar
from urllib.parse import unquote, urlsplit

import click
from rich.console import Console
from rich.table import Table

from ojs_kombu.amqp.urls import redact as redact_text
from ojs_kombu.client import Client
from ojs_kombu.errors import ValidationError
from ojs_kombu.model.timefmt import parse_timestamp, utcnow

P = ParamSpec("P")
R = TypeVar("R")

#: Shown where a value is unknown (no management API, a missing queue).
MISSING = "–"

# Passwords met on the command line or in $OJS_AMQP_URL: never printed (see redact()).
_SECRETS: set[str] = set()


def remember_secrets(url: str | Sequence[str] | None) -> None:
    """Note the passwords of ``url`` (one URL, ``;``-separated URLs or a list) so :func:`redact` hides them."""
    urls = url if isinstance(url, list | tuple) else str(url or "").split(";")
    for one in urls:
        try:
            password = urlsplit(str(one).strip()).password
        except ValueError:
            continue
        if password:
            _SECRETS.update({password, unquote(password)})


def redact(text: str) -> str:
    """``text`` without URL passwords: ``user:secret@`` becomes ``user:***@``, and known passwords ``***``.

    The package's one masking (:func:`ojs_kombu.amqp.urls.redact`), with the passwords
    :func:`remember_secrets` noted.

    Parameters:
        text: any text bound for the terminal.

    Returns:
        The text, safe to print.
    """
    return redact_text(text, _SECRETS)


def error_line(exc: BaseException) -> str:
    """The one line ``ojs-amqp`` prints on stderr for an error: its type and message, redacted."""
    message = " ".join(str(exc).split())
    return redact(f"ojs-amqp: {type(exc).__name__}: {message}")


# -- options ---------------------------------------------------------------------------------------------


def connection_options(command: Callable[P, R]) -> Callable[P, R]:
    """Add ``--url`` and ``--prefix`` to a command (passed as ``url`` and ``prefix``)."""
    command = click.option("--prefix", default="", show_default=True, help="entity name prefix (multi-tenancy)")(
        command
    )
    return click.option("--url", envvar="OJS_AMQP_URL", help="broker URL (default $OJS_AMQP_URL)")(command)


def json_option(command: Callable[P, R]) -> Callable[P, R]:
    """Add ``--json``: one JSON document per line instead of a table (passed as ``as_json``)."""
    return click.option("--json", "as_json", is_flag=True, help="one JSON document per line, for scripts")(command)


@contextmanager
def open_client(url: str | None, prefix: str) -> Iterator[Client]:
    """A :class:`Client` for a command, closed when it ends; its URL's password is remembered for :func:`redact`.

    Raises:
        ValidationError: the URL cannot be parsed (kombu raises ValueError or KeyError for it).
    """
    remember_secrets(url)
    try:
        client = Client(url, prefix=prefix)
    except (ValueError, KeyError) as exc:
        if isinstance(exc, ValidationError):
            raise
        raise ValidationError(f"bad broker URL: {exc}", field="url") from None
    with client:
        remember_secrets(client.url)
        yield client


_SINCE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(s|m|h|d)$")
_SINCE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def since_arg(text: str) -> datetime | timedelta:
    """``--since``: how long ago (``90s``, ``10m``, ``1h``, ``2d``) or an RFC 3339 timestamp.

    Parameters:
        text: the option's value.

    Returns:
        A timedelta (how long ago) or an aware datetime.

    Raises:
        click.BadParameter: neither (a usage error: exit status 2).
    """
    match = _SINCE.fullmatch(text.strip())
    if match:
        return timedelta(**{_SINCE_UNITS[match[2]]: float(match[1])})
    try:
        return parse_timestamp(text.strip())
    except ValidationError:
        raise click.BadParameter(
            f"{text!r} is neither a duration (30s, 10m, 1h, 2d) nor an RFC 3339 timestamp"
        ) from None


def since_datetime(value: datetime | timedelta) -> datetime:
    """The moment a ``--since`` value names (a duration counts back from now)."""
    return utcnow() - value if isinstance(value, timedelta) else value


if TYPE_CHECKING:  # ParamType is generic in recent click only: subscript it for the type checker alone
    _SinceBase = click.ParamType[datetime | timedelta, Any]
else:
    _SinceBase = click.ParamType


class Since(_SinceBase):
    """The click type of ``--since`` (see :func:`since_arg`)."""

    name = "since"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime | timedelta:
        """Parse ``value`` with :func:`since_arg` (a value already parsed passes through)."""
        if isinstance(value, datetime | timedelta):
            return value
        try:
            return since_arg(str(value))
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


def json_arg(text: str | None, kind: type, what: str) -> Any:
    """Parse a JSON command-line argument that must be a ``kind`` (list, dict).

    Raises:
        click.BadParameter: not JSON, or not a ``kind``.
    """
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=what) from None
    if not isinstance(value, kind):
        raise click.BadParameter(f"must be a JSON {kind.__name__}", param_hint=what)
    return value


# -- output ----------------------------------------------------------------------------------------------


def console(*, stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr); wide when it is not a terminal, so ids are never cut."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 200
    return Console(file=stream, width=width, highlight=False)


def print_json_lines(documents: Iterable[dict[str, Any]]) -> None:
    """Print each document as one JSON line (``--json``); values JSON lacks (datetimes) become strings."""
    for document in documents:
        click.echo(json.dumps(document, ensure_ascii=False, default=str))


def cell(value: Any, fmt: str = "{}") -> str:
    """A table cell: ``value`` formatted, or :data:`MISSING` when it is unknown."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    return fmt.format(value)


#: Columns of counts and rates: right-aligned.
NUMERIC_COLUMNS = frozenset(
    ("ready", "unacked", "consumers", "retrying", "dead", "attempt", "busy", "publish/s", "deliver/s", "ack/s")
)


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, caption: str = "") -> Table:
    """A rich table of ``rows`` (cells redacted); :data:`NUMERIC_COLUMNS` are right-aligned."""
    result = Table(title=title, caption=caption or None, show_lines=False, header_style="bold")
    for name in columns:
        result.add_column(name, justify="right" if name in NUMERIC_COLUMNS else "left")
    for row in rows:
        result.add_row(*(redact(str(value)) for value in row))
    return result


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, caption: str = "") -> None:
    """Print :func:`table` on stdout."""
    console().print(table(title, columns, rows, caption=caption))


__all__ = [
    "MISSING",
    "Since",
    "cell",
    "connection_options",
    "console",
    "error_line",
    "json_arg",
    "json_option",
    "open_client",
    "print_json_lines",
    "print_table",
    "redact",
    "remember_secrets",
    "since_arg",
    "since_datetime",
    "table",
]
