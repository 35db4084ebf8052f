"""What the private test servers share: :mod:`.broker`'s RabbitMQ node, :mod:`.cluster`, and the
repository's own ``tools.redis`` (which also uses :func:`apt_install`, as ``tools.java`` and
``tools.browser`` do).

* process and port helpers (:func:`free_ports`, :func:`process_alive`, :func:`tail`);
* installing a Debian package with ``apt-get`` without starting its system service
  (:func:`apt_install`);
* the command line around a server recorded in a JSON state file: ``start`` / ``stop`` /
  ``url`` / ``install`` (:class:`ServerCommands`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

_POLICY_RC_D = Path("/usr/sbin/policy-rc.d")


class BrokerError(RuntimeError):
    """A broker could not be installed, started or stopped."""


_POLICY_MARK = "# written by ojs_kombu.testing while apt-get runs"


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file, or why it cannot be read."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror})"


# -- installation ------------------------------------------------------------


@contextlib.contextmanager
def _services_not_started() -> Iterator[None]:
    """While the block runs, tell Debian's maintainer scripts not to start services.

    An existing ``/usr/sbin/policy-rc.d`` is left as it is (container images ship one that
    already forbids starting services); otherwise a temporary one answering 101 ("action
    forbidden") is written and removed afterwards, if it is still ours.  A package's system
    service (a broker on 5672, a Redis on 6379) is not ours to start.
    """
    if _POLICY_RC_D.exists():
        yield
        return
    _POLICY_RC_D.write_text(f"#!/bin/sh\n{_POLICY_MARK}\nexit 101\n")
    _POLICY_RC_D.chmod(0o755)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if _POLICY_MARK in _POLICY_RC_D.read_text():
                _POLICY_RC_D.unlink()


def _apt_get(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(["apt-get", *args], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)


def apt_install(
    package: str, *, installed: Callable[[], bool], error: type[Exception], hint: str, log: logging.Logger
) -> None:
    """Install Debian's ``package`` unless ``installed()``; raise ``error`` when that cannot be done.

    Needs root and ``apt-get``; otherwise ``error(hint)``.  The package lists are refreshed
    only when a first install fails (stale or missing lists).
    """
    if installed():
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise error(hint)
    log.info("%s not found; installing it with apt-get", package)
    began = time.monotonic()
    with _services_not_started():
        done = _apt_get("install", "-y", "--no-install-recommends", package)
        if done.returncode != 0:
            _apt_get("update")
            done = _apt_get("install", "-y", "--no-install-recommends", package)
    if done.returncode != 0:
        output = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise error(f"`apt-get install {package}` failed with exit code {done.returncode}:\n{output}")
    if not installed():
        raise error(f"apt-get installed {package} but its programs are still not found")
    log.info("installed %s in %.1fs", package, time.monotonic() - began)


# -- command line ------------------------------------------------------------


class RecordedServer(Protocol):
    """A private server the command line can start, find again and stop."""

    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str: ...

    def start(self) -> None: ...

    def is_running(self) -> bool: ...

    def cleanup(self) -> None: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ServerCommands:
    """``python -m <module> install|start|stop|url [--dir D]`` for a recorded server.

    ``start`` records the server in ``<dir>/<state_file>`` and prints its URL; ``url`` prints
    it again; ``stop`` stops what the record names and deletes its files; ``install`` runs
    ``install``.  ``extra`` adds commands: name -> (help, handler, configure the parser);
    ``options`` adds options to a command's parser, given the command's name and parser.
    """

    prog: str
    what: str  # "RabbitMQ node", "Redis": for messages
    state_file: str
    default_dir: Callable[[], Path]
    create: Callable[[Path, argparse.Namespace], RecordedServer]  # a new server under a directory (not started)
    load: Callable[[dict[str, Any]], RecordedServer]  # the server a record describes
    install: Callable[[argparse.Namespace], int]
    install_help: str
    error: type[Exception]
    log: logging.Logger
    extra: dict[str, tuple[str, Callable[[argparse.Namespace], int], Callable[[argparse.ArgumentParser], None]]] = (
        field(default_factory=dict)
    )
    options: Callable[[str, argparse.ArgumentParser], None] = lambda _name, _parser: None

    def state_path(self, directory: str | None) -> Path:
        """Where the record of the server under ``directory`` (default: the default dir) lives."""
        return (Path(directory) if directory else self.default_dir()).absolute() / self.state_file

    def recorded(self, state_path: Path) -> RecordedServer | None:
        """The server recorded in ``state_path``, if any (running or not)."""
        try:
            return self.load(json.loads(state_path.read_text()))
        except FileNotFoundError:
            return None

    def start(self, args: argparse.Namespace) -> int:
        """Start a server (unless the recorded one runs), record it, print its URL."""
        state_path = self.state_path(args.dir)
        server = self.recorded(state_path)
        if server is not None and server.is_running():
            self.log.info("%s %s recorded in %s is already running", self.what, server.name, state_path)
        else:
            server = self.create(state_path.parent, args)
            server.start()
            state_path.parent.mkdir(parents=True, exist_ok=True)
            state_path.write_text(json.dumps(server.to_dict(), indent=2) + "\n")
        print(server.url)
        return 0

    def stop(self, args: argparse.Namespace) -> int:
        """Stop the recorded server, delete its files and the record."""
        state_path = self.state_path(args.dir)
        server = self.recorded(state_path)
        if server is None:
            self.log.info("no %s recorded in %s; nothing to stop", self.what, state_path)
            return 0
        server.cleanup()
        state_path.unlink(missing_ok=True)
        self.log.info("stopped and removed %s %s", self.what, server.name)
        return 0

    def url(self, args: argparse.Namespace) -> int:
        """Print the recorded server's URL; exit 1 when none runs."""
        state_path = self.state_path(args.dir)
        server = self.recorded(state_path)
        if server is None or not server.is_running():
            self.log.error("no running %s recorded in %s (run `start` first)", self.what, state_path)
            return 1
        print(server.url)
        return 0

    def main(self, argv: Sequence[str] | None, description: str) -> int:
        """Parse ``argv``, run the command, return the exit status (1 on ``error``)."""
        parser = argparse.ArgumentParser(prog=self.prog, description=description)
        sub = parser.add_subparsers(dest="action", required=True)
        commands: dict[
            str, tuple[str, Callable[[argparse.Namespace], int], Callable[[argparse.ArgumentParser], None]]
        ] = {
            "install": (self.install_help, self.install, lambda p: None),
            "start": (f"start a private {self.what} in the background; print its URL", self.start, lambda p: None),
            "stop": (
                f"stop the {self.what} recorded in {self.state_file} and delete its files",
                self.stop,
                lambda p: None,
            ),
            "url": (f"print the URL of the {self.what} recorded in {self.state_file}", self.url, lambda p: None),
            **self.extra,
        }
        for name, (help_text, _handler, configure) in commands.items():
            command = sub.add_parser(name, help=help_text)
            command.add_argument(
                "--dir", help=f"directory for the server's files and {self.state_file} (default: {self.default_dir()})"
            )
            self.options(name, command)
            configure(command)
        args = parser.parse_args(argv)
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
        try:
            return commands[args.action][1](args)
        except self.error as exc:
            self.log.error("%s", exc)
            return 1
        except KeyboardInterrupt:
            return 130


__all__ = ["BrokerError", "RecordedServer", "ServerCommands", "apt_install", "free_ports", "process_alive", "tail"]
