"""The connection of a :class:`~ojs_kombu.amqp.permits.Permits`, and its exclusive holds on marker queues.

A :class:`PermitConnection` owns one connection, used by one thread at a time under a lock (``_io``);
a keeper thread services the AMQP heartbeat while permits are held and jobs run.  An AMQP or
socket failure drops the whole connection (the broker returns every token it held and removes
every index consumer), bumps its *generation* (a permit of an earlier one is not held any more)
and is raised typed; the next call reconnects, trying each node of a failover list once, back to
back (:class:`~ojs_kombu.amqp.reconnect.OnePass`): a call fails fast, its caller decides whether
to try again later, but never because one node of a cluster is down.

A *hold* is an exclusive consumer on a marker queue (an empty, durable, classic queue): the
holder's claim on a permit index, or the seeding lock.  RabbitMQ lets one consumer at a time
subscribe exclusively and removes it when its channel or connection closes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from amqp import Channel
from amqp import Message as WireMessage
from amqp.exceptions import AccessRefused, PreconditionFailed

from ojs_kombu.amqp.connection import resolve_url, safe_url
from ojs_kombu.amqp.errors import map_exceptions
from ojs_kombu.amqp.failover import Failover
from ojs_kombu.amqp.reconnect import OnePass, Reconnector
from ojs_kombu.amqp.refusals import parse_precondition_failed
from ojs_kombu.errors import BrokerConnectionError, OjsError, PermitLostError

# The permits' logger: its records kept their name when the connection moved here.
logger = logging.getLogger("ojs_kombu.amqp.permits")

_MARKER_ARGUMENTS: dict[str, Any] = {"x-queue-type": "classic"}


class Hold:
    """An exclusive consumer on a marker queue: the holder's claim on a permit index (or the seeding lock)."""

    __slots__ = ("channel", "tag")

    def __init__(self, channel: Channel, tag: str) -> None:
        self.channel = channel
        self.tag = tag


def _unexpected(message: WireMessage) -> None:
    logger.warning("permits: a message was published to a marker queue; ignored")


class PermitConnection:
    """One connection of its own for permits: taken in turns, kept alive, dropped whole on a failure.

    The base of :class:`~ojs_kombu.amqp.permits.Permits` (its connection, channels and holds).

    Parameters:
        url: the broker URL; default ``$OJS_AMQP_URL``, then the local broker.
        heartbeat: AMQP heartbeat in seconds (serviced by a keeper thread).
        ssl, transport_options: as for :class:`~ojs_kombu.client.Client`.
        connection_name: the connection's name in the management UI.

    Raises:
        ValidationError: a bad URL or ``ssl`` option.
    """

    def __init__(
        self,
        url: str | None,
        *,
        heartbeat: float,
        ssl: Any,
        transport_options: dict[str, Any] | None,
        connection_name: str,
    ) -> None:
        self.url = resolve_url(url)
        self._failover = Failover(
            self.url,
            heartbeat=heartbeat,
            ssl=ssl,
            transport_options=transport_options,
            connection_name=connection_name,
        )
        self._kombu = self._failover.connection()
        self._io = threading.RLock()
        self._connection: Any = None
        self._tokens: Channel | None = None  # holds every token received, unacked
        self._control: Channel | None = None  # declarations
        self._spare: list[Channel] = []  # channels for exclusive consumers (a refusal closes its channel)
        self._publisher: Channel | None = None  # confirmed publishes (minting, renewals)
        self._held: dict[str, set[int]] = {}
        self._generation = 0  # of the connection: a permit of an earlier one is not held any more
        self._declared: set[str] = set()
        self._closed = False
        self._keeper: threading.Thread | None = None
        self._stop = threading.Event()

    def _open(self) -> Any:
        if self._closed:
            raise PermitLostError("the Permits is closed")
        if self._connection is None:
            self._connect()
            with map_exceptions(url=self.url):
                self._connection = self._kombu.connection  # the py-amqp connection
                self._tokens = self._connection.channel()
                self._tokens.basic_qos(0, 1, False)  # a waiting acquire receives one token at a time
            if self._keeper is None:
                self._keeper = threading.Thread(target=self._keep, name="ojs-permits-keeper", daemon=True)
                self._keeper.start()
        return self._connection

    def _connect(self) -> None:
        """Connect to the first node that answers, each node tried once (see the module).

        Raises:
            BrokerConnectionError: no node answered.
            BrokerRefusedError: a permanent refusal (403, 530, a failed TLS verification), at once.
        """
        retry = Reconnector(OnePass(len(self._failover.urls)), self._failover, url=self.url, name="permits connection")
        while True:
            retry.connecting()
            try:
                self._failover.connect(self._kombu)
            except (OSError, *self._kombu.connection_errors) as exc:
                self._kombu.collect()
                retry.failed(exc, self._kombu)  # the next node at once (0 s), or raises once all failed
                continue
            retry.succeeded()
            return

    def _control_channel(self) -> Channel:
        if self._control is None or not self._control.is_open:
            self._control = self._open().channel()
        return self._control

    def _publish_channel(self) -> Channel:
        if self._publisher is None or not self._publisher.is_open:
            self._publisher = self._open().channel()
            self._publisher.confirm_select()
        return self._publisher

    def _keep(self) -> None:
        while not self._stop.wait(1.0):
            with self._io:
                connection = self._connection
                if connection is None:
                    continue
                try:
                    connection.heartbeat_tick()
                    connection.drain_events(timeout=0.001)
                except TimeoutError:
                    pass
                except Exception as exc:  # noqa: BLE001 - the connection is gone; the broker returned our permits
                    logger.warning("permits: connection lost (%s); held permits went back to the broker", exc)
                    self._drop_connection()

    @contextmanager
    def _guarded(self) -> Iterator[None]:
        """Take the connection's turn; on an AMQP or socket failure, drop the connection and raise it typed.

        A failed connection or channel may have returned tokens this instance counts as held: the whole
        connection is dropped (the broker returns every token and removes every index consumer), so the
        permits it held read as lost (:attr:`Permit.held`), and the next call reconnects.
        """
        with self._io:
            try:
                with map_exceptions(url=self.url):
                    yield
            except OjsError:
                raise
            except Exception as exc:
                logger.warning("permits: %s; dropping the connection (its permits go back)", exc)
                self._drop_connection()
                raise BrokerConnectionError(f"permits on {safe_url(self.url)}: {type(exc).__name__}: {exc}") from exc

    def _drop_connection(self) -> None:
        try:
            self._kombu.collect()
        except Exception:  # noqa: BLE001
            pass
        self._failover.failed(self._kombu)  # a loss counts against its node: the next pass starts on the next one
        self._forget()

    def _forget(self) -> None:
        self._connection = self._tokens = self._control = self._publisher = None
        self._spare.clear()
        self._declared.clear()
        self._held.clear()
        self._generation += 1

    def close(self) -> None:
        """Close the connection: every permit still held goes back to the broker (idempotent)."""
        self._stop.set()
        with self._io:
            self._closed = True
            if self._connection is not None:
                try:
                    self._kombu.release()
                except Exception:  # noqa: BLE001 - closing a broken connection
                    pass
                self._forget()

    def _declare_queue(self, queue: str, arguments: dict[str, Any]) -> None:
        if queue in self._declared:
            return
        try:
            self._control_channel().queue_declare(
                queue, durable=True, auto_delete=False, exclusive=False, arguments=arguments
            )
        except PreconditionFailed as exc:
            self._control = None
            raise parse_precondition_failed(queue, str(exc.reply_text or exc)) from exc
        self._declared.add(queue)

    def _try_hold(self, queue: str) -> Hold | None:
        """Subscribe an exclusive consumer to the marker ``queue``; None when another consumer has it."""
        self._declare_queue(queue, _MARKER_ARGUMENTS)
        channel = self._spare.pop() if self._spare else self._open().channel()
        try:
            tag = channel.basic_consume(queue, callback=_unexpected, no_ack=True, exclusive=True)
        except AccessRefused as exc:
            if "exclusive use" not in str(exc.reply_text or exc):
                raise
            return None  # the refusal closed the channel
        return Hold(channel, tag)

    def _unhold(self, hold: Hold) -> None:
        hold.channel.basic_cancel(hold.tag)
        self._spare.append(hold.channel)


__all__ = ["Hold", "PermitConnection"]
