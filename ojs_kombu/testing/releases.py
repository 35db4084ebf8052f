"""Which RabbitMQ a private node runs, and where its programs come from (DESIGN §18).

Three releases are known by name:

======  =====================================================  ==================
name    where it comes from                                    RabbitMQ / Erlang
======  =====================================================  ==================
``4.3``  a Debian ``forky`` chroot built with ``debootstrap``   4.3.6 / OTP 29
``4.0``  a Debian ``trixie`` chroot built with ``debootstrap``  4.0.5 / OTP 27
``3.10`` the host's own ``rabbitmq-server`` package (apt)       3.10.8 / OTP 25
======  =====================================================  ==================

``4.3`` is the default; ``$OJS_RABBITMQ`` (or an explicit ``rabbitmq=`` / ``--rabbitmq``)
chooses another.  A chroot is built once, under ``$OJS_RABBITMQ_CACHE`` (default
``~/.cache/ojs-kombu``), and reused by every later node, test session and clone of the
repository on the machine; two processes that need it at once build it once (a file lock).
Its programs run only inside it (they need its newer C library), as its own ``rabbitmq`` user,
through ``chroot(8)``: the node shares the host's loopback, so every name and port is chosen
as for a host node, and a node's files live inside the chroot at the same path as the
directory it was given (``<chroot>/<dir>``), so that its configuration names them as the
node sees them.

Building a chroot needs root, ``debootstrap`` (installed with apt when missing) and the
Debian mirror that the host's apt sources name (or ``$OJS_DEBIAN_MIRROR``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ._servers import BrokerError, apt_install

__all__ = [
    "DEFAULT_RELEASE",
    "ENV_RABBITMQ",
    "RELEASES",
    "Chroot",
    "Release",
    "ReleaseError",
    "chroot_for",
    "release",
]

log = logging.getLogger("ojs_kombu.testing.releases")

ENV_RABBITMQ = "OJS_RABBITMQ"
ENV_CACHE = "OJS_RABBITMQ_CACHE"
ENV_MIRROR = "OJS_DEBIAN_MIRROR"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
_READY = "ojs-chroot.json"  # written last: a chroot without it is unfinished
_SCRIPTS = Path("/usr/share/debootstrap/scripts")


class ReleaseError(BrokerError):
    """An unknown release was asked for, or its chroot could not be built or entered."""


@dataclass(frozen=True)
class Release:
    """A RabbitMQ release the test tooling can run.

    Parameters:
        name: what users write (``"4.3"``).
        suite: the Debian suite whose chroot carries it, ``None`` for the host's own package.
        script: the debootstrap script to use when the host's debootstrap has none named after
            ``suite`` (Debian 12's knows ``sid`` but not ``forky``, which bootstraps the same way).
        docker_image: the image used when a Docker engine provides the broker instead.
    """

    name: str
    suite: str | None
    script: str | None
    docker_image: str

    @property
    def in_chroot(self) -> bool:
        """Whether this release runs from a chroot (else from the host's package)."""
        return self.suite is not None


RELEASES: dict[str, Release] = {
    "4.3": Release("4.3", "forky", "sid", "rabbitmq:4.3-management"),
    "4.0": Release("4.0", "trixie", None, "rabbitmq:4.0-management"),
    "3.10": Release("3.10", None, None, "rabbitmq:3.10-management"),
}
DEFAULT_RELEASE = "4.3"


def release(name: str | None = None) -> Release:
    """The release called ``name``, else ``$OJS_RABBITMQ``'s, else the default (4.3).

    Raises:
        ReleaseError: the name is not one of :data:`RELEASES`.
    """
    chosen = name or os.environ.get(ENV_RABBITMQ) or DEFAULT_RELEASE
    try:
        return RELEASES[chosen]
    except KeyError:
        raise ReleaseError(
            f"unknown RabbitMQ release {chosen!r} (from {'the call' if name else ENV_RABBITMQ}); "
            f"choose one of {', '.join(RELEASES)}"
        ) from None


def cache_root() -> Path:
    """Where chroots are kept: ``$OJS_RABBITMQ_CACHE``, else ``$XDG_CACHE_HOME/ojs-kombu`` or ``~/.cache/ojs-kombu``."""
    explicit = os.environ.get(ENV_CACHE)
    if explicit:
        return Path(explicit).absolute()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ojs-kombu"


@dataclass(frozen=True)
class Chroot:
    """A built chroot holding one RabbitMQ release.

    Parameters:
        root: its directory on the host.
        rabbitmq: the RabbitMQ version installed in it (``"4.3.6"``).
        erlang: the Erlang/OTP package version installed in it.
    """

    root: Path
    rabbitmq: str
    erlang: str

    def host_path(self, inner: str | os.PathLike[str]) -> Path:
        """The host's path of ``inner``, a path as seen inside the chroot."""
        return self.root / Path(inner).relative_to("/")

    def inner_path(self, host: str | os.PathLike[str]) -> Path:
        """``host`` (a path under :attr:`root`) as seen inside the chroot."""
        return Path("/") / Path(host).relative_to(self.root)

    def user(self, name: str = "rabbitmq") -> tuple[int, int]:
        """(uid, gid) of ``name`` in the chroot's own ``/etc/passwd``.

        Raises:
            ReleaseError: no such user there.
        """
        for line in (self.root / "etc/passwd").read_text().splitlines():
            fields = line.split(":")
            if len(fields) > 3 and fields[0] == name:
                return int(fields[2]), int(fields[3])
        raise ReleaseError(f"no user {name!r} in {self.root}/etc/passwd")

    def command(self, program: str, uid: int, gid: int) -> list[str]:
        """The command line that runs ``program`` (a path inside the chroot) as ``uid:gid`` in it."""
        return ["chroot", f"--userspec={uid}:{gid}", str(self.root), program]

    def enter(self) -> None:
        """Make the chroot ready to run a node: ``/proc`` mounted, the host's ``/etc/hosts`` copied.

        Idempotent and cheap; needed again after the machine restarted (mounts do not survive).

        Raises:
            ReleaseError: not root, or ``/proc`` could not be mounted.
        """
        _require_root(f"running RabbitMQ from the chroot {self.root}")
        proc = self.root / "proc"
        if not os.path.ismount(proc):
            done = subprocess.run(
                ["mount", "-t", "proc", "proc", str(proc)], capture_output=True, text=True, check=False
            )
            if done.returncode != 0 and not os.path.ismount(proc):
                raise ReleaseError(f"cannot mount /proc in {self.root}: {(done.stdout + done.stderr).strip()}")
        hosts = Path("/etc/hosts")
        target = self.root / "etc/hosts"
        if hosts.exists() and (not target.exists() or target.read_bytes() != hosts.read_bytes()):
            shutil.copyfile(hosts, target)


def chroot_for(chosen: Release) -> Chroot:
    """The chroot of ``chosen`` (a chroot release), built first if it is not in the cache yet.

    Raises:
        ReleaseError: ``chosen`` runs from the host's package, or the chroot cannot be built
            (not root, no debootstrap, the mirror refused, the build failed).
    """
    if chosen.suite is None:
        raise ReleaseError(f"RabbitMQ {chosen.name} runs from the host's package, not a chroot")
    root = cache_root() / f"rabbitmq-{chosen.name}"
    built = _read_ready(root)
    if built is None:
        with _lock(root.with_name(root.name + ".lock")):
            built = _read_ready(root) or _build(chosen, root)
    built.enter()
    return built


# -- building ----------------------------------------------------------------


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise ReleaseError(
            f"{what} needs root (chroot, mount); run as root, choose the host's package with "
            f"{ENV_RABBITMQ}=3.10, or point OJS_AMQP_URL at a broker"
        )


def _read_ready(root: Path) -> Chroot | None:
    try:
        state = json.loads((root / _READY).read_text())
    except (OSError, ValueError):
        return None
    return Chroot(root, state["rabbitmq"], state["erlang"])


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _mirror() -> str:
    """The Debian mirror: ``$OJS_DEBIAN_MIRROR``, else the first one the host's apt sources name."""
    explicit = os.environ.get(ENV_MIRROR)
    if explicit:
        return explicit
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        with contextlib.suppress(OSError):
            for line in source.read_text().splitlines():
                # one-line form: "deb [opts] URI suite ..."; deb822 form: "URIs: URI ..."
                match = re.match(r"\s*(?:deb\s+(?:\[[^\]]*\]\s+)?|URIs:\s*)(\S+)", line)
                if match and "security" not in match.group(1) and match.group(1).rstrip("/").endswith("/debian"):
                    return match.group(1)
    return DEFAULT_MIRROR


def _unmount_under(root: Path) -> None:
    """Unmount whatever is mounted below ``root`` (debootstrap mounts /proc and /sys while it works)."""
    try:
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return
    for point in sorted((m for m in mounts if m.startswith(str(root) + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _remove(root: Path) -> None:
    if root.exists():
        _unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)


def _build(chosen: Release, root: Path) -> Chroot:
    assert chosen.suite is not None
    _require_root(f"building the RabbitMQ {chosen.name} chroot")
    apt_install(
        "debootstrap",
        installed=lambda: shutil.which("debootstrap") is not None or Path("/usr/sbin/debootstrap").exists(),
        error=ReleaseError,
        hint="debootstrap is not installed: `apt-get install debootstrap`",
        log=log,
    )
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    building = root.with_name(root.name + ".building")
    _remove(building)  # what an interrupted build left
    _remove(root)
    mirror = _mirror()
    command = [debootstrap, "--variant=minbase", "--include=rabbitmq-server", chosen.suite, str(building), mirror]
    if chosen.script and not (_SCRIPTS / chosen.suite).exists():
        command.append(str(_SCRIPTS / chosen.script))
    log.info("building the RabbitMQ %s chroot (Debian %s from %s) in %s", chosen.name, chosen.suite, mirror, root)
    began = time.monotonic()
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        _remove(building)
        output = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise ReleaseError(f"debootstrap of Debian {chosen.suite} failed (exit {done.returncode}):\n{output}")
    _unmount_under(building)
    versions = _versions(building)
    building.rename(root)
    built = Chroot(root, *versions)
    (root / _READY).write_text(
        json.dumps({"release": chosen.name, "suite": chosen.suite, "rabbitmq": built.rabbitmq, "erlang": built.erlang})
    )
    log.info(
        "built the chroot in %.0fs: RabbitMQ %s, Erlang %s (%s)",
        time.monotonic() - began,
        built.rabbitmq,
        built.erlang,
        root,
    )
    return built


def _versions(root: Path) -> tuple[str, str]:
    """(RabbitMQ version, Erlang/OTP version) installed in the chroot at ``root``."""
    done = subprocess.run(
        ["chroot", str(root), "dpkg-query", "-W", "-f", "${Package} ${Version}\\n", "rabbitmq-server", "erlang-base"],
        capture_output=True,
        text=True,
        check=False,
    )
    versions = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    if done.returncode != 0 or not {"rabbitmq-server", "erlang-base"} <= versions.keys():
        raise ReleaseError(f"rabbitmq-server is not installed in {root}: {(done.stdout + done.stderr).strip()}")
    rabbitmq = versions["rabbitmq-server"].split(":")[-1].split("-")[0]  # "4.3.6-1" -> "4.3.6"
    erlang = versions["erlang-base"].split(":")[-1].split("+")[0]  # "1:29.1.1+dfsg-1" -> "29.1.1"
    return rabbitmq, erlang
