"""The one broker session a :class:`~ojs_kombu.client.Client`'s services share: settings, pool, retry.

A :class:`Session` holds what every capability service needs: the names and the
topology of this client, its publishing settings, a kombu connection pool and the
reconnect primitive (:mod:`ojs_kombu.amqp.reconnect`, :class:`~ojs_kombu.amqp.reconnect.Budgeted`
by ``publish_timeout`` and ``connect_retries``).  A service runs its broker work as
``session.run(operation)``: ``operation(conn)`` gets a pooled, connected kombu
connection, and :meth:`Session.publisher` the confirm-mode publisher living on it.

Each thread that runs an operation takes its own pooled connection, so a channel is
never used by two threads at once (AMQP-028).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from kombu.connection import Connection

from ojs_kombu.amqp.errors import map_exceptions
from ojs_kombu.amqp.failover import ConnectionSettings
from ojs_kombu.amqp.publisher import ConfirmedPublisher
from ojs_kombu.amqp.reconnect import Budgeted, Reconnector
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.amqp.urls import safe_url
from ojs_kombu.errors import BrokerRefusedError, OjsError, PublishError, ValidationError
from ojs_kombu.policy.schedule import Cascade

logger = logging.getLogger(__name__)

T = TypeVar("T")

# The attribute of a pooled kombu connection that holds its _Pooled state.
_STATE = "_ojs_session"


class _Pooled:
    """What lives on one pooled connection: its publisher (made on first use) and when it last worked."""

    __slots__ = ("last_used", "publisher")

    def __init__(self) -> None:
        self.publisher: ConfirmedPublisher | None = None
        self.last_used = time.monotonic()


class Session:
    """The connection pool, the reconnect policy and the settings shared by a client's services.

    Parameters:
        connection: the broker URL(s) and connection options.
        topology: the declarations (per-client cache of what is declared) and their names.
        declare: declare a job queue before the first publish to it.
        confirm_timeout: seconds to wait for publisher confirms.
        publish_timeout: seconds an operation keeps reconnecting (None: no limit).
        connect_retries: reconnections allowed per operation (None: no limit but the time).
        app_id: ``app_id`` property of published jobs.
        window: publishes a connection may have awaiting their confirm.

    Raises:
        ValidationError: a bad ``publish_timeout`` or ``connect_retries``, or a bad failover list.
    """

    def __init__(
        self,
        connection: ConnectionSettings,
        topology: Topology,
        *,
        declare: bool,
        confirm_timeout: float,
        publish_timeout: float | None,
        connect_retries: int | None,
        app_id: str | None,
        window: int,
    ):
        if publish_timeout is not None and not publish_timeout > 0:
            raise ValidationError(
                f"publish_timeout must be > 0 seconds or None, got {publish_timeout!r}", field="publish_timeout"
            )
        if connect_retries is not None and connect_retries < 0:
            raise ValidationError(
                f"connect_retries must be >= 0 or None, got {connect_retries!r}", field="connect_retries"
            )
        self.url = connection.url
        self.heartbeat = connection.heartbeat
        self.connection_name = connection.connection_name
        self.names = topology.names
        self.topology = topology
        self.cascade = Cascade(topology.names)
        self.declare = declare
        self.confirm_timeout = confirm_timeout
        self.publish_timeout = publish_timeout
        self.connect_retries = connect_retries
        self.app_id = app_id
        self.window = window
        self.failover = connection.failover()
        self._connection = self.failover.connection()
        self._pool = self._connection.Pool(limit=connection.pool_size)
        self.closed = False

    # -- running operations --------------------------------------------------------------------

    def run(self, operation: Callable[[Connection], T]) -> T:
        """Run ``operation(conn)`` on a pooled, connected connection, reconnecting under the budget.

        Connection errors are retried with the back-off of DESIGN §9 for at most
        ``publish_timeout`` seconds (and ``connect_retries`` times), counted from the
        start of the first attempt that failed; then :class:`BrokerConnectionError`.
        A permanent refusal is raised at once (:mod:`ojs_kombu.amqp.reconnect`).  A
        channel error (e.g. a deleted exchange: 404) drops the channel, forgets the
        declared topology and is retried once at once.  A connection on which a
        publisher confirm timed out is dropped: the next operation starts on a fresh one.

        Parameters:
            operation: the broker work; called again from the start after a reconnect.

        Raises:
            OjsError: the session is closed.
            BrokerConnectionError, BrokerRefusedError: as above.
            PublishError: a second channel error in a row.
        """
        if self.closed:
            raise OjsError("the client is closed")
        reconnector = Reconnector(Budgeted(self.publish_timeout, self.connect_retries), self.failover, url=self.url)
        channel_retry = False
        while True:
            conn = self._pool.acquire(block=True)
            try:
                with map_exceptions(url=self.url):
                    self._connect(conn, reconnector)
                    return operation(conn)
            except BrokerRefusedError:
                self.drop(conn)
                raise
            except conn.connection_errors as exc:
                self.drop(conn)
                time.sleep(reconnector.failed(exc, conn))
            except conn.channel_errors as exc:
                self.drop(conn)
                if channel_retry:
                    raise PublishError(f"the broker closed the channel: {exc}") from exc
                channel_retry = True
                self.topology.forget()
                logger.warning("channel error (%s); re-declaring topology and retrying", exc)
            finally:
                self._drop_if_confirms_timed_out(conn)
                self._used(conn)  # unless dropped: the connection worked
                conn.release()

    def _connect(self, conn: Connection, reconnector: Reconnector) -> None:
        self._drop_if_idle(conn)
        if not conn.connected:
            reconnector.connecting()
            self.failover.connect(conn, timeout=reconnector.attempt_timeout(self._connection.connect_timeout))
            reconnector.succeeded()

    # -- the pooled connections ----------------------------------------------------------------

    def publisher(self, conn: Connection) -> ConfirmedPublisher:
        """The confirm-mode publisher of ``conn`` (connected by :meth:`run`), created on first use."""
        state = self._state(conn)
        if state.publisher is None or not state.publisher.is_open:
            state.publisher = ConfirmedPublisher(conn.connection, window=self.window)
        return state.publisher

    @staticmethod
    def _state(conn: Connection) -> _Pooled:
        state: _Pooled | None = getattr(conn, _STATE, None)
        if state is None:
            state = _Pooled()
            setattr(conn, _STATE, state)
        return state

    def _used(self, conn: Connection) -> None:
        state: _Pooled | None = getattr(conn, _STATE, None)
        if state is not None:
            state.last_used = time.monotonic()

    def _drop_if_idle(self, conn: Connection) -> None:
        state: _Pooled | None = getattr(conn, _STATE, None)
        if state is not None and time.monotonic() - state.last_used > self.heartbeat:
            # An idle pooled connection has sent no heartbeats; the broker may have
            # closed it.  Start afresh rather than find out on the next publish.
            self.drop(conn)

    def _drop_if_confirms_timed_out(self, conn: Connection) -> None:
        state: _Pooled | None = getattr(conn, _STATE, None)
        if state is not None and state.publisher is not None and state.publisher.timed_out:
            # A node that confirms nothing (cut off from its cluster's majority, or blocked by
            # an alarm) would fail every later publish too: leave it, for the next node if any.
            logger.warning(
                "publisher confirms timed out; dropping the connection to %s", safe_url(self.failover.current)
            )
            self.failover.failed(conn)
            self.drop(conn)

    def drop(self, conn: Connection) -> None:
        """Close ``conn`` without a handshake and forget its publisher; the pool reconnects it on next use."""
        state: _Pooled | None = getattr(conn, _STATE, None)
        setattr(conn, _STATE, None)
        if state is not None and state.publisher is not None and not state.publisher.timed_out:
            state.publisher.close()  # not when the node stopped answering: Channel.Close would wait
        try:
            conn.collect()
        except Exception:  # noqa: BLE001
            pass

    def close(self) -> None:
        """Close every pooled connection.  Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._pool.force_close_all()
        self._connection.release()


class Service:
    """Base of a capability service (publishing, control, …): it works through the shared session.

    Parameters:
        session: the client's session.
    """

    def __init__(self, session: Session):
        self.session = session


__all__ = ["ConnectionSettings", "Service", "Session"]
