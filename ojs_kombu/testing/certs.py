"""Throw-away TLS certificates for test brokers, made with the ``openssl`` command line.

:func:`make_test_pki` writes a CA, a server certificate for ``localhost`` /
``127.0.0.1`` signed by it, and a client certificate (common name ``guest``)
signed by it, into one directory.  Keys are unencrypted: test use only.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TestPki", "make_test_pki"]

_DAYS = "30"


@dataclass(frozen=True)
class TestPki:
    """Paths of the PEM files made by :func:`make_test_pki`."""

    __test__ = False  # not a pytest test class

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def in_dir(cls, directory: Path) -> TestPki:
        """The files :func:`make_test_pki` writes into ``directory`` (made or not)."""
        return cls(
            ca_cert=directory / "ca.pem",
            server_cert=directory / "server.pem",
            server_key=directory / "server.key",
            client_cert=directory / "client.pem",
            client_key=directory / "client.key",
        )


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()}")


def _signed(directory: Path, name: str, subject: str, extensions: str) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", subject, cwd=directory)  # fmt: skip
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", _DAYS, "-sha256", "-extfile", f"{name}.ext", cwd=directory)  # fmt: skip


def make_test_pki(
    directory: Path, *, hosts: tuple[str, ...] = ("localhost",), ips: tuple[str, ...] = ("127.0.0.1",)
) -> TestPki:
    """Write a test CA, a server and a client certificate (PEM) into ``directory``.

    Parameters:
        directory: where the files go (created if missing).
        hosts, ips: the DNS names and IP addresses the server certificate carries.

    Returns:
        The paths of the files.

    Raises:
        RuntimeError: ``openssl`` is missing or failed.
    """
    if shutil.which("openssl") is None:
        raise RuntimeError("the `openssl` command is needed to make test certificates (apt-get install openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", _DAYS, "-subj", "/CN=ojs-test-ca", cwd=directory)  # fmt: skip
    names = ",".join([f"DNS:{h}" for h in hosts] + [f"IP:{ip}" for ip in ips])
    _signed(directory, "server", "/CN=localhost", f"subjectAltName={names}\nextendedKeyUsage=serverAuth\n")
    _signed(directory, "client", "/CN=guest", "extendedKeyUsage=clientAuth\n")
    return TestPki.in_dir(directory)
