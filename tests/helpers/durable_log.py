"""The event log of the worker processes under tests/helpers: one line per event, flushed and fsynced so
the lines survive the process being SIGKILLed (the drills read them afterwards)."""

from __future__ import annotations

import os


def append_line(path: str, text: str) -> None:
    """Append ``text`` and a newline to ``path``, on disk before it returns."""
    with open(path, "a", encoding="utf-8") as out:
        out.write(text + "\n")
        out.flush()
        os.fsync(out.fileno())
