"""The refiller of window rates: a thread that publishes each slot's start tokens (DESIGN §21).

:class:`WindowRefiller` refills every window of its policies at the start of each slot
(:mod:`ojs_kombu.amqp.windows`), while it is the leader: give it a
:class:`~ojs_kombu.runtime.leader.LeaderLease` and only the instance that holds the lease refills
(one lease per deployment: the cron leader's, DESIGN §20).  A refiller that becomes the leader
in the middle of a slot leaves that slot alone (the previous leader may have refilled it, and a
second refill would grant its starts twice) and refills from the next slot on.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ojs_kombu.amqp.connection import close_quietly, resolve_url
from ojs_kombu.amqp.errors import map_exceptions
from ojs_kombu.amqp.failover import Failover
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


__all__ = ["WindowRefiller"]
