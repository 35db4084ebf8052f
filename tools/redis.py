"""Provision a private Redis server for tests (Celery's Redis result backend: chords, canvases).

Two sources, tried in this order by :func:`provision_redis`:

1. ``OJS_REDIS_URL`` is set: use that server as is (nothing is started or stopped);
2. otherwise: a :class:`PrivateRedis`, a ``redis-server`` of our own started beside any other
   Redis on the machine: on 127.0.0.1, on a free port, with its own directory
   ``<base_dir>/<name>`` (default ``.cache/redis``), no persistence (``--save ''``,
   ``--appendonly no``) and ``--daemonize no``, so it is our child process.  Stopping it ends
   that process only, and deletes that directory only.

``redis-server`` comes from Debian's package, installed with ``apt-get`` when missing and we are
root (:func:`ensure_redis_installed`).  A system Redis that the package may run on port 6379 is
neither used nor touched.

Command line (``make setup`` runs ``install``)::

    python -m tools.redis install              # apt-get install redis-server if needed
    python -m tools.redis start [--dir D]      # prints the redis:// URL
    python -m tools.redis url   [--dir D]
    python -m tools.redis stop  [--dir D]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ojs_kombu.amqp.urls import redact
from ojs_kombu.testing._servers import ServerCommands, apt_install, free_ports, process_alive, tail

__all__ = [
    "PrivateRedis",
    "RedisServerError",
    "ensure_redis_installed",
    "ping",
    "provision_redis",
    "server_pid",
    "main",
]

log = logging.getLogger("tools.redis")  # not "__main__" under `python -m`

ENV_REDIS_URL = "OJS_REDIS_URL"
PACKAGE = "redis-server"
STATE_FILE = "redis.json"

_TOOL_DIRS = ("/usr/bin", "/usr/sbin", "/usr/local/bin")
_START_ATTEMPTS = 3  # a free port may be taken between choosing it and redis binding it
_POLL = 0.05


class RedisServerError(RuntimeError):
    """A Redis server could not be installed, started or stopped."""


def _server_binary() -> str | None:
    """Path of ``redis-server``, also found when a ``sbin`` directory is missing from ``PATH``."""
    found = shutil.which(PACKAGE)
    if found:
        return found
    candidates = (Path(directory, PACKAGE) for directory in _TOOL_DIRS)
    return next((str(c) for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


# -- installation ------------------------------------------------------------


def ensure_redis_installed() -> str:
    """Path of ``redis-server``; installs Debian's package with ``apt-get`` when missing and root.

    The package's system service is not started.  Raises :class:`RedisServerError` (saying
    what to do) when the server is missing and cannot be installed.
    """
    apt_install(
        PACKAGE,
        installed=lambda: _server_binary() is not None,
        error=RedisServerError,
        log=log,
        hint="Redis is not installed: install the `redis-server` package "
        f"(e.g. `sudo apt-get install redis-server`) or point {ENV_REDIS_URL} at a Redis server",
    )
    found = _server_binary()
    assert found
    return found


# -- talking to a server -----------------------------------------------------


def _request(host: str, port: int, *args: str, timeout: float = 1.0) -> bytes:
    """Send one command (RESP array) and return its raw reply: a line, or a bulk string's bytes."""
    command = b"".join(f"${len(a.encode())}\r\n{a}\r\n".encode() for a in args)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(f"*{len(args)}\r\n".encode() + command)
        reply = b""
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            reply += chunk
            head, sep, body = reply.partition(b"\r\n")
            if not sep:
                continue
            if not head.startswith(b"$"):
                return head
            if int(head[1:]) < 0 or len(body) >= int(head[1:]) + 2:
                return body[: max(0, int(head[1:]))]


def ping(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a Redis server on ``host:port`` answers ``PING`` with ``+PONG`` (raw RESP, no client)."""
    try:
        return _request(host, port, "PING", timeout=timeout) == b"+PONG"
    except OSError:
        return False


def server_pid(host: str, port: int, timeout: float = 1.0) -> int | None:
    """``process_id`` of the Redis server on ``host:port`` (``INFO server``), or ``None``."""
    try:
        info = _request(host, port, "INFO", "server", timeout=timeout)
    except OSError:
        return None
    for line in info.decode(errors="replace").splitlines():
        if line.startswith("process_id:"):
            return int(line.split(":", 1)[1])
    return None


# -- private server ----------------------------------------------------------


def _default_base_dir() -> Path:
    return Path.cwd() / ".cache" / "redis"


class PrivateRedis:
    """A ``redis-server`` of our own on 127.0.0.1, beside any other Redis on the machine.

    It listens on a free port, keeps its log and pid file in ``<base_dir>/<name>``
    (``base_dir`` defaults to ``<cwd>/.cache/redis``), persists nothing, and runs as a
    child process (``--daemonize no``, in its own session).  Use it as a context manager
    (start, then :meth:`cleanup`) or call :meth:`start` / :meth:`stop` / :meth:`cleanup`.
    :meth:`stop` ends only the process :meth:`start` launched.

    With ``die_with_parent`` (the default; the CLI's ``start`` turns it off) the server also
    gets SIGTERM when the process that started it dies without cleaning up (a test run
    killed by a CI timeout), through util-linux's ``setpriv --pdeathsig`` when available.
    Start it from a thread that lives as long as the server (the main thread): the kernel
    ties the signal to that thread.
    """

    host = "127.0.0.1"

    def __init__(
        self, base_dir: str | os.PathLike[str] | None = None, *, name: str | None = None, die_with_parent: bool = True
    ):
        self._server = ensure_redis_installed()
        self.die_with_parent = die_with_parent
        self.name = name or f"ojs-redis-{secrets.token_hex(4)}"
        self.dir = (Path(base_dir) if base_dir else _default_base_dir()).absolute() / self.name
        self.port = free_ports(1)[0]
        self.pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://`` URL of the server, database 0."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def log_file(self) -> Path:
        """The server's log (its standard output and error)."""
        return self.dir / "redis.log"

    def __repr__(self) -> str:
        return f"PrivateRedis({self.name!r}, port={self.port}, dir={str(self.dir)!r})"

    # -- state file (used by the CLI) -------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Everything needed to find this server again (see :meth:`from_dict`)."""
        return {"name": self.name, "port": self.port, "pid": self.pid, "dir": str(self.dir), "url": self.url}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> PrivateRedis:
        """The server described by ``state`` (from :meth:`to_dict`), without starting anything."""
        server = cls.__new__(cls)
        server._server = _server_binary() or PACKAGE
        server.die_with_parent = False
        server.name, server.port, server.pid = state["name"], state["port"], state["pid"]
        server.dir = Path(state["dir"])
        server._proc = None
        return server

    # -- lifecycle --------------------------------------------------------

    def __enter__(self) -> PrivateRedis:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cleanup()

    def is_running(self) -> bool:
        """Whether the process this object started (or recorded) is alive and is our server."""
        return self.pid is not None and process_alive(self.pid) and self._is_ours(self.pid)

    def start(self, timeout: float = 20) -> None:
        """Start the server (no-op if running) and wait until it answers ``PING``.

        Raises :class:`RedisServerError` with the tail of its log if it exits or does not
        answer within ``timeout`` seconds (what was started is stopped then).
        """
        if self.is_running():
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        for attempt in range(1, _START_ATTEMPTS + 1):
            self._launch()
            try:
                self._wait_until_ready(began + timeout)
                break
            except RedisServerError:
                self.stop()
                if attempt == _START_ATTEMPTS or not self._port_was_taken():
                    raise
                log.info("port %s was taken before redis-server bound it; trying another", self.port)
                self.port = free_ports(1)[0]
        log.info("Redis %s ready in %.2fs: %s (dir %s)", self.name, time.monotonic() - began, self.url, self.dir)

    def stop(self, timeout: float = 10) -> None:
        """Stop the server this object started (SIGTERM, then SIGKILL) and wait for it.  Idempotent."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    log.warning("redis-server %s did not stop in time; killing it", self.name)
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None
        elif self.is_running():  # recorded by the CLI: our pid, checked by command line
            assert self.pid is not None
            if not self._signal(signal.SIGTERM, time.monotonic() + timeout):
                self._signal(signal.SIGKILL, time.monotonic() + 5)
        self.pid = None

    def cleanup(self) -> None:
        """Stop the server and delete its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- internals --------------------------------------------------------

    def _command(self) -> list[str]:
        setpriv = shutil.which("setpriv") if self.die_with_parent else None
        # setpriv sets the parent-death signal, then execs redis-server (same pid).
        wrapper = [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []
        return [
            *wrapper,
            self._server,
            "--bind",
            self.host,
            "--port",
            str(self.port),
            "--protected-mode",
            "yes",
            "--dir",
            str(self.dir),
            "--pidfile",
            str(self.dir / "redis.pid"),
            "--logfile",
            "",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--supervised",
            "no",
        ]

    def _launch(self) -> None:
        with open(self.log_file, "ab") as out:
            self._proc = subprocess.Popen(
                self._command(),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # no terminal signals; outlives us when started from the CLI
            )
        self.pid = self._proc.pid

    def _wait_until_ready(self, deadline: float) -> None:
        # Ready when *our* process answers on the port: some other server may have taken the
        # port between choosing it and our bind (ours then exits with "Address already in use").
        assert self._proc is not None
        while True:
            code = self._proc.poll()
            if code is not None:
                raise self._startup_error(f"redis-server exited with code {code} during startup")
            if ping(self.host, self.port) and server_pid(self.host, self.port) == self._proc.pid:
                return
            if time.monotonic() >= deadline:
                raise self._startup_error("timed out waiting for PING")
            time.sleep(_POLL)

    def _port_was_taken(self) -> bool:
        text = tail(self.log_file, 5)
        return "Address already in use" in text

    def _is_ours(self, pid: int) -> bool:
        # Guards against a recorded pid that now belongs to an unrelated process.
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return not Path("/proc/self").exists()  # no procfs: trust the record
        return b"redis-server" in cmdline and f":{self.port}".encode() in cmdline

    def _signal(self, sig: signal.Signals, deadline: float) -> bool:
        assert self.pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)
        while process_alive(self.pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL)
        return True

    def _startup_error(self, reason: str) -> RedisServerError:
        return RedisServerError(
            f"Redis {self.name} on port {self.port} failed to start: {reason}\n"
            f"--- {self.log_file} (tail) ---\n{tail(self.log_file)}"
        )


# -- provisioning ------------------------------------------------------------


@contextlib.contextmanager
def provision_redis(base_dir: str | os.PathLike[str] | None = None) -> Iterator[str]:
    """Yield the URL of a running Redis server for the ``with`` block; stop what was started.

    ``$OJS_REDIS_URL`` when set (used as is: nothing is started, stopped or flushed),
    else a :class:`PrivateRedis` under ``base_dir``, deleted afterwards.
    """
    external = os.environ.get(ENV_REDIS_URL)
    if external:
        log.info("using the Redis server from %s: %s", ENV_REDIS_URL, redact(external))
        yield external
        return
    with PrivateRedis(base_dir) as server:
        yield server.url


# -- command line ------------------------------------------------------------


def _cmd_install(args: argparse.Namespace) -> int:
    if os.environ.get(ENV_REDIS_URL):
        log.info("%s is set: using that server, nothing to install", ENV_REDIS_URL)
    else:
        log.info("redis-server: %s", ensure_redis_installed())
    return 0


_COMMANDS = ServerCommands(
    prog="python -m tools.redis",
    what="Redis",
    state_file=STATE_FILE,
    default_dir=_default_base_dir,
    create=lambda directory, _args: PrivateRedis(directory, die_with_parent=False),
    load=PrivateRedis.from_dict,
    install=_cmd_install,
    install_help=f"install redis-server (apt) unless {ENV_REDIS_URL} names a server",
    error=RedisServerError,
    log=log,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m tools.redis``; returns the exit status."""
    return _COMMANDS.main(argv, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
