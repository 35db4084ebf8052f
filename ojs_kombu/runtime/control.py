"""The worker side of the control plane: CANCEL (binding §5.6, AMQP-019), PAUSE and RESUME (DESIGN §14).

Every worker reads the control stream ``ojs.queue.control.{q}`` of every queue it
serves, from the start of the stream's retention (``x-stream-offset: first``), so
it knows every cancel still retained, including those published before it started.

* :class:`CancelledIds` is the bounded set of cancelled job ids.  Memory: about
  180 bytes per id (measured 176: a 36-character ``str`` of 85 bytes plus its
  ordered-dict slot); the default bound of 1,000,000 ids is ~180 MB at most, and the stream's
  retention (``ControlOptions.max_length_bytes``, 50 MB ≈ 135,000 cancels by
  default) bounds it far lower in practice.  Past the bound the oldest id goes.
* :class:`Cancellations` is what a worker knows: the cancelled ids, and the jobs
  running now.  Cancelling a running job sets its ``cancelled`` event and, in
  ``"interrupt"`` mode, raises :class:`~ojs_kombu.errors.Cancelled` in the
  handler's thread with ``PyThreadState_SetAsyncExc`` (what Dramatiq's
  ``TimeLimit`` does).  The exception is delivered when that thread next runs
  Python bytecode: a handler blocked in C (``time.sleep``, a socket read) is
  interrupted only when that call returns, and, as with ``TimeLimit``, it can
  land anywhere in the handler's Python code (inside a ``with`` block or a
  ``finally``): handlers that must not be cut short use ``"cooperative"``.
* :class:`PausedQueues` is the set of queues paused by ``ojs.control.pause`` (and
  un-paused by ``ojs.control.resume``).  The reader only records the state; the
  :class:`~ojs_kombu.runtime.consumer.Consumer` loop applies it on its next pass:
  ``Basic.Cancel`` of the paused queue's consumer (in-flight deliveries are still
  settled on the same channel), ``Basic.Consume`` with the same prefetch on resume.
  Each pause or resume applies to the queue of the control stream it was read
  from.  The replay at start-up (and after a reconnect) applies every pause and
  resume in stream order, so the last one of each queue decides before any job
  queue is consumed: a worker started while its queue is paused never consumes it.
* INFO (binding §5.8, AMQP-021): a request read live, for a job the worker knows
  (``info``: its :class:`~ojs_kombu.runtime.activity.Activity`), is answered on the
  control channel, in the loop thread, through the default exchange with routing
  key = its ``reply_to`` and its ``correlation_id`` echoed.  Requests read while
  catching up (replayed at start-up or after a reconnect) or older than
  ``info_max_age`` seconds by their ``timestamp`` are ignored, as are requests for
  unknown jobs (no answer: the client's timeout says "nobody knows") and malformed
  ones (no ``reply_to`` or ``job_id``: logged).
* :class:`ControlReader` consumes the control streams on the
  :class:`~ojs_kombu.runtime.consumer.Consumer`'s connection, on a channel of
  its own, in the consumer's loop thread (the connection's one owner).

Catching up: :meth:`ControlReader.attach` runs on every (re)connection before the
consumer registers on any job queue.  It publishes a marker (``type=
ojs.control.marker``, a fresh ``message_id``) to each control stream, consumes
from ``first``, and returns once it has read its own markers back: a stream is
ordered, so everything published before the marker has been applied.  Other
readers ignore markers (one ~200-byte record per worker start, trimmed with the
rest).  Replaying is idempotent, so a reconnect simply replays again.

Degraded mode (the control queue exists as a classic queue, see
:class:`~ojs_kombu.amqp.topology.Topology`): the reader declares an exclusive,
server-named queue bound to ``ojs.exchange.direct`` with key ``control.{q}``.
Cancels published while no worker is connected are lost, and a worker started
after a cancel does not know it.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from amqp import Message
from amqp.channel import Channel
from amqp.exceptions import RecoverableConnectionError

from ojs_kombu.amqp.errors import consuming
from ojs_kombu.amqp.properties import WireMessage
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.errors import Cancelled, DecodeError, ValidationError
from ojs_kombu.model.info import JobInfo
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import (
    CONTROL_TYPE_CANCEL,
    CONTROL_TYPE_INFO,
    CONTROL_TYPE_PAUSE,
    CONTROL_TYPE_RESUME,
    Names,
)
from ojs_kombu.model.timefmt import utcnow
from ojs_kombu.observability.logs import job_log_extra, message_log_extra
from ojs_kombu.observability.metrics import METRICS
from ojs_kombu.wire.control import CONTROL_TYPE_MARKER, ControlMessage, control_message, decode_control, info_reply

logger = logging.getLogger(__name__)

CancelRunning = Literal["interrupt", "cooperative"]
"""What cancelling a running job does besides setting ``current_job().cancelled``."""

CANCEL_RUNNING_CHOICES: tuple[str, ...] = get_args(CancelRunning)

#: Seconds after which an INFO request is stale (its asker has given up): not answered.
DEFAULT_INFO_MAX_AGE = 5.0

#: Default bound of :class:`CancelledIds` (see the module docstring for the memory it means).
DEFAULT_MAX_CANCELLED_IDS = 1_000_000


class CancelledIds:
    """A thread-safe, insertion-ordered set of job ids holding at most ``limit`` (oldest evicted).

    Parameters:
        limit: the most ids kept.
    """

    def __init__(self, limit: int = DEFAULT_MAX_CANCELLED_IDS):
        if limit < 1:
            raise ValidationError("the cancelled-id limit must be at least 1", field="limit")
        self.limit = limit
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, job_id: str) -> bool:
        """Add ``job_id``; returns False when it was already there."""
        with self._lock:
            if job_id in self._ids:
                return False
            self._ids[job_id] = None
            while len(self._ids) > self.limit:
                self._ids.popitem(last=False)
            return True

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._ids  # a dict lookup is atomic under the GIL

    def __len__(self) -> int:
        return len(self._ids)


@dataclass(eq=False)
class RunningEntry:
    """A job a handler thread is running: its ``cancelled`` event and its thread.

    The event is made when first asked for (a ``threading.Event`` costs 2 µs, and most runs
    are never cancelled nor look): :attr:`is_cancelled` is the flag the worker reads.

    Parameters:
        job_id: the job's id (lowercase).
        queue: its OJS queue (logs).
        thread_id: the handler's thread.
        aliases: other ids a cancel may name it by (a Dramatiq message id).
        lock: guards the flag, the event and the fields a cancel reads (the
            :class:`Cancellations`' own lock; default: a new one).
    """

    job_id: str
    queue: str
    thread_id: int
    interrupted: bool = False
    active: bool = True  # False once the handler has returned: never interrupt it after
    interruptible: bool = True  # False once the handler has ended, before its run is left (see Cancellations.ended)
    aliases: tuple[str, ...] = ()  # other ids a cancel may name it by (a Dramatiq message id)
    # A coroutine job's interruption (cancel its task), in place of an exception raised in the thread.
    interrupt: Callable[[], None] | None = field(default=None, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _is_cancelled: bool = field(default=False, init=False, repr=False)
    _event: threading.Event | None = field(default=None, init=False, repr=False)

    @property
    def keys(self) -> tuple[str, ...]:
        """Every id a cancel of this job may carry."""
        return (self.job_id, *self.aliases)

    @property
    def is_cancelled(self) -> bool:
        """Whether the job has been cancelled (what :attr:`cancelled` says, without making it)."""
        return self._is_cancelled

    @property
    def cancelled(self) -> threading.Event:
        """The run's ``cancelled`` event (``current_job().cancelled``, Dramatiq's
        ``current_cancelled()``): set when the job is cancelled, the same object for the whole run.

        Returns:
            The event, set already when the job was cancelled before it was first asked for.
        """
        event = self._event
        if event is None:
            with self.lock:
                event = self._event
                if event is None:
                    event = threading.Event()
                    if self._is_cancelled:
                        event.set()
                    self._event = event
        return event

    def _set_cancelled(self) -> None:
        """Mark the run cancelled (the caller holds :attr:`lock`)."""
        self._is_cancelled = True
        if self._event is not None:
            self._event.set()


class Cancellations:
    """What a worker knows about cancels: the cancelled ids and the jobs running now.

    Parameters:
        mode: ``"interrupt"`` (raise :class:`~ojs_kombu.errors.Cancelled` in a running
            handler) or ``"cooperative"`` (only set its ``cancelled`` event).
        limit: bound of the cancelled-id set.

    Raises:
        ValidationError: ``mode`` is not one of :data:`CancelRunning`.
    """

    def __init__(self, mode: CancelRunning | str = "interrupt", *, limit: int = DEFAULT_MAX_CANCELLED_IDS):
        if mode not in CANCEL_RUNNING_CHOICES:
            raise ValidationError(
                f"cancel_running must be one of {', '.join(map(repr, CANCEL_RUNNING_CHOICES))}, got {mode!r}",
                field="cancel_running",
            )
        self.mode = mode
        self.ids = CancelledIds(limit)
        self._running: dict[str, list[RunningEntry]] = {}
        self._lock = threading.Lock()  # guards _running and every RunningEntry (its lock): flags, event

    def is_cancelled(self, job_id: str) -> bool:
        """Whether ``job_id`` has been cancelled."""
        return job_id.lower() in self.ids

    def cancel(self, job_id: str) -> None:
        """Record a cancel; signal (and in ``"interrupt"`` mode interrupt) the job if it is running here."""
        job_id = job_id.lower()
        self.ids.add(job_id)
        with self._lock:
            for entry in self._running.get(job_id, ()):
                if entry.is_cancelled:
                    continue
                entry._set_cancelled()
                if self.mode == "interrupt" and entry.active and entry.interrupt is not None:
                    entry.interrupt()
                elif self.mode == "interrupt" and entry.active and entry.interruptible:
                    entry.interrupted = _raise_in_thread(entry.thread_id, Cancelled)
                logger.info(
                    "job %s cancelled while running%s",
                    job_id,
                    "; interrupting its handler" if entry.interrupted else "",
                    extra=message_log_extra(job_id, entry.queue),
                )

    def running(self, job_id: str, queue: str) -> RunningScope:
        """Register the calling thread as running ``job_id`` for the ``with`` block.

        The event is set already when the job was cancelled before it started.  On
        leaving, an interruption that has not been delivered yet is withdrawn, so
        :class:`~ojs_kombu.errors.Cancelled` never escapes into the worker's own code.

        Parameters:
            job_id: the job's id.
            queue: its OJS queue (logs).

        Returns:
            A context manager whose ``with`` block is the run; ``as`` gives its :class:`RunningEntry`.
        """
        return RunningScope(self, job_id, queue)

    def enter(
        self,
        job_id: str,
        queue: str,
        *,
        aliases: Iterable[str] = (),
        interrupt: Callable[[], None] | None = None,
    ) -> RunningEntry:
        """Register the calling thread as running ``job_id``, until :meth:`leave`: :meth:`running`
        for frameworks whose hooks bracket a handler (Dramatiq's middleware).

        Parameters:
            job_id: the job's id.
            queue: its OJS queue (logs).
            aliases: other ids a cancel may name the job by (a Dramatiq message id).
            interrupt: how ``"interrupt"`` mode interrupts this run (a coroutine job: cancel its
                task); the thread is then never interrupted.  Not called for a job cancelled
                before it entered: check the entry's ``is_cancelled``.

        Returns:
            The entry, its ``cancelled`` event set already when the job was cancelled before.
        """
        job_id = job_id.lower()
        others = tuple(dict.fromkeys(k for k in map(str.lower, aliases) if k != job_id)) if aliases else ()
        entry = RunningEntry(
            job_id,
            queue,
            threading.get_ident(),
            interruptible=interrupt is None,
            aliases=others,
            interrupt=interrupt,
            lock=self._lock,
        )
        ids = self.ids
        with self._lock:
            for key in entry.keys:
                self._running.setdefault(key, []).append(entry)
            if job_id in ids or (others and any(key in ids for key in others)):
                entry._set_cancelled()
        return entry

    def leave(self, entry: RunningEntry) -> None:
        """Unregister ``entry`` (from its own thread), withdrawing an undelivered interruption.

        Idempotent.  A :class:`~ojs_kombu.errors.Cancelled` delivered while leaving is swallowed:
        the interruption has done its work.
        """
        while True:
            try:
                self._leave(entry)
                break
            except Cancelled:
                continue

    def ended(self, entry: RunningEntry) -> None:
        """The handler of ``entry`` has returned or raised: never interrupt its thread from now on.

        For a framework that runs its own code between the handler and the end of the
        run (Dramatiq formats and logs the handler's exception there): an interruption
        landing in that code would kill the framework's thread.  A pending, undelivered
        interruption is withdrawn; the ``cancelled`` event stays set, so the run is still
        settled as cancelled.
        """
        with self._lock:
            entry.interruptible = False
            if entry.interrupted:
                _raise_in_thread(entry.thread_id, None)

    def _leave(self, entry: RunningEntry) -> None:
        with self._lock:
            if entry.active:  # once only: a second withdrawal could clear another interruption (TimeLimit's)
                entry.active = False
                if entry.interrupted:
                    _raise_in_thread(entry.thread_id, None)  # withdraw a pending, undelivered Cancelled
            for key in entry.keys:
                entries = self._running.get(key, [])
                if entry in entries:
                    entries.remove(entry)
                if not entries:
                    self._running.pop(key, None)


class RunningScope:
    """The ``with`` block of :meth:`Cancellations.running`: :meth:`~Cancellations.enter` on entry,
    :meth:`~Cancellations.leave` on exit (a class, not a generator: it runs per job).

    Parameters:
        cancellations: where the run is registered.
        job_id: the job's id.
        queue: its OJS queue (logs).
    """

    __slots__ = ("_cancellations", "_entry", "_job_id", "_queue")

    def __init__(self, cancellations: Cancellations, job_id: str, queue: str):
        self._cancellations = cancellations
        self._job_id = job_id
        self._queue = queue
        self._entry: RunningEntry | None = None

    def __enter__(self) -> RunningEntry:
        entry = self._entry = self._cancellations.enter(self._job_id, self._queue)
        return entry

    def __exit__(self, *exc_info: object) -> None:
        if self._entry is not None:
            self._cancellations.leave(self._entry)


def _raise_in_thread(thread_id: int, exc: type[BaseException] | None) -> bool:
    """Schedule ``exc`` in thread ``thread_id`` (None withdraws a pending one); True if a thread was found."""
    target = ctypes.py_object(exc) if exc is not None else None
    return bool(ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), target) == 1)


class PausedQueues:
    """The OJS queues paused through the control stream; thread-safe.

    :attr:`version` grows on every change, so the consumer loop applies the state
    only when it changed.
    """

    def __init__(self) -> None:
        self._paused: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self.version = 0

    def set(self, queue: str, paused: bool) -> bool:
        """Pause (``paused``) or resume ``queue``; returns whether its state changed."""
        with self._lock:
            if (queue in self._paused) == paused:
                return False
            self._paused = self._paused | {queue} if paused else self._paused - {queue}
            self.version += 1
            return True

    @property
    def queues(self) -> frozenset[str]:
        """The paused queues now."""
        return self._paused

    def __contains__(self, queue: object) -> bool:
        return queue in self._paused


class ControlReader:
    """Consumes the control queues of ``queues`` on a consumer's connection (see the module docstring).

    Parameters:
        names: the entity names.
        topology: tells whether each control queue is a stream or degraded.
        queues: the OJS queues whose control messages to read.
        cancellations: where cancels go.
        paused: where pauses and resumes go (a new, empty state by default).
        prefetch: ``Basic.Qos`` of the control channel (streams need one).
        replay_timeout: seconds :meth:`attach` waits for its markers before it gives up.
        info: what the worker knows about a job id (for INFO requests); ``None``: INFO is not answered.
        info_max_age: seconds after its ``timestamp`` an INFO request is no longer answered.
        on_other: called with ``(queue, message)`` for every control message of another type
            (e.g. the final-failure records the dead letter readers join); ``None``: ignored.
    """

    def __init__(
        self,
        names: Names,
        topology: Topology,
        queues: Iterable[str],
        cancellations: Cancellations,
        *,
        paused: PausedQueues | None = None,
        prefetch: int = 1000,
        replay_timeout: float = 60.0,
        info: Callable[[str], JobInfo | None] | None = None,
        info_max_age: float = DEFAULT_INFO_MAX_AGE,
        on_other: Callable[[str, ControlMessage], None] | None = None,
    ):
        self.names = names
        self.topology = topology
        self.queues = list(queues)
        self.cancellations = cancellations
        self.paused = paused if paused is not None else PausedQueues()
        self.prefetch = prefetch
        self.replay_timeout = replay_timeout
        self.info = info
        self.info_max_age = info_max_age
        self.on_other = on_other
        self._markers: dict[str, str] = {}  # marker message_id -> queue, until read back
        self._channel: Channel | None = None
        self._cancelled: dict[str, float] = {}  # queue -> when to consume its control queue again
        self.replayed = 0  # control messages read during the last catch-up
        self.retry_delay = 1.0
        self._ack_every = max(1, prefetch // 4)
        self._unacked = 0

    def attach(self, connection: Any, pump: Callable[[float], None] | None = None) -> Channel:
        """Open the control channel, consume every control queue, and wait until caught up.

        Parameters:
            connection: the consumer's open py-amqp connection (called in its loop thread).
            pump: reads and dispatches what arrives within at most the given seconds
                (the consumer's buffered frame reader); default ``connection.drain_events``.

        Returns:
            The control channel (it lives and dies with the connection).

        Raises:
            RecoverableConnectionError: the markers did not come back within
                ``replay_timeout`` (the consumer reconnects, and replays again).
        """
        channel: Channel = connection.channel()
        channel.auto_decode = False
        channel.basic_qos(0, self.prefetch, False)
        self._channel = channel
        self._markers.clear()
        self._cancelled.clear()
        self._unacked = 0
        self.replayed = 0
        started = time.monotonic()
        for queue in self.queues:
            self._consume(channel, queue)
        for queue in self.queues:
            marker = control_message(CONTROL_TYPE_MARKER, {"queue": queue})
            self._markers[marker.properties["message_id"]] = queue
            channel.basic_publish(
                WireMessage(marker.body, **marker.properties),
                exchange=self.names.direct_exchange,
                routing_key=self.names.control_routing_key(queue),
            )
        deadline = started + self.replay_timeout
        while self._markers:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RecoverableConnectionError(
                    f"the control queues of {', '.join(sorted(set(self._markers.values())))} were not "
                    f"replayed within {self.replay_timeout:.0f}s"
                )
            if pump is not None:
                pump(min(remaining, 1.0))
                continue
            try:
                connection.drain_events(timeout=min(remaining, 1.0))
            except TimeoutError:
                continue
        logger.info(
            "control plane caught up: %d message(s) replayed in %.3fs, %d cancelled id(s) known, paused: %s",
            self.replayed,
            time.monotonic() - started,
            len(self.cancellations.ids),
            ", ".join(sorted(self.paused.queues)) or "none",
        )
        return channel

    def _consume(self, channel: Channel, queue: str) -> None:
        if self.topology.control_is_stream(queue):
            amqp_queue = self.names.control_queue(queue)
            arguments: dict[str, Any] | None = {"x-stream-offset": "first"}
        else:
            amqp_queue, _, _ = channel.queue_declare("", durable=False, exclusive=True, auto_delete=True)
            channel.queue_bind(amqp_queue, self.names.direct_exchange, self.names.control_routing_key(queue))
            arguments = None
            logger.warning("control queue of %s is degraded: reading live control messages only (no replay)", queue)
        with consuming(amqp_queue):
            channel.basic_consume(
                amqp_queue,
                no_ack=False,
                callback=lambda message, q=queue: self._on_message(q, message),
                arguments=arguments,
                on_cancel=lambda tag, q=queue: self._on_cancel(q),
            )

    def _on_cancel(self, queue: str) -> None:
        logger.warning(
            "the broker cancelled the control consumer of %s (Basic.Cancel: the stream was deleted?); "
            "declaring and reading it again in %.1fs",
            queue,
            self.retry_delay,
        )
        self._cancelled[queue] = time.monotonic() + self.retry_delay

    def maintain(self, connection: Any) -> None:
        """Called by the consumer's loop on every pass: re-consume control queues the broker cancelled.

        The control queue is declared again and read again from its start (replaying is idempotent).
        """
        if not self._cancelled or self._channel is None:
            return
        now = time.monotonic()
        for queue, due in list(self._cancelled.items()):
            if due > now:
                continue
            del self._cancelled[queue]
            self.topology.declare(connection, self.topology.control_specs(queue), force=True)
            self._consume(self._channel, queue)
            logger.info("reading the control queue of %s again after a broker cancel", queue)

    def _on_message(self, queue: str, message: Message) -> None:
        self._unacked += 1
        if self._unacked >= self._ack_every and self._channel is not None:
            # A stream consumer's acks only return credit: one multiple-ack per batch is enough,
            # and a per-message ack was most of the replay's cost.
            self._channel.basic_ack(message.delivery_info["delivery_tag"], multiple=True)
            self._unacked = 0
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8")
        try:
            control = decode_control(body, dict(message.properties))
        except DecodeError as exc:
            logger.warning("ignoring an unreadable control message on %s: %s", queue, exc)
            return
        if self._markers:
            self.replayed += 1
        if control.type == CONTROL_TYPE_CANCEL:
            if control.job_id is None:
                logger.warning("ignoring a cancel without a job_id on %s", queue)
                return
            self.cancellations.cancel(control.job_id)
        elif control.type in (CONTROL_TYPE_PAUSE, CONTROL_TYPE_RESUME):
            # The stream's queue decides, not the body: a message routed to control.{q} is about q.
            if self.paused.set(queue, control.type == CONTROL_TYPE_PAUSE) and not self._markers:
                logger.info("queue %s %s by a control message", queue, "paused" if queue in self.paused else "resumed")
        elif control.type == CONTROL_TYPE_MARKER:
            if control.message_id is not None:
                self._markers.pop(control.message_id, None)
        elif control.type == CONTROL_TYPE_INFO:
            self._answer_info(queue, control)
        elif self.on_other is not None:
            self.on_other(queue, control)
        # Other types are ignored.

    def _answer_info(self, queue: str, request: ControlMessage) -> None:
        """Answer an INFO request read live, for a job this worker knows (see the module docstring)."""
        if self.info is None or self._channel is None:
            return
        if queue in self._markers.values():
            return  # replayed while catching up: its asker has long given up
        if request.reply_to is None or request.job_id is None:
            logger.warning(
                "ignoring an INFO request on %s without %s (message %s)",
                queue,
                "reply_to" if request.reply_to is None else "job_id",
                request.message_id,
            )
            return
        if request.timestamp is not None and (utcnow() - request.timestamp).total_seconds() > self.info_max_age:
            logger.debug("ignoring a stale INFO request for job %s on %s", request.job_id, queue)
            return
        known = self.info(request.job_id)
        if known is None:
            return
        reply = info_reply(known, correlation_id=request.correlation_id)
        self._channel.basic_publish(
            WireMessage(reply.body, **reply.properties), exchange="", routing_key=request.reply_to
        )
        logger.debug("answered INFO for job %s (%s) to %s", request.job_id, known.state, request.reply_to)


def record_cancelled(job: Job, state: Literal["pending", "running"], attempt: int) -> None:
    """Count and log a cancelled job (``ojs_amqp_jobs_cancelled_total``); it is acked, never retried.

    Parameters:
        job: the cancelled job.
        state: ``"pending"`` (dropped on delivery) or ``"running"`` (its handler was running).
        attempt: the 1-based execution it was cancelled at.
    """
    METRICS.cancelled(job.queue, state)
    logger.info(
        "job %s cancelled (%s); acknowledged without %s",
        job.id,
        state,
        "running it" if state == "pending" else "retrying it",
        extra=job_log_extra(job, attempt),
    )


__all__ = [
    "CANCEL_RUNNING_CHOICES",
    "CancelRunning",
    "DEFAULT_INFO_MAX_AGE",
    "CancelledIds",
    "Cancellations",
    "ControlReader",
    "PausedQueues",
    "RunningEntry",
    "RunningScope",
    "record_cancelled",
]
