"""Headless Chromium and its WebDriver for the dashboard's browser tests (``tests/dashboard``).

``make setup`` runs ``python -m tools.browser install``, which installs Debian's
``chromium`` and ``chromium-driver`` with ``apt-get`` when they are missing, the same way the
broker, Redis and Java are installed.
"""

from __future__ import annotations

import logging
import shutil
import sys

from ojs_kombu.testing._servers import apt_install

from ._install import install_main

log = logging.getLogger("tools.browser")

#: Debian's packages: the browser, and the WebDriver Selenium talks to.
BROWSER_PACKAGE = "chromium"
DRIVER_PACKAGE = "chromium-driver"


class BrowserError(RuntimeError):
    """No Chromium or chromedriver, and they could not be installed."""


def chromium_binary() -> str | None:
    """Path of the Chromium executable on ``PATH``, else None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def chromedriver_binary() -> str | None:
    """Path of ``chromedriver`` on ``PATH``, else None."""
    return shutil.which("chromedriver")


def ensure_browser_installed() -> tuple[str, str]:
    """Paths of Chromium and chromedriver; installs them with ``apt-get`` when missing and root.

    Returns:
        ``(chromium, chromedriver)`` executable paths.

    Raises:
        BrowserError: missing, and they cannot be installed here (not root, no apt-get, apt failed).
    """
    for package, found in ((BROWSER_PACKAGE, chromium_binary), (DRIVER_PACKAGE, chromedriver_binary)):
        apt_install(
            package,
            installed=lambda found=found: found() is not None,  # type: ignore[misc]
            error=BrowserError,
            hint=f"{package} is not installed: `sudo apt-get install {BROWSER_PACKAGE} {DRIVER_PACKAGE}`",
            log=log,
        )
    browser, driver = chromium_binary(), chromedriver_binary()
    if browser is None or driver is None:  # apt_install checked them; keeps the types precise
        raise BrowserError("chromium is installed but not on PATH")
    return browser, driver


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.browser install``: make sure Chromium and its driver are there."""
    return install_main(
        "tools.browser",
        __doc__,
        lambda: "chromium: {}, chromedriver: {}".format(*ensure_browser_installed()),
        BrowserError,
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
