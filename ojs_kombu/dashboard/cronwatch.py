"""The cron registry as the dashboard shows it: the cron stream followed live, on a connection of its own.

``Client.crons()`` reads ``ojs.stream.cron`` from its first record up to a marker it publishes; the
stream keeps a day of records (snapshots keep the definitions, :mod:`ojs_kombu.wire.cron`), so a page
polling it every few seconds would add a marker record on every update (3.7 MB a day at 5 s), and
each read would replay a day of them.
:class:`CronWatch` reads the stream once up to one marker of its own, then follows it (as every
:class:`~ojs_kombu.CronScheduler` does, without taking part in the leader election): the pages read its
copy of the registry; a new marker is published only when it connects again.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from ojs_kombu.amqp.connection import close_quietly, make_connection
from ojs_kombu.amqp.errors import map_exceptions
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.errors import OjsError
from ojs_kombu.model.naming import Names
from ojs_kombu.runtime.cron import DEFAULT_READ_TIMEOUT, CronStreamReader, RegisteredCron, registered
from ojs_kombu.wire.cron import CronBook, CronEntry, CronLeader

#: Seconds between two connection attempts after an error.
RETRY_EVERY = 2.0


class CronWatch:
    """Follows the cron stream in a thread (:meth:`start` / :meth:`stop`); thread-safe reads.

    Parameters:
        url: the broker URL (the client's; TLS as its scheme says).
        names: the deployment's entity names.
        heartbeat: AMQP heartbeat of the connection, in seconds.
    """

    def __init__(self, url: str, names: Names, *, heartbeat: float = 30.0) -> None:
        self.url = url
        self.names = names
        self.heartbeat = heartbeat
        self.error = ""
        """The last connection or read error (empty once caught up again); may quote the URL: redact it."""
        self._lock = threading.Lock()
        self._entries: dict[str, CronEntry] = {}
        self._leader: CronLeader | None = None
        self._ready = threading.Event()
        self._caught_up = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._changed = threading.Condition(self._lock)

    def start(self) -> CronWatch:
        """Start following in a daemon thread.

        Returns:
            self.
        """
        self._thread = threading.Thread(target=self._run, name="ojs-dashboard-crons", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop following and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def crons(self, timeout: float = DEFAULT_READ_TIMEOUT) -> tuple[list[RegisteredCron], CronLeader | None]:
        """The registered cron jobs by name (next runs computed now) and the scheduler elected last.

        Parameters:
            timeout: seconds to wait for the first read of the stream.

        Returns:
            The cron jobs and the leader (None when none was ever elected).

        Raises:
            OjsError: the stream has not been read yet (``error`` says why, if known).
        """
        if not self._ready.wait(timeout):
            raise OjsError(
                f"the cron stream was not read within {timeout:g} s{': ' + self.error if self.error else ''}"
            )
        with self._lock:
            entries = [self._entries[name] for name in sorted(self._entries)]
            return [registered(entry) for entry in entries], self._leader

    def wait_for(self, predicate: Callable[[dict[str, CronEntry]], bool], timeout: float) -> bool:
        """Wait until ``predicate(entries)`` holds for the registry followed (a change just published
        by this process read back), at most ``timeout`` seconds.

        Returns:
            Whether it held.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self._entries):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def _copy(self, book: CronBook) -> None:
        with self._changed:
            self._entries = {name: dataclasses.replace(entry) for name, entry in book.entries.items()}
            self._leader = book.leader
            self._changed.notify_all()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._follow()
            except Exception as exc:  # noqa: BLE001 - any failure: said on the page, then connect again
                self.error = f"{type(exc).__name__}: {exc}"
            self._stop.wait(RETRY_EVERY)

    def _follow(self) -> None:
        book = CronBook()
        self._caught_up = False

        def on_record(record: object) -> None:
            if self._caught_up:  # during the first read, copied once at its end
                self._copy(book)

        conn = make_connection(
            self.url, heartbeat=self.heartbeat, ssl=None, transport_options=None, connection_name="ojs-dashboard crons"
        )
        try:
            with map_exceptions(url=self.url):
                conn.ensure_connection(max_retries=1)
                connection = conn.connection
                Topology(self.names).ensure_cron(connection)
                reader = CronStreamReader(self.names, book, on_record)
                channel = reader.attach(connection)
                reader.wait(connection, reader.mark(), DEFAULT_READ_TIMEOUT * 6)
                self._caught_up = True
                self._copy(book)
                self.error = ""
                self._ready.set()
                while not self._stop.is_set():
                    try:
                        connection.drain_events(timeout=0.5)
                    except TimeoutError:
                        pass
                    connection.heartbeat_tick()
                close_quietly(channel)
        finally:
            conn.release()


__all__ = ["CronWatch"]
