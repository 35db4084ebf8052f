"""Provision a real RabbitMQ broker for tests and demos.

Three sources, tried in this order by :func:`provision_broker`:

1. ``OJS_AMQP_URL`` is set: use that broker as is (nothing is started or stopped);
2. a Docker engine answers: a throw-away ``rabbitmq:<release>-management`` container (testcontainers);
3. otherwise: a :class:`PrivateNode`, a RabbitMQ node of our own beside any other broker on the
   machine, run from a cached Debian chroot (4.3, the default, and 4.0) or from the host's
   ``rabbitmq-server`` package (3.10) — see :mod:`.releases`.  Every name, port and directory
   of a private node is its own (node name ``ojs-<random>@localhost``, AMQP, distribution,
   management and epmd ports on 127.0.0.1, data under ``.cache/rabbitmq``), and every
   ``rabbitmqctl`` call names it with ``-n``, so no other node is ever touched.

Command line (``make demo`` / ``make test`` use ``run``)::

    python -m ojs_kombu.testing.broker install [--rabbitmq 4.3 ...]   # build / install releases
    python -m ojs_kombu.testing.broker start [--rabbitmq 4.3] [--dir D]  # prints the AMQP URL
    python -m ojs_kombu.testing.broker url   [--dir D]
    python -m ojs_kombu.testing.broker stop  [--dir D]
    python -m ojs_kombu.testing.broker run   [--rabbitmq 4.3] [--dir D] -- CMD ...

The release defaults to ``$OJS_RABBITMQ``, else 4.3.  ``run`` exports ``OJS_AMQP_URL``,
``OJS_MANAGEMENT_URL``, ``OJS_MANAGEMENT_USER`` and ``OJS_MANAGEMENT_PASSWORD`` to ``CMD``, records
the node so that ``url`` finds it meanwhile, and exits with ``CMD``'s status.
"""

from __future__ import annotations

import argparse
import contextlib
import grp
import json
import logging
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from ojs_kombu.amqp.management import ManagementClient, ManagementError
from ojs_kombu.amqp.urls import redact

from ._servers import BrokerError, ServerCommands, apt_install, free_ports, process_alive, tail
from .certs import TestPki, make_test_pki
from .releases import ENV_RABBITMQ, RELEASES, Chroot, Release, chroot_for, release

__all__ = [
    "BrokerError",
    "BrokerHandle",
    "PrivateNode",
    "ensure_rabbitmq_installed",
    "mask_url",
    "provision_broker",
    "main",
]

log = logging.getLogger("ojs_kombu.testing.broker")  # not "__main__" under `python -m`

ENV_AMQP_URL = "OJS_AMQP_URL"
ENV_MANAGEMENT_URL = "OJS_MANAGEMENT_URL"
ENV_MANAGEMENT_USER = "OJS_MANAGEMENT_USER"
ENV_MANAGEMENT_PASSWORD = "OJS_MANAGEMENT_PASSWORD"
GUEST = "guest"
STATE_FILE = "node.json"

_RABBITMQ_USER = "rabbitmq"
_DEBIAN_WRAPPER = "rabbitmq-script-wrapper"
_DEBIAN_TOOLS_DIR = Path("/usr/lib/rabbitmq/bin")
_TOOL_DIRS = ("/usr/sbin", "/usr/local/sbin", str(_DEBIAN_TOOLS_DIR))
_POLL = 0.2


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, for log lines (:func:`ojs_kombu.amqp.urls.redact`).

    Parameters:
        url: a broker URL (or a ``;``-separated failover list).

    Returns:
        The URL, safe to log.
    """
    return redact(url)


def _which(tool: str) -> str | None:
    # /usr/sbin is often missing from a non-root PATH.
    found = shutil.which(tool)
    if found:
        return found
    for directory in _TOOL_DIRS:
        candidate = Path(directory, tool)
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


# -- installation ------------------------------------------------------------


def ensure_rabbitmq_installed(rabbitmq: str | None = None) -> None:
    """Make sure the programs of RabbitMQ ``rabbitmq`` (default: ``$OJS_RABBITMQ``, else 4.3) are there.

    A chroot release (4.3, 4.0) is built into the cache unless it is there already
    (:mod:`.releases`); the host's package (3.10) is installed with apt when root, without
    starting its system service.

    Raises:
        BrokerError: they are missing and cannot be installed (saying what to install).
    """
    chosen = release(rabbitmq)
    if chosen.in_chroot:
        chroot_for(chosen)
        return
    _ensure_host_package()


def _ensure_host_package() -> None:
    apt_install(
        "rabbitmq-server",
        installed=lambda: bool(_which("rabbitmq-server") and _which("rabbitmqctl")),
        error=BrokerError,
        log=log,
        hint="RabbitMQ is not installed: install the `rabbitmq-server` package "
        "(e.g. `sudo apt-get install rabbitmq-server`), start a Docker engine, "
        f"or point {ENV_AMQP_URL} at an existing broker",
    )


@dataclass(frozen=True)
class _Tools:
    """How to run the RabbitMQ scripts of one release, and as whom the node runs."""

    release: Release
    server: list[str]
    ctl: list[str]
    epmd: list[str] | None
    # (uid, gid, user name) the node runs as when that is not us; its files must belong to it.
    owner: tuple[int, int, str] | None
    # Where a chroot release's programs live; None for the host's package.
    chroot: Chroot | None = None


# Inside a chroot: its own programs, and the home (Erlang cookie) of its `rabbitmq` user.
_CHROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/var/lib/rabbitmq"}
_CHROOT_BIN = "/usr/lib/rabbitmq/bin"


def _tools(chosen: Release) -> _Tools:
    if chosen.in_chroot:
        chroot = chroot_for(chosen)
        uid, gid = chroot.user(_RABBITMQ_USER)
        return _Tools(
            release=chosen,
            server=chroot.command(f"{_CHROOT_BIN}/rabbitmq-server", uid, gid),
            ctl=chroot.command(f"{_CHROOT_BIN}/rabbitmqctl", uid, gid),
            epmd=chroot.command("/usr/bin/epmd", uid, gid),
            owner=(uid, gid, _RABBITMQ_USER),
            chroot=chroot,
        )
    _ensure_host_package()
    server, ctl = _which("rabbitmq-server"), _which("rabbitmqctl")
    assert server and ctl
    epmd = _which("epmd") or next((str(p) for p in Path("/usr/lib/erlang/bin").glob("epmd")), None)
    owner = None
    if Path(server).resolve().name == _DEBIAN_WRAPPER:
        if os.geteuid() == 0:
            # Debian's wrapper runs every tool as `rabbitmq` (su, HOME=/var/lib/rabbitmq), so the
            # node and rabbitmqctl share that user's Erlang cookie.
            entry = pwd.getpwnam(_RABBITMQ_USER)
            owner = (entry.pw_uid, entry.pw_gid, _RABBITMQ_USER)
        else:
            # The wrapper refuses other users; the scripts it wraps run as anyone, with $HOME's cookie.
            server, ctl = str(_DEBIAN_TOOLS_DIR / "rabbitmq-server"), str(_DEBIAN_TOOLS_DIR / "rabbitmqctl")
    return _Tools(release=chosen, server=[server], ctl=[ctl], epmd=[epmd] if epmd else None, owner=owner)


# -- private node ------------------------------------------------------------


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _traversable(path: Path, uid: int, gid: int, user: str) -> bool:
    """Whether ``user`` may enter ``path`` and every parent of it."""
    groups = {gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    for directory in (path, *path.parents):
        st = directory.stat()
        if st.st_uid == uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


def _default_base_dir() -> Path:
    return Path.cwd() / ".cache" / "rabbitmq"


class PrivateNode:
    """A RabbitMQ node of our own, beside any other broker on the machine.

    Everything it uses is its own: node name, AMQP / distribution /
    management / epmd ports (free ports on 127.0.0.1, kept across
    :meth:`restart`) and a directory ``<base_dir>/<short node name>`` holding
    the data (mnesia), logs, pid file, config and enabled-plugins files.
    ``base_dir`` defaults to ``<cwd>/.cache/rabbitmq``; when the node runs as
    the ``rabbitmq`` user (Debian's wrapper, called as root) and cannot enter
    ``base_dir``, a directory under the system temp dir is used instead.

    Use it as a context manager (start, then :meth:`cleanup`) or call
    :meth:`start` / :meth:`stop` / :meth:`restart` / :meth:`cleanup`.
    The user is ``guest``/``guest`` on vhost ``/``.

    Parameters:
        base_dir: parent of the node's directory.
        node_name: the node name (default ``ojs-<random>@localhost``).
        epmd_port: the epmd port; nodes of one cluster (:mod:`.cluster`) share one.
        cookie: the Erlang cookie of the node and of ``rabbitmqctl``; nodes of one cluster
            share one.  Default: the running user's ``~/.erlang.cookie``.
        tls: also listen for AMQP over TLS (see below).
        require_client_cert: refuse a TLS client without a certificate signed by the test CA.
        rabbitmq: the release to run (``"4.3"``, ``"4.0"``, ``"3.10"``; default
            ``$OJS_RABBITMQ``, else 4.3).  A chroot release keeps the node's files inside its
            chroot, at ``<chroot>/<base_dir>/<short node name>`` (:mod:`.releases`).

    Raises:
        BrokerError: the release is unknown, or its programs are missing and cannot be installed.

    With ``tls=True`` the node also listens for AMQP over TLS on ``tls_port``
    (127.0.0.1, and 127.0.0.2 so that a host name missing from the certificate
    can be tried), with a throw-away CA and a server certificate for
    ``localhost`` / ``127.0.0.1`` made in ``<dir>/tls`` (see
    :mod:`ojs_kombu.testing.certs`): :attr:`tls_url`, :attr:`pki` (the CA,
    and a client certificate).  ``require_client_cert=True`` makes the node
    refuse a TLS client without a certificate signed by that CA.
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        node_name: str | None = None,
        epmd_port: int | None = None,
        cookie: str | None = None,
        tls: bool = False,
        require_client_cert: bool = False,
        rabbitmq: str | None = None,
    ):
        self._tools = _tools(release(rabbitmq))
        self.node_name = node_name or f"ojs-{secrets.token_hex(4)}@localhost"
        self.amqp_port, self.dist_port, self.management_port, own_epmd_port, self.tls_port = free_ports(5)
        self.epmd_port = epmd_port or own_epmd_port
        self.cookie = cookie
        self.tls = tls
        self.require_client_cert = require_client_cert
        self.dir = self._node_base_dir(Path(base_dir) if base_dir else _default_base_dir()) / self.short_name
        self._proc: subprocess.Popen[bytes] | None = None

    # -- identity ---------------------------------------------------------

    @property
    def name(self) -> str:
        """The node name (``ojs-…@localhost``)."""
        return self.node_name

    @property
    def short_name(self) -> str:
        """The node name without ``@host``; also the name of its directory."""
        return self.node_name.split("@", 1)[0]

    @property
    def release(self) -> str:
        """The RabbitMQ release this node runs (``"4.3"``, ``"4.0"``, ``"3.10"``)."""
        return self._tools.release.name

    @property
    def url(self) -> str:
        """AMQP URL of the node (user ``guest``, vhost ``/``)."""
        return f"amqp://{GUEST}:{GUEST}@127.0.0.1:{self.amqp_port}//"

    @property
    def tls_url(self) -> str:
        """AMQP-over-TLS URL of the node (``amqps://…@localhost:<tls_port>//``; needs ``tls=True``)."""
        if not self.tls:
            raise BrokerError(f"{self.node_name} was not started with tls=True")
        return f"amqps://{GUEST}:{GUEST}@localhost:{self.tls_port}//"

    @property
    def pki(self) -> TestPki:
        """The node's test CA, server and client certificates (made by :meth:`start` with ``tls=True``)."""
        return TestPki.in_dir(self.dir / "tls")

    @property
    def management_url(self) -> str:
        """Root URL of the node's management HTTP API."""
        return f"http://127.0.0.1:{self.management_port}"

    @property
    def log_file(self) -> Path:
        """The node's main log file."""
        return self.dir / "log" / f"{self.node_name}.log"

    @property
    def startup_log(self) -> Path:
        """Standard output/error of ``rabbitmq-server`` (early boot errors land here)."""
        return self.dir / "startup.log"

    @property
    def pid_file(self) -> Path:
        """Pid file written by the node (pid of its Erlang VM)."""
        return self.dir / "node.pid"

    def management(self) -> ManagementClient:
        """A :class:`ManagementClient` for this node."""
        return ManagementClient(self.management_url, GUEST, GUEST)

    def __repr__(self) -> str:
        return f"PrivateNode({self.node_name!r}, amqp_port={self.amqp_port}, dir={str(self.dir)!r})"

    # -- state file (used by the CLI) -------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Everything needed to find this node again (see :meth:`from_dict`)."""
        return {
            "node_name": self.node_name,
            "rabbitmq": self.release,
            "amqp_port": self.amqp_port,
            "dist_port": self.dist_port,
            "management_port": self.management_port,
            "epmd_port": self.epmd_port,
            "cookie": self.cookie,
            "tls_port": self.tls_port,
            "tls": self.tls,
            "require_client_cert": self.require_client_cert,
            "dir": str(self.dir),
            "url": self.url,
            "management_url": self.management_url,
            "log_file": str(self.log_file),
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> PrivateNode:
        """The node described by ``state`` (from :meth:`to_dict`), without starting anything."""
        node = cls.__new__(cls)
        node._tools = _tools(release(state.get("rabbitmq", "3.10")))  # records older than releases: the host's
        node.node_name = state["node_name"]
        node.amqp_port = state["amqp_port"]
        node.dist_port = state["dist_port"]
        node.management_port = state["management_port"]
        node.epmd_port = state["epmd_port"]
        node.cookie = state.get("cookie")
        node.tls_port = state.get("tls_port", 0)
        node.tls = state.get("tls", False)
        node.require_client_cert = state.get("require_client_cert", False)
        node.dir = Path(state["dir"])
        node._proc = None
        return node

    # -- lifecycle --------------------------------------------------------

    def __enter__(self) -> PrivateNode:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cleanup()

    def is_running(self) -> bool:
        """Whether this node's Erlang VM is alive."""
        return self._pid() is not None

    def start(self, timeout: float = 90) -> None:
        """Start the node (no-op if running) and wait until it serves AMQP and the management API.

        Ready means: the AMQP port accepts a TCP connection, ``GET
        /api/overview`` answers, and ``rabbitmqctl -n <node> await_startup``
        succeeds.  Raises :class:`BrokerError` with the tail of the node's
        logs if it fails or ``timeout`` seconds pass (the node is stopped then).
        """
        if self.is_running():
            return
        began = time.monotonic()
        deadline = began + timeout
        self._prepare_dir()
        with open(self.startup_log, "ab") as out:
            self._proc = subprocess.Popen(
                self._tools.server,
                env=self._env(),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # no terminal signals; outlives us when started from the CLI
            )
        try:
            self._wait_until_ready(deadline)
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop(timeout=30)
            raise
        log.info(
            "RabbitMQ node %s ready in %.1fs: %s (management %s, dir %s)",
            self.node_name,
            time.monotonic() - began,
            mask_url(self.url),
            self.management_url,
            self.dir,
        )

    def stop(self, timeout: float = 60) -> None:
        """Stop the node with ``rabbitmqctl -n <node> stop`` and wait until it has exited.

        Idempotent.  Data stays on disk (see :meth:`cleanup`).  If the node
        does not stop in time, its own VM (checked by pid file and
        environment) is terminated.
        """
        deadline = time.monotonic() + timeout
        pid = self._pid()
        if pid is not None:
            log.info("stopping RabbitMQ node %s", self.node_name)
            done = self._ctl("stop", timeout=max(5.0, deadline - time.monotonic()))
            if done is not None and done.returncode != 0:
                log.warning("rabbitmqctl stop failed for %s: %s", self.node_name, (done.stdout + done.stderr).strip())
            if not self._wait_for_exit(pid, deadline):
                log.warning("node %s did not stop in time; terminating its VM (pid %s)", self.node_name, pid)
                if not self._signal(pid, signal.SIGTERM, time.monotonic() + 10):
                    self._signal(pid, signal.SIGKILL, time.monotonic() + 5)
        if self._proc is not None:
            if pid is None and self._proc.poll() is None:
                # Stopped while booting, before the VM wrote its pid file: end what we launched
                # (its own session: su, the start script and the VM).
                self._kill_session(signal.SIGTERM)
            try:
                self._proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill_session(signal.SIGKILL)
                self._proc.wait()
            self._proc = None
        self._stop_epmd()

    def kill(self, timeout: float = 30) -> None:
        """SIGKILL the node's Erlang VM (a crash: no clean shutdown) and wait until it is gone.

        Data stays on disk; :meth:`start` brings the node back.  No-op when it is not running.

        Parameters:
            timeout: seconds to wait for the VM (and what launched it) to exit.

        Raises:
            BrokerError: the VM is still alive after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        pid = self._pid()
        if pid is not None and not self._signal(pid, signal.SIGKILL, deadline):
            raise BrokerError(f"RabbitMQ node {self.node_name} (pid {pid}) survived SIGKILL for {timeout}s")
        if self._proc is not None:
            self._kill_session(signal.SIGKILL)  # the start script (and su) around the VM
            self._proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            self._proc = None

    def ctl(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str] | None:
        """Run ``rabbitmqctl -n <this node> args...`` with this node's environment (epmd, cookie).

        Parameters:
            args: the rabbitmqctl command and its arguments, e.g. ``("cluster_status",)``.
            timeout: seconds before giving up.

        Returns:
            The finished process (text output captured), or ``None`` if it timed out.
        """
        return self._ctl(*args, timeout=timeout)

    def restart(self, timeout: float = 90) -> None:
        """Stop then start the node with the same name, ports and data (durable state survives)."""
        self.stop()
        self.start(timeout=timeout)

    def cleanup(self) -> None:
        """Stop the node and delete its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- internals --------------------------------------------------------

    def _node_base_dir(self, base: Path) -> Path:
        base = base.absolute()
        chroot = self._tools.chroot
        if chroot is not None:
            # The node sees only its chroot: its files live there, under the same path.
            inside = chroot.host_path(base)
            inside.mkdir(parents=True, exist_ok=True)
            return inside
        base.mkdir(parents=True, exist_ok=True)
        owner = self._tools.owner
        if owner is None or _traversable(base, *owner):
            return base
        fallback = Path(tempfile.gettempdir()) / "ojs-rabbitmq"
        fallback.mkdir(mode=0o755, exist_ok=True)
        log.warning("user %s cannot enter %s; keeping RabbitMQ node data under %s", owner[2], base, fallback)
        return fallback

    def _prepare_dir(self) -> None:
        (self.dir / "mnesia").mkdir(parents=True, exist_ok=True)
        (self.dir / "log").mkdir(exist_ok=True)
        (self.dir / "enabled_plugins").write_text("[rabbitmq_management].\n")
        (self.dir / "rabbitmq-env.conf").write_text("# empty: keeps /etc/rabbitmq/rabbitmq-env.conf out\n")
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.amqp_port}\n"
            "management.tcp.ip = 127.0.0.1\n"
            f"management.tcp.port = {self.management_port}\n"
            "loopback_users = none\n"
            "log.console = false\n"
            "log.file.level = info\n"
            # Management counters (queue lengths ...) are sampled every 5 s by default; sample
            # every second so tests wait less.  All three policies must be set together.
            "collect_statistics_interval = 1000\n"
            "management.sample_retention_policies.global.minute = 1\n"
            "management.sample_retention_policies.global.hour = 60\n"
            "management.sample_retention_policies.basic.minute = 1\n"
            "management.sample_retention_policies.basic.hour = 60\n"
            "management.sample_retention_policies.detailed.10 = 1\n" + self._tls_config()
        )
        self.startup_log.touch()
        if self._tools.owner is not None:
            uid, gid, _ = self._tools.owner
            for path in (self.dir, *self.dir.rglob("*")):
                os.chown(path, uid, gid, follow_symlinks=False)

    def _tls_config(self) -> str:
        """The rabbitmq.conf lines of the TLS listener (making the certificates once), or ``""``."""
        if not self.tls:
            return ""
        pki = self.pki
        if not pki.server_cert.exists():
            pki = make_test_pki(self.dir / "tls")
        return (
            f"listeners.ssl.default = 127.0.0.1:{self.tls_port}\n"
            f"listeners.ssl.other = 127.0.0.2:{self.tls_port}\n"
            f"ssl_options.cacertfile = {self._seen(pki.ca_cert)}\n"
            f"ssl_options.certfile = {self._seen(pki.server_cert)}\n"
            f"ssl_options.keyfile = {self._seen(pki.server_key)}\n"
            "ssl_options.verify = verify_peer\n"
            f"ssl_options.fail_if_no_peer_cert = {str(self.require_client_cert).lower()}\n"
        )

    def _seen(self, path: Path) -> Path:
        """``path`` (on the host) as the node sees it: inside its chroot, if it runs in one."""
        chroot = self._tools.chroot
        return path if chroot is None else chroot.inner_path(path)

    def _env(self) -> dict[str, str]:
        # Inherited RABBITMQ_* / ERL_EPMD_* settings would point at some other node.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_EPMD_"))}
        if self._tools.chroot is not None:
            env.update(_CHROOT_ENV)
        cookie_args = f" -setcookie {self.cookie}" if self.cookie else ""
        if self.cookie:
            env["RABBITMQ_CTL_ERL_ARGS"] = cookie_args.strip()  # rabbitmqctl must present the same cookie
        env.update(
            RABBITMQ_NODENAME=self.node_name,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.amqp_port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(self._seen(self.dir / "mnesia")),
            RABBITMQ_LOG_BASE=str(self._seen(self.dir / "log")),
            RABBITMQ_PID_FILE=str(self._seen(self.pid_file)),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self._seen(self.dir / "enabled_plugins")),
            RABBITMQ_CONFIG_FILE=str(self._seen(self.dir / "rabbitmq")),  # without ".conf"
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self._seen(self.dir / "advanced.config")),  # absent on purpose
            RABBITMQ_CONF_ENV_FILE=str(self._seen(self.dir / "rabbitmq-env.conf")),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" + cookie_args,
            # A private epmd: the node is registered nowhere else, and stopping it leaves nothing behind.
            ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        return env

    def _ctl(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str] | None:
        """``rabbitmqctl -n <node> args...``; ``None`` if it timed out."""
        try:
            return subprocess.run(
                [*self._tools.ctl, "-n", self.node_name, *args],
                env=self._env(),
                cwd=self.dir if self.dir.is_dir() else None,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return None

    def _pid(self) -> int | None:
        """Pid of this node's live VM, from its pid file, or ``None``."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if not process_alive(pid) or not self._is_our_vm(pid):
            return None
        return pid

    def _is_our_vm(self, pid: int) -> bool:
        # Guards against a stale pid file whose pid now belongs to an unrelated process.
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return not Path("/proc/self").exists()  # no procfs: trust the pid file
        return f"RABBITMQ_NODENAME={self.node_name}".encode() in environ or (
            b"-epmd_port" in cmdline and str(self.epmd_port).encode() in cmdline
        )

    def _wait_for_exit(self, pid: int, deadline: float) -> bool:
        while process_alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL)
        return True

    def _signal(self, pid: int, sig: signal.Signals, deadline: float) -> bool:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        return self._wait_for_exit(pid, deadline)

    def _kill_session(self, sig: signal.Signals) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, sig)

    def _stop_epmd(self) -> None:
        if self._tools.epmd and _port_open(self.epmd_port):
            subprocess.run(
                [*self._tools.epmd, "-port", str(self.epmd_port), "-kill"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=10,
                check=False,
            )

    def _wait_until_ready(self, deadline: float) -> None:
        management = self.management()
        amqp_ok = api_ok = False
        last_ctl = ""
        while True:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                raise self._startup_error(f"rabbitmq-server exited with code {code} during startup")
            amqp_ok = amqp_ok or (_port_open(self.amqp_port) and (not self.tls or _port_open(self.tls_port)))
            if amqp_ok and not api_ok:
                with contextlib.suppress(ManagementError):
                    api_ok = bool(management.overview())
            if amqp_ok and api_ok:
                left = max(1, int(deadline - time.monotonic()))
                done = self._ctl("await_startup", "--timeout", str(left), timeout=left + 10)
                if done is not None and done.returncode == 0:
                    return
                last_ctl = "" if done is None else (done.stdout + done.stderr).strip()
            if time.monotonic() >= deadline:
                waiting_for = (
                    "the AMQP port"
                    if not amqp_ok
                    else "the management API"
                    if not api_ok
                    else f"`rabbitmqctl -n {self.node_name} await_startup` ({last_ctl or 'timed out'})"
                )
                raise self._startup_error(f"timed out waiting for {waiting_for}")
            time.sleep(_POLL)

    def _startup_error(self, reason: str) -> BrokerError:
        return BrokerError(
            f"RabbitMQ node {self.node_name} failed to start: {reason}\n"
            f"--- {self.startup_log} (tail) ---\n{tail(self.startup_log)}\n"
            f"--- {self.log_file} (tail) ---\n{tail(self.log_file)}"
        )


# -- provisioning ------------------------------------------------------------


@dataclass
class BrokerHandle:
    """A broker ready for use: where to reach it, and the private node behind it if any."""

    url: str
    management_url: str | None
    management_user: str = GUEST
    management_password: str = GUEST
    node: PrivateNode | None = None

    def __repr__(self) -> str:
        return (
            f"BrokerHandle(url={mask_url(self.url)!r}, management_url={self.management_url!r}, "
            f"management_user={self.management_user!r}, node={self.node!r})"
        )

    def management(self) -> ManagementClient:
        """A :class:`ManagementClient` for this broker (vhost ``/``)."""
        if self.management_url is None:
            raise BrokerError("this broker has no known management URL")
        return ManagementClient(self.management_url, self.management_user, self.management_password)

    def env(self) -> dict[str, str]:
        """The ``OJS_*`` environment variables describing this broker (for child processes)."""
        env = {ENV_AMQP_URL: self.url}
        if self.management_url:
            env[ENV_MANAGEMENT_URL] = self.management_url
            env[ENV_MANAGEMENT_USER] = self.management_user
            env[ENV_MANAGEMENT_PASSWORD] = self.management_password
        return env


def _external_handle(url: str) -> BrokerHandle:
    """The broker named by ``OJS_AMQP_URL``; its management API is guessed when not given."""
    first = urlsplit(url.split(";")[0].strip())  # kombu failover lists use ";"
    user = unquote(first.username) if first.username else GUEST
    password = unquote(first.password) if first.password else GUEST
    management_url = os.environ.get(ENV_MANAGEMENT_URL)
    if management_url:
        given = urlsplit(management_url)
        if given.username:
            user, password = unquote(given.username), unquote(given.password or "")
            host = f"[{given.hostname}]" if given.hostname and ":" in given.hostname else given.hostname or ""
            management_url = urlunsplit(given._replace(netloc=host + (f":{given.port}" if given.port else "")))
    else:
        host = first.hostname or "127.0.0.1"
        management_url = f"http://{f'[{host}]' if ':' in host else host}:15672"
    user = os.environ.get(ENV_MANAGEMENT_USER, user)
    password = os.environ.get(ENV_MANAGEMENT_PASSWORD, password)
    log.info("using the broker from %s: %s (management %s)", ENV_AMQP_URL, mask_url(url), management_url)
    return BrokerHandle(url, management_url.rstrip("/"), user, password, None)


def _docker_available(timeout: float = 5.0) -> bool:
    """Whether a Docker engine answers (``docker info``, else the Docker SDK's ping)."""
    cli = shutil.which("docker")
    if cli:
        try:
            return (
                subprocess.run([cli, "info"], stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout).returncode
                == 0
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=int(timeout))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - no SDK, no socket, bad DOCKER_HOST ...: all mean "no engine"
        return False


def _container_class() -> Any:
    try:
        from testcontainers.community.rabbitmq import RabbitMqContainer
    except ImportError:
        try:
            from testcontainers.rabbitmq import RabbitMqContainer
        except ImportError:
            return None
    return RabbitMqContainer


def _wait_for_management(client: ManagementClient, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.overview()
            return
        except ManagementError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(_POLL)


@contextlib.contextmanager
def _container_broker(container_class: Any, image: str) -> Iterator[BrokerHandle]:
    container = container_class(image, port=5672, username=GUEST, password=GUEST).with_exposed_ports(15672)
    log.info("starting a RabbitMQ container (%s)", image)
    with container:
        host = container.get_container_host_ip()
        url = f"amqp://{GUEST}:{GUEST}@{host}:{container.get_exposed_port(5672)}//"
        handle = BrokerHandle(url, f"http://{host}:{container.get_exposed_port(15672)}")
        _wait_for_management(handle.management(), timeout=60)
        log.info("RabbitMQ container ready: %s (management %s)", mask_url(url), handle.management_url)
        yield handle


@contextlib.contextmanager
def _private_broker(base_dir: str | os.PathLike[str] | None, rabbitmq: str | None) -> Iterator[BrokerHandle]:
    node = PrivateNode(base_dir, rabbitmq=rabbitmq)
    try:
        node.start()
    except BaseException:
        log.error("RabbitMQ node %s did not start; its files are kept in %s", node.node_name, node.dir)
        raise
    try:
        yield BrokerHandle(node.url, node.management_url, GUEST, GUEST, node)
    finally:
        node.cleanup()


@contextlib.contextmanager
def provision_broker(
    base_dir: str | os.PathLike[str] | None = None, *, rabbitmq: str | None = None
) -> Iterator[BrokerHandle]:
    """Provide a running broker for the ``with`` block, and tear down whatever was started.

    Uses ``OJS_AMQP_URL`` when set (management API from ``OJS_MANAGEMENT_URL``
    or guessed as ``http://<host>:15672``; nothing is started or stopped),
    else a testcontainers RabbitMQ container when a Docker engine answers,
    else a :class:`PrivateNode` under ``base_dir``.

    Parameters:
        base_dir: parent of a private node's directory.
        rabbitmq: the release of a container or private node (``"4.3"``, ``"4.0"``, ``"3.10"``;
            default ``$OJS_RABBITMQ``, else 4.3); a broker named by ``OJS_AMQP_URL`` is what it is.

    Raises:
        BrokerError: the release is unknown, or the broker could not be installed or started.
    """
    chosen = release(rabbitmq)
    external = os.environ.get(ENV_AMQP_URL)
    if external:
        yield _external_handle(external)
        return
    if _docker_available():
        container_class = _container_class()
        if container_class is not None:
            with _container_broker(container_class, chosen.docker_image) as handle:
                yield handle
            return
        log.warning("a Docker engine answers but testcontainers is not installed; using a private node")
    with _private_broker(base_dir, chosen.name) as handle:
        yield handle


# -- command line ------------------------------------------------------------


def _cmd_install(args: argparse.Namespace) -> int:
    if os.environ.get("OJS_AMQP_URL"):
        log.info("OJS_AMQP_URL is set: using that broker, nothing to install")
    elif _docker_available():
        log.info("a Docker engine answers: brokers will run in containers, nothing to install")
    else:
        for name in args.rabbitmq or [None]:
            ensure_rabbitmq_installed(name)
    return 0


def add_release_option(command: str, parser: argparse.ArgumentParser) -> None:
    """``--rabbitmq RELEASE`` on the commands that start or install a node (repeatable on ``install``)."""
    if command not in ("start", "run", "install"):
        return
    parser.add_argument(
        "--rabbitmq",
        choices=list(RELEASES),
        action="append" if command == "install" else "store",
        help=f"the RabbitMQ release (default: ${ENV_RABBITMQ}, else 4.3)"
        + ("; repeat to install several" if command == "install" else ""),
    )


def _raise_system_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _cmd_run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        log.error("run needs a command: run [--dir D] -- CMD ...")
        return 2
    if shutil.which(command[0]) is None:
        log.error("command not found: %s", command[0])
        return 127
    # Turn SIGTERM (CI timeouts, `kill`) into an exception so the broker is still torn down.
    signal.signal(signal.SIGTERM, _raise_system_exit)
    state_path = _COMMANDS.state_path(args.dir)
    with provision_broker(args.dir, rabbitmq=args.rabbitmq) as handle:
        if handle.node is not None:  # so that `url` finds it while CMD runs
            state_path.parent.mkdir(parents=True, exist_ok=True)
            state_path.write_text(json.dumps(handle.node.to_dict(), indent=2) + "\n")
        try:
            return subprocess.call(command, env={**os.environ, **handle.env()})
        except FileNotFoundError:
            log.error("command not found: %s", command[0])
            return 127
        finally:
            if handle.node is not None:
                state_path.unlink(missing_ok=True)


def _add_command(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ...")


_COMMANDS = ServerCommands(
    prog="python -m ojs_kombu.testing.broker",
    what="RabbitMQ node",
    state_file=STATE_FILE,
    default_dir=_default_base_dir,
    create=lambda directory, args: PrivateNode(directory, rabbitmq=args.rabbitmq),
    load=PrivateNode.from_dict,
    install=_cmd_install,
    install_help=f"install RabbitMQ (a chroot, or apt for 3.10) unless {ENV_AMQP_URL} or Docker provides a broker",
    error=BrokerError,
    log=log,
    extra={"run": ("provision a broker, run CMD with OJS_AMQP_URL set, tear down", _cmd_run, _add_command)},
    options=add_release_option,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m ojs_kombu.testing.broker``; returns the exit status."""
    return _COMMANDS.main(argv, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
