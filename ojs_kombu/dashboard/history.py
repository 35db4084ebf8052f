"""Queue depths over time, kept in memory while the dashboard runs (the overview's sparklines)."""

from __future__ import annotations

import threading
from collections import deque

from ojs_kombu.dashboard.overview import Snapshot


class DepthHistory:
    """The last ``size`` ready counts of each queue, fed by every snapshot the dashboard takes.

    Parameters:
        size: samples kept per queue.
    """

    def __init__(self, size: int = 60) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._samples: dict[str, deque[int]] = {}

    def record(self, shot: Snapshot) -> None:
        """Append the depth of every existing queue of ``shot``."""
        with self._lock:
            for row in shot.queues:
                if row.exists and row.ready is not None:
                    self._samples.setdefault(row.queue, deque(maxlen=self._size)).append(row.ready)

    def of(self, queue: str) -> list[int]:
        """The samples of ``queue``, oldest first (empty when none)."""
        with self._lock:
            return list(self._samples.get(queue, ()))
