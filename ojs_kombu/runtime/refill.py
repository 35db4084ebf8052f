"""The refiller of window rates: a thread that publishes each slot's start tokens (DESIGN §21).

:class:`WindowRefiller` refills every window of its policies at the start of each slot
(:mod:`ojs_kombu.amqp.windows`), while it is the leader: give it a
:class:`~ojs_kombu.runtime.leader.LeaderLease` and only the instance that holds the lease refills
(one lease per deployment: the cron leader's, DESIGN §20).  A refiller that becomes the leader
in the middle of a slot leaves that slot alone (the previous leader may have refilled it, and a
second refill would grant its starts twice) and refills from the next slot on.

:class:`KeyRefills` is the Worker's: it refills the windows of the keys its jobs meet, with no
scheduler to run.  Each window is refilled by the one process that holds its *refill permit* (a
concurrency permit of 1 under the key ``{key}:refill``, :mod:`ojs_kombu.amqp.permits`): a worker
that meets a window asks for it (again every :data:`CLAIM_INTERVAL` while another holds it), and
a holder that dies gives it back through the broker, so the next worker's claim succeeds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ojs_kombu.amqp.connection import close_quietly, resolve_url
from ojs_kombu.amqp.errors import map_exceptions
from ojs_kombu.amqp.failover import Failover
from ojs_kombu.amqp.permits import Permit, Permits
from ojs_kombu.amqp.reconnect import Forever, Reconnector
from ojs_kombu.amqp.windows import WindowTokens
from ojs_kombu.errors import BrokerRefusedError, ValidationError
from ojs_kombu.model.naming import Names
from ojs_kombu.model.ratelimit import RateLimitPolicy
from ojs_kombu.policy.ratelimit import WindowSchedule
from ojs_kombu.runtime.leader import LeaderLease

logger = logging.getLogger(__name__)


class WindowRefiller:
    """Refill the window rates (``rate``, ``throttle``) of ``policies`` every slot, while leader.

    Parameters:
        policies: the policies whose windows to refill (policies without a window are ignored).
        url: the broker URL; default ``$OJS_AMQP_URL``, then the local broker.
        names: the deployment's entity names (its prefix).
        lease: refill only while this lease is the leader (``None``: always; one refiller only).
        ssl, transport_options: as for :class:`~ojs_kombu.client.Client`.

    Raises:
        ValidationError: two policies of one key with different windows.
    """

    def __init__(
        self,
        policies: list[RateLimitPolicy],
        url: str | None = None,
        *,
        names: Names | None = None,
        lease: LeaderLease | None = None,
        ssl: Any = None,
        transport_options: dict[str, Any] | None = None,
    ) -> None:
        self.url = resolve_url(url)
        self.names = names or Names()
        self.lease = lease
        self.windows: dict[tuple[str, str], WindowSchedule] = {}
        for policy in policies:
            for schedule in WindowSchedule.for_policy(policy):
                known = self.windows.setdefault((policy.key, schedule.kind), schedule)
                if known != schedule:
                    raise ValidationError(
                        f"two {schedule.kind} windows for key {policy.key!r}: {known} and {schedule}", field="key"
                    )
        self._failover = Failover(
            self.url, heartbeat=0, ssl=ssl, transport_options=transport_options, connection_name="ojs-window-refiller"
        )
        self._kombu = self._failover.connection()
        # Transient failures are retried until stop(); a permanent refusal (403, 530) stops the refiller.
        self._reconnect = Reconnector(Forever(), self._failover, url=self.url, name="window refiller")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BrokerRefusedError | None = None
        """The permanent refusal that stopped the refiller, or None."""
        self.refills: list[tuple[str, str, int, float]] = []
        """``(key, kind, slot, unix time)`` of the last refills (at most 1,000), for tests and metrics."""

    def start(self) -> WindowRefiller:
        """Start the refiller's thread (idempotent).

        Returns:
            self.
        """
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ojs-window-refiller", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop refilling and disconnect.

        Parameters:
            timeout: seconds to wait for the thread.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> WindowRefiller:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _leading(self) -> bool:
        return self.lease is None or self.lease.is_leader

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._connect_and_serve()
                except Exception as exc:  # noqa: BLE001 - the refiller outlives broker trouble
                    try:
                        self._kombu.collect()
                    except Exception:  # noqa: BLE001 - closing a broken connection
                        pass
                    self._stop.wait(self._reconnect.failed(exc, self._kombu))
        except BrokerRefusedError as exc:
            self.error = exc
            logger.error("window refiller stopped: %s", exc)
        finally:
            try:
                self._kombu.release()
            except Exception:  # noqa: BLE001
                pass

    def _connect_and_serve(self) -> None:
        with map_exceptions(url=self.url):
            self._reconnect.connecting()
            self._failover.connect(self._kombu)
            self._reconnect.succeeded()
            self._reconnect.reset()
            channel = self._kombu.connection.channel()
            try:
                self._serve(WindowTokens(channel, self.names))
            finally:
                close_quietly(channel)

    def _serve(self, tokens: WindowTokens) -> None:
        for (key, _), schedule in self.windows.items():
            tokens.declare(key, schedule)
        # The slot each window was last refilled for; the current slot is never refilled late.
        done = {window: schedule.slot(time.time()) for window, schedule in self.windows.items()}
        if not done:
            self._stop.wait()
        while not self._stop.is_set():
            now = time.time()
            due = min(schedule.start(done[window] + 1) for window, schedule in self.windows.items())
            if due > now:
                self._stop.wait(due - now)
                continue
            leading = self._leading()
            for window, schedule in self.windows.items():
                slot = schedule.slot(now)
                if slot <= done[window]:
                    continue
                done[window] = slot
                if leading:
                    tokens.refill(window[0], schedule, slot, now=now)
                    self.refills.append((window[0], window[1], slot, now))
                    del self.refills[:-1000]


CLAIM_INTERVAL = 0.5
"""Seconds between two claims of a window's refill permit by a worker that does not hold it."""


def refill_key(key: str, kind: str) -> str:
    """The permit key whose single permit makes its holder the refiller of ``key``'s ``kind`` window.

    Parameters:
        key: the rate limit key.
        kind: ``"rate"`` or ``"throttle"``.

    Returns:
        ``{key}:{kind}-refill``.
    """
    return f"{key}:{kind}-refill"


class KeyRefills:
    """Refill the windows a worker's jobs meet, each by the one process holding its refill permit (see the module).

    Parameters:
        permits: the worker's permits (its connection): the refill permits, the refills.
    """

    def __init__(self, permits: Callable[[], Permits]) -> None:
        self._permits = permits
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, str], WindowSchedule] = {}
        self._leads: dict[tuple[str, str], Permit] = {}
        self._done: dict[tuple[str, str], int] = {}  # the slot each led window was last refilled for
        self._claimed: dict[tuple[str, str], float] = {}  # monotonic time of the last claim
        self._ensured: set[tuple[str, str]] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refills: list[tuple[str, str, int, float]] = []
        """``(key, kind, slot, unix time)`` of this process's last refills (at most 1,000)."""

    def add(self, key: str, schedule: WindowSchedule) -> None:
        """Refill ``key``'s window from now on (idempotent; a changed schedule replaces the old one at the next slot).

        Parameters:
            key: the rate limit key.
            schedule: the window.
        """
        window = (key, schedule.kind)
        with self._lock:
            if self._windows.get(window) == schedule or self._stop.is_set():
                return
            self._windows[window] = schedule
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ojs-limit-refills", daemon=True)
                self._thread.start()
        self._wake.set()

    def leading(self, key: str, kind: str) -> bool:
        """Whether this process refills ``key``'s ``kind`` window now.

        Parameters:
            key: the rate limit key.
            kind: ``"rate"`` or ``"throttle"``.

        Returns:
            Whether it holds the window's refill permit.
        """
        lead = self._leads.get((key, kind))
        return lead is not None and lead.held

    def stop(self) -> None:
        """Stop refilling and give the refill permits back."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)
        for lead in list(self._leads.values()):
            try:
                lead.release()
            except Exception:  # noqa: BLE001 - lost with its connection: the broker has it back
                pass
        self._leads.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            now = time.time()
            with self._lock:
                windows = list(self._windows.items())
            for window, schedule in windows:
                try:
                    self._serve(window, schedule, now)
                except Exception:  # the permits' connection failed: the next turn reconnects
                    logger.warning("refilling the %s window of %r failed", window[1], window[0], exc_info=True)
            now = time.time()
            due = min(
                [schedule.start(schedule.slot(now) + 1) - now for _, schedule in windows]
                + [CLAIM_INTERVAL if not self.leading(*window) else 3600.0 for window, _ in windows]
            )
            self._wake.wait(max(0.0, due))

    def _serve(self, window: tuple[str, str], schedule: WindowSchedule, now: float) -> None:
        slot = schedule.slot(now)
        lead = self._leads.get(window)
        if lead is None or not lead.held:
            if time.monotonic() - self._claimed.get(window, float("-inf")) < CLAIM_INTERVAL:
                return
            self._claimed[window] = time.monotonic()
            permits = self._permits()
            name = refill_key(*window)
            if window not in self._ensured:
                permits.ensure(name, 1)
                self._ensured.add(window)
            claimed = permits.acquire(name, timeout=0.0)
            if claimed is None:
                self._leads.pop(window, None)
                return
            self._leads[window] = claimed
            self._done[window] = slot  # the slot it was elected in is its predecessor's (or nobody's)
            return
        if slot > self._done.get(window, slot):
            self._done[window] = slot
            self._permits().refill_starts(window[0], schedule, slot, now=now)
            self.refills.append((window[0], window[1], slot, now))
            del self.refills[:-1000]


__all__ = ["CLAIM_INTERVAL", "KeyRefills", "WindowRefiller", "refill_key"]
