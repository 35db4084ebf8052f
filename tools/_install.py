"""``python -m tools.<tool> install`` for a tool that is only installed, never started (Java, Chromium)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence


def install_main(
    module: str, doc: str | None, ensure: Callable[[], str], error: type[Exception], argv: Sequence[str] | None
) -> int:
    """``python -m <module> install`` for a tool that is only installed, never started (Java, Chromium).

    Parameters:
        module: the module run with ``-m``, for the usage line.
        doc: its docstring, whose first line describes the command.
        ensure: installs what is missing and returns a line saying what is there.
        error: the exception ``ensure`` raises when it cannot install.
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 when installed, 1 when ``ensure`` raised ``error`` (logged).
    """
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=(doc or "").splitlines()[0])
    parser.add_argument("command", choices=["install"])
    parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    log = logging.getLogger(module)
    try:
        log.info("%s", ensure())
    except error as exc:
        log.error("%s", exc)
        return 1
    return 0
