"""The ``ojs://`` / ``ojss://`` kombu transports and their py-amqp connection."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from amqp.exceptions import RecoverableConnectionError
from kombu.transport import TRANSPORT_ALIASES, pyamqp

from ojs_kombu.amqp.connection import DEFAULT_HEARTBEAT, transport_tls_options
from ojs_kombu.amqp.framing import FrameReader, attach_reader
from ojs_kombu.amqp.outbox import outbox
from ojs_kombu.amqp.permits import Permits
from ojs_kombu.amqp.urls import split_urls
from ojs_kombu.transport.channel import Channel
from ojs_kombu.transport.completed import CompletedLogs
from ojs_kombu.transport.queues import QueueMap, queue_map
from ojs_kombu.transport.settings import OJS_OPTIONS, Settings
from ojs_kombu.transport.state import ConnectionState
from ojs_kombu.wire.completed import CompletedOptions

logger = logging.getLogger(__name__)


class Connection(pyamqp.Connection):
    """A py-amqp connection carrying the OJS state of its channels.

    Parameters:
        ojs_settings: the OJS options of the kombu connection.
        ojs_queues: the :class:`QueueMap` of their prefix.
        ojs_completed: the transport's completed job ids (option ``deduplicate``), or None.
        *args, **kwargs: py-amqp's.
    """

    Channel = Channel

    def __init__(
        self,
        *args: Any,
        ojs_settings: Settings,
        ojs_queues: QueueMap,
        ojs_completed: CompletedLogs | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.ojs = ConnectionState(self, ojs_settings, ojs_queues, ojs_completed)
        #: Buffered frame reading (plain TCP), attached by the transport once connected.
        self.frame_reader: FrameReader | None = None


class _LoopWaker:
    """Makes kombu's event loop poll once without waiting: a pipe's write end, always writable,
    watched until the poll reports it.

    The loop computes its poll timeout before its tick callbacks run, so work a tick callback
    schedules (``call_soon``, a timer) would wait for that poll to time out.
    """

    def __init__(self, loop: Any):
        self._loop = loop
        self._fds: tuple[int, int] | None = None
        self._watching = False

    def wake(self) -> None:
        """Have the loop's next poll return at once."""
        if self._watching:
            return
        if self._fds is None:
            self._fds = os.pipe()
        self._watching = True
        self._loop.add_writer(self._fds[1], self._woken)

    def _woken(self) -> None:
        self._watching = False
        if self._fds is not None:
            self._loop.remove_writer(self._fds[1])

    def close(self) -> None:
        """Stop watching and close the pipe."""
        if self._fds is not None:
            if self._watching:
                self._loop.remove_writer(self._fds[1])
            for fd in self._fds:
                os.close(fd)
            self._fds, self._watching = None, False


class _ThreadWaker:
    """Lets any thread have kombu's event loop call ``callback`` soon: a pipe whose read end the loop watches.

    The completed-ids logs confirm records in their own threads; the acks that follow are the
    loop's to send (:meth:`ConnectionState.ack_recorded <ojs_kombu.transport.state.ConnectionState.ack_recorded>`).
    """

    def __init__(self, loop: Any, callback: Any):
        self._loop = loop
        self._callback = callback
        self._lock = threading.Lock()
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        loop.add_reader(self._read, self._readable)

    def wake(self) -> None:
        """From any thread: the loop calls the callback once it next polls."""
        with self._lock:  # never a write to a closed (or reused) descriptor
            if self._write >= 0:
                try:
                    os.write(self._write, b"x")
                except BlockingIOError:
                    pass  # full: a wake-up is pending anyway

    def _readable(self) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        self._callback()

    def close(self) -> None:
        """Stop watching and close the pipe (idempotent)."""
        with self._lock:
            if self._write < 0:
                return
            self._loop.remove_reader(self._read)
            os.close(self._read)
            os.close(self._write)
            self._read = self._write = -1


def _amqp_urls(client: Any) -> str:
    """The ``amqp://`` (``amqps://``) URLs of a kombu connection's nodes, ``;``-separated, for connections of our own."""
    urls = [str(url) for url in client.alt] if client.alt else [client.as_uri(include_password=True)]
    schemes = {"ojs": "amqp", "ojss": "amqps"}
    converted = []
    for url in urls:
        scheme, sep, rest = url.partition("://")
        converted.append(f"{schemes.get(scheme, scheme)}{sep}{rest}")
    return ";".join(converted)


#: For annotations inside :class:`Transport`, whose ``Connection`` attribute shadows the class.
_OjsConnection = Connection


class Transport(pyamqp.Transport):
    """``ojs://``: AMQP 0-9-1 over py-amqp speaking the OJS binding (see :mod:`ojs_kombu.transport`)."""

    Connection = Connection
    driver_name = "ojs"

    def __init__(self, client: Any, **kwargs: Any):
        if not client.heartbeat:
            client.heartbeat = DEFAULT_HEARTBEAT
        if client.alt:
            split_urls(client.alt)  # a failover list (Celery's list or ';' broker_url) is checked up front
        super().__init__(client, **kwargs)  # type: ignore[no-untyped-call]
        self.settings = Settings.from_options(client.transport_options or {})
        # Held here: the prefix's map lives as long as a kombu connection of that prefix.
        self.queue_map = queue_map(self.settings.names.prefix)
        #: The completed job ids of the job queues consumed (option ``deduplicate``), made with the first connection.
        self.completed: CompletedLogs | None = None
        #: The permits of jobs with a rate limit (a connection of their own, opened by the first limited job).
        self._permits: Permits | None = None
        self._permits_lock = threading.Lock()
        self._permits_options: tuple[str, Any] | None = None  # the URLs and the TLS options it connects with

    def establish_connection(self) -> _OjsConnection:
        """Connect, like py-amqp's transport, with the OJS settings attached to the connection."""
        conninfo: Any = self.client
        for name, default_value in self.default_connection_params.items():
            if not getattr(conninfo, name, None):
                setattr(conninfo, name, default_value)
        # The certificate carries the URL's name: fill it in before "localhost" becomes an address.
        # In a copy, per attempt: kombu would keep the first node's name for every node of a failover list.
        ssl = conninfo.ssl
        if isinstance(ssl, dict) and ssl.get("server_hostname", "") is None:
            ssl = {**ssl, "server_hostname": conninfo.hostname}
        if conninfo.hostname == "localhost":
            conninfo.hostname = "127.0.0.1"
        password = conninfo.password() if callable(conninfo.password) else conninfo.password
        opts = dict(
            {
                "host": conninfo.host,
                "userid": conninfo.userid,
                "password": password,
                "login_method": conninfo.login_method,
                "virtual_host": conninfo.virtual_host,
                "insist": conninfo.insist,
                "ssl": ssl,
                "connect_timeout": conninfo.connect_timeout,
                "heartbeat": conninfo.heartbeat,
            },
            **{k: v for k, v in (conninfo.transport_options or {}).items() if k not in OJS_OPTIONS},
        )
        if self.settings.deduplicate and self.completed is None:
            self.completed = CompletedLogs(
                _amqp_urls(conninfo),
                self.settings.names,
                self.settings.completed_options or CompletedOptions(),
                ssl=conninfo.ssl or None,
                heartbeat=float(conninfo.heartbeat),
            )
        conn = self.Connection(
            ojs_settings=self.settings, ojs_queues=self.queue_map, ojs_completed=self.completed, **opts
        )
        conn.client = self.client
        self._permits_options = (_amqp_urls(conninfo), conninfo.ssl or None)
        conn.ojs.permits = self.permits
        conn.connect()
        conn.frame_reader = attach_reader(conn)
        return conn

    def permits(self) -> Permits:
        """The permits of this transport's jobs with a rate limit (:class:`~ojs_kombu.runtime.limits.Limiter`),
        made on first use, shared by its connections.

        Returns:
            The permits (they connect on first use).
        """
        with self._permits_lock:
            if self._permits is None:
                urls, ssl = self._permits_options or (_amqp_urls(self.client), None)
                self._permits = Permits(urls, names=self.settings.names, ssl=ssl, connection_name="ojs:// permits")
            return self._permits

    def register_with_event_loop(self, connection: _OjsConnection, loop: Any) -> None:
        """Read the socket from kombu's event loop (Celery's worker), and never sleep on buffered frames.

        :class:`FrameReader` reads ahead: any read of the connection outside
        :meth:`on_readable` (a synchronous reply such as ``Basic.ConsumeOk``, a
        confirm wait, a ``drain_events``) can leave complete frames in its
        buffer, and buffered bytes do not make the socket readable.  So the
        buffer is dispatched on every tick of the loop, right before it polls.
        """
        super().register_with_event_loop(connection, loop)  # type: ignore[no-untyped-call]
        reader = connection.frame_reader
        # The acks this thread makes are kept in the connection's outbox and written once per
        # tick, right before the loop polls (see Channel.basic_ack).
        batch = outbox(connection)
        batch.defer_from(threading.get_ident())

        waker = _LoopWaker(loop)
        state = connection.ojs
        recorded_waker: _ThreadWaker | None = None

        def retire() -> None:  # this connection is gone
            loop.on_tick.discard(tick)
            timer.cancel()
            waker.close()
            if recorded_waker is not None:
                state.wake = None
                recorded_waker.close()

        def maintain() -> None:
            if not connection.connected:
                retire()
                return
            connection.ojs.maintain()

        def tick() -> None:
            if connection.frame_reader is not reader or not connection.connected:
                retire()
                return
            if reader is not None and reader.has_frame():
                while reader.has_frame():
                    reader.dispatch()
                # What those frames' callbacks scheduled (Celery's acks and ETA timers go through
                # the loop) would otherwise wait for the poll that follows: up to a second.
                waker.wake()
            connection.ojs.maintain()
            batch.flush()

        # Acks follow confirms read in the logs' threads; parked jobs are admitted by their waiter threads.
        recorded_waker = _ThreadWaker(loop, maintain)
        state.wake = recorded_waker.wake

        # On every tick, right before the loop polls: the frames read ahead, the control plane
        # (a pause applies right after the frame that carried it), the acks of this pass.  And
        # at least every second: an idle loop may sleep for seconds, and re-reading a control
        # stream is due later.
        loop.on_tick.add(tick)
        timer = loop.call_repeatedly(1.0, maintain)

        def closing(_: Any) -> None:
            # kombu runs the callbacks still due (Celery's last acks) after these, and no tick
            # follows: from now on acks are written at once, and what is held goes now.
            loop.on_close.discard(closing)
            waker.close()
            if recorded_waker is not None:
                state.wake = None
                recorded_waker.close()
            batch.defer_from(None)
            if connection.connected:
                try:
                    batch.flush()
                except OSError as exc:  # the connection is lost: the broker redelivers them
                    logger.warning("could not write the last acks before the event loop closed: %r", exc)

        loop.on_close.add(closing)

    def on_readable(self, connection: _OjsConnection, loop: Any) -> None:
        """The event loop's read callback: every complete frame the socket holds, from one ``recv``.

        Instead of kombu's one ``drain_events(timeout=0)`` per frame (about half
        the CPU per delivery, see :mod:`ojs_kombu.amqp.framing`).  Frames a
        callback reads ahead are dispatched by the loop's tick (see
        :meth:`register_with_event_loop`).
        """
        reader = connection.frame_reader
        if reader is None:
            super().on_readable(connection, loop)  # type: ignore[no-untyped-call]
            return
        if not connection.connected:
            raise RecoverableConnectionError("Socket was disconnected")
        if not reader.has_frame():
            reader.fill()
        reader.dispatch()

    def drain_events(self, connection: _OjsConnection, **kwargs: Any) -> Any:
        """py-amqp's ``drain_events``, then the connection's control-plane upkeep (pauses and resumes)."""
        try:
            return connection.drain_events(**kwargs)
        finally:
            if connection.connected:
                connection.ojs.maintain()

    def close_connection(self, connection: _OjsConnection) -> None:
        """Close the connection; with ``deduplicate``, its logs first (their last records confirmed, then acked)."""
        completed = self.completed
        if completed is not None and completed.logs:
            completed.stop()
            if connection.connected:
                try:
                    connection.ojs.maintain()  # the acks of what the logs confirmed while stopping
                except Exception as exc:  # noqa: BLE001 - closing anyway: the broker redelivers them
                    logger.warning("could not write the last acks before closing: %r", exc)
        super().close_connection(connection)  # type: ignore[no-untyped-call]
        with self._permits_lock:
            permits, self._permits = self._permits, None
        if permits is not None:
            permits.close()  # the permits still held go back to the broker

    def qos_semantics_matches_spec(self, connection: _OjsConnection) -> bool:
        """Per-consumer prefetch: Celery then sends ``global=False`` itself."""
        return True


class SSLTransport(Transport):
    """``ojss://``: the same over TLS (port 5671 by default)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        client: Any = self.client
        # TLS on, verifying the chain and the host name (py-amqp's ssl=True checks no host name).
        client.ssl = transport_tls_options(client.ssl)


def register_aliases() -> None:
    """Register ``ojs`` and ``ojss`` in kombu's transport alias table (idempotent)."""
    TRANSPORT_ALIASES.setdefault("ojs", "ojs_kombu.transport:Transport")
    TRANSPORT_ALIASES.setdefault("ojss", "ojs_kombu.transport:SSLTransport")


__all__ = ["Connection", "SSLTransport", "Transport", "register_aliases"]
