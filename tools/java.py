"""A Java runtime for PySpark (``ojs_kombu.spark``'s tests, example and benchmark).

PySpark needs ``java`` on ``PATH`` (or ``JAVA_HOME``).  ``make setup`` runs
``python -m tools.java install``, which installs Debian's
``openjdk-17-jre-headless`` with ``apt-get`` when no Java runtime is found, the
same way the broker and Redis are installed.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path

from ojs_kombu.testing._servers import apt_install

from ._install import install_main

log = logging.getLogger("tools.java")

#: Debian's headless Java 17 runtime (PySpark 4 supports Java 17 and 21).
JAVA_PACKAGE = "openjdk-17-jre-headless"


class JavaError(RuntimeError):
    """No Java runtime, and none could be installed."""


def java_binary() -> str | None:
    """The ``java`` PySpark will run: ``$JAVA_HOME/bin/java``, else ``java`` on ``PATH``, else None."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def ensure_java_installed() -> str:
    """Path of ``java``; installs Debian's runtime with ``apt-get`` when missing and root.

    Returns:
        The path of the ``java`` executable.

    Raises:
        JavaError: no Java runtime, and it cannot be installed here (not root, no apt-get, apt failed).
    """
    apt_install(
        JAVA_PACKAGE,
        installed=lambda: java_binary() is not None,
        error=JavaError,
        hint=f"Java is not installed: install `{JAVA_PACKAGE}` (e.g. `sudo apt-get install {JAVA_PACKAGE}`) "
        "or set JAVA_HOME",
        log=log,
    )
    path = java_binary()
    if path is None:  # apt_install checked it; keeps the type precise
        raise JavaError(f"{JAVA_PACKAGE} is installed but `java` is not on PATH")
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.java install``: make sure a Java runtime is there."""
    return install_main("tools.java", __doc__, lambda: f"java: {ensure_java_installed()}", JavaError, argv)


if __name__ == "__main__":
    sys.exit(main())
