"""A worker for plain kombu users: run handlers for OJS jobs.

::

    from ojs_kombu import Worker, current_job

    worker = Worker(queues=["email"], concurrency=10)

    @worker.handler("email.send")
    def send(to, template, *, lang="en"):
        print(current_job().attempt, to, template, lang)

    worker.run()          # blocks; SIGTERM / SIGINT shut it down gracefully

A handler receives the job's ``args`` positionally and ``meta.kwargs`` as
keyword arguments.  Returning acknowledges the job.  Raising an exception
fails the attempt, and the job's retry policy decides: retry through the
broker's retry queues, or the terminal outcome (dead letter queue, or
discard when ``on_exhaustion`` is ``"discard"``); :class:`~ojs_kombu.Discard`
and :class:`~ojs_kombu.DeadLetter` force those outcomes.  What the worker does
with every kind of delivery is the table of
:mod:`~ojs_kombu.runtime.processing` (DESIGN §5).

Threads: one thread runs the :class:`~ojs_kombu.runtime.consumer.Consumer` loop;
``concurrency`` handler threads run jobs and hand their outcomes back to it.
``Basic.Qos(prefetch=concurrency, global=False)``.  While jobs are short (they return
within a millisecond without waiting), the consumer thread runs them itself, after
each pass of its loop: handing a job to another thread costs more than such a job.
A job that waits (I/O, sleep) or runs longer sends the next jobs to the handler threads
(for at least 0.1 s, until they are all idle); and a job that runs on the consumer thread for more than 10 ms lends the
connection to a stand-in thread, which serves it (heartbeats, cancels, acks, new
deliveries, to the handler threads) until the job returns
(:mod:`~ojs_kombu.runtime.handover`).  ``inline=False`` runs every job on a handler thread.
That choice and the handler threads are the worker's :class:`~ojs_kombu.runtime.dispatch.Dispatch`.

How the worker is made: its consumer, control reader, settler and presence come from an
:class:`~ojs_kombu.runtime.assembly.Assembly` (as the Dramatiq adapter's do); its handlers are
a :class:`~ojs_kombu.runtime.handlers.Handlers` registry; running one job and turning its outcome
into one call of the :class:`~ojs_kombu.runtime.settle.Settler` (which acks, retries,
dead-letters or drops it, with its event and metric) is :mod:`~ojs_kombu.runtime.processing`.
The Worker itself is the front: its keywords, registration, and the lifecycle (start, stop,
signals).

``async def`` handlers run as tasks of one event loop on a thread of the worker's own
(:mod:`~ojs_kombu.runtime.coroutines`), at most ``concurrency`` at once (the prefetch):
200 jobs that each ``await`` I/O take one thread, not 200, and a worker whose handlers
are all ``async def`` starts one handler thread instead of ``concurrency``.  Each task
has its own :func:`current_job`; its outcome is settled as a plain handler's (retry,
dead letter).  In ``"interrupt"`` mode a cancel cancels the task
(``asyncio.CancelledError`` in the handler).  A handler that blocks stalls every
coroutine job of the worker.

What a worker knows about its jobs: :attr:`Worker.lifecycle` emits the lifecycle
events of every job it handles (started, succeeded, failed, retried,
dead-lettered, cancelled, expired) under :attr:`Worker.worker_id`, and
:attr:`Worker.activity` keeps the jobs running now and a window of recent
outcomes, with which the worker answers INFO requests (``Client.info``).

How a worker ends:

* :meth:`Worker.run` returns after a graceful shutdown on SIGTERM / SIGINT or
  :meth:`Worker.stop` (from another thread).
* It raises :class:`WorkerError` when the worker stopped on its own: the consumer
  thread ended without being asked to (the broker refused the connection or a
  declaration for good, ``connect_retries`` ran out, or a bug).  Running jobs
  get the grace period first.  ``ojs-amqp worker`` then exits with status 1,
  so a supervisor restarts it.  With :meth:`Worker.start`, read :attr:`Worker.error`.
* A handler that raises ``SystemExit`` or ``KeyboardInterrupt`` (``sys.exit()``
  in a job) fails its attempt like any other exception, so the job is retried
  or dead-lettered and never left unacknowledged; then the worker shuts down
  gracefully as on SIGTERM, and :meth:`Worker.run` re-raises that exception
  (``sys.exit(3)`` in a handler ends ``ojs-amqp worker`` with status 3).
"""

from __future__ import annotations

import inspect
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import FrameType
from typing import Any, Literal, ParamSpec, TypeVar, overload

from ojs_kombu.amqp.connection import DEFAULT_HEARTBEAT, resolve_url, safe_url
from ojs_kombu.amqp.failover import ConnectionSettings
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.amqp.urls import BrokerUrls
from ojs_kombu.errors import OjsError, ValidationError, WorkerError
from ojs_kombu.model.naming import Names, validate_job_type, validate_queue_name
from ojs_kombu.model.ratelimit import RateLimitPolicy
from ojs_kombu.observability.server import DEFAULT_METRICS_HOST, MetricsServer, check_metrics_port, serve_metrics
from ojs_kombu.policy.schedule import Cascade
from ojs_kombu.runtime.assembly import Assembly
from ojs_kombu.runtime.batching import Batching
from ojs_kombu.runtime.completed import CompletedLog
from ojs_kombu.runtime.control import CancelRunning
from ojs_kombu.runtime.delivery import Delivery
from ojs_kombu.runtime.dispatch import Dispatch
from ojs_kombu.runtime.handlers import BatchSpec, Handlers
from ojs_kombu.runtime.lifecycle import JobEvent
from ojs_kombu.runtime.limits import Limiter, queue_policies
from ojs_kombu.runtime.presence import DEFAULT_PRESENCE_INTERVAL, Beacon
from ojs_kombu.runtime.processing import Processing, RunningJob, current_job
from ojs_kombu.runtime.workflow import DEFAULT_SWEEP_AFTER
from ojs_kombu.wire.completed import CompletedOptions
from ojs_kombu.wire.control import ControlOptions
from ojs_kombu.wire.entities import QueueOptions, QueueType
from ojs_kombu.wire.events import EventsOptions, RateLimitEvent

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

#: What ``signal.signal`` takes and returns.
_SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def _queues(queues: Iterable[str]) -> list[str]:
    names = [validate_queue_name(q) for q in queues]
    if not names:
        raise ValidationError("a worker needs at least one queue", field="queues")
    return names


def _concurrency(concurrency: int) -> int:
    if concurrency < 1:
        raise ValidationError("concurrency must be at least 1", field="concurrency")
    return concurrency


class Worker:
    """Consumes OJS job queues and runs the registered handlers.

    Parameters:
        url: broker URL (default ``$OJS_AMQP_URL``), or a cluster's nodes as a ``;``-separated
            list or a list/tuple of URLs: on a connection loss the worker moves to the next node,
            re-declares its topology and re-consumes there (``docs/cluster.md``, Failover).
        queues: OJS queue names to consume.
        concurrency: jobs run at once (handler threads; the consumer thread runs short jobs in one
            of these slots; ``async def`` handlers run on one event loop instead), and the
            prefetch count.
        prefix: multi-tenant entity prefix.
        grace_period: seconds a graceful shutdown waits for running jobs.
        queue_options: optional arguments of the job queues (must match the producers').
        queue_type: ``"quorum"`` or ``"classic"``: ``queue_options.queue_type`` (as the producers').
        heartbeat: AMQP heartbeat, seconds.
        dead_letter_mode: ``"nack"`` (``Basic.Nack``, the binding's FAIL, after the final failure
            is recorded in the control stream for the dead letter readers) or ``"republish"``
            (publish to the DLX with the final failure in the envelope and headers, then ack).
        connection_name: shown by the broker's management UI.
        ssl: TLS, as for :class:`~ojs_kombu.client.Client`: ``None`` (``amqps://`` / ``ojss://`` only),
            ``True`` or a dict of ``ca_certs``, ``certfile``, ``keyfile``, ``server_hostname``,
            ``verify``; chain and host name verified unless ``verify=False``.  A failed
            verification is permanent: :meth:`run` stops with :class:`WorkerError` (its cause a
            :class:`~ojs_kombu.errors.TlsVerificationError`).
        transport_options: passed to kombu.
        on_conflict: a job queue that exists with other arguments is used as it is
            (``"use-existing"``) or refused (``"raise"``: the worker stops with :class:`WorkerError`).
        connect_retries: consecutive failed connection attempts after which the
            worker gives up (:class:`WorkerError`); ``None`` retries forever.
        cancel_running: what cancelling a running job does besides setting
            ``current_job().cancelled``: ``"interrupt"`` raises :class:`~ojs_kombu.errors.Cancelled`
            in the handler's thread; ``"cooperative"`` leaves it to the handler.
        control: retention of the control streams this worker declares.
        events: also publish this worker's job lifecycle events (started, succeeded, failed,
            retried, dead-lettered, cancelled, expired) to the events stream; default off.
            Its presence is published every ``presence_interval`` seconds either way
            (see :mod:`ojs_kombu.runtime.presence`).
        presence_interval: seconds between two presences on the events stream.
        events_options: retention of the events stream this worker declares.
        metrics_port: serve Prometheus metrics (``ojs_amqp_*``, ``ojs_job_*``) on this port from
            :meth:`start` to :meth:`stop` (0: a free port, see :attr:`metrics_server`); ``None``
            (default): no endpoint (the metrics are recorded either way, for an exporter of the
            application's own).
        metrics_host: the interface the metrics endpoint binds (default loopback only).
        inline: run short jobs on the consumer thread (see the module's "Threads"); ``False``
            hands every job to a handler thread.
        deduplicate: execution de-duplication (DESIGN §19, ``docs/reliability.md``): record the
            id of every completed job in the stream ``ojs.stream.completed.{q}`` (confirmed, then
            the ack) and ack without running a delivery whose job id completed already, here or
            in another worker of the queue (:class:`~ojs_kombu.runtime.completed.CompletedLog`,
            :attr:`completed_log`; :attr:`deduplicated` counts them).  The prefetch count grows
            by 64: completed jobs wait unacked for their record's confirm.
        completed_options: bounds of what ``deduplicate`` remembers (age, stream size, ids in memory).
        rate_limits: a :class:`~ojs_kombu.RateLimitPolicy` (or a dict of its fields) per queue (spec
            §7.2), besides each job's own ``rate_limit``; the same for every worker of the queue: limits
            hold across processes (``docs/limits.md``).
        unique_backend: where unique jobs' locks are: None (RabbitMQ queues) or the publishers' Redis URL.
        workflow_retention: seconds an ended workflow's record stream is kept before its sweep job
            deletes it (default 24 h; ``None``: kept; ``docs/workflows.md``, Clean-up).

    Raises:
        ValidationError: a queue name, the concurrency, ``dead_letter_mode``, ``metrics_port`` or a
            ``rate_limits`` policy is invalid.
    """

    def __init__(
        self,
        url: BrokerUrls | None = None,
        *,
        queues: Iterable[str] = ("default",),
        concurrency: int = 10,
        prefix: str = "",
        grace_period: float = 30.0,
        queue_options: QueueOptions | None = None,
        queue_type: QueueType | None = None,
        heartbeat: float = DEFAULT_HEARTBEAT,
        dead_letter_mode: str = "nack",
        connection_name: str | None = None,
        ssl: Any = None,
        transport_options: dict[str, Any] | None = None,
        on_conflict: Literal["use-existing", "raise"] = "use-existing",
        connect_retries: int | None = None,
        cancel_running: CancelRunning = "interrupt",
        control: ControlOptions | None = None,
        events: bool = False,
        presence_interval: float = DEFAULT_PRESENCE_INTERVAL,
        events_options: EventsOptions | None = None,
        metrics_port: int | None = None,
        metrics_host: str = DEFAULT_METRICS_HOST,
        inline: bool = True,
        deduplicate: bool = False,
        completed_options: CompletedOptions | None = None,
        rate_limits: Mapping[str, RateLimitPolicy | Mapping[str, Any]] | None = None,
        unique_backend: str | None = None,
        workflow_retention: float | None = DEFAULT_SWEEP_AFTER,
    ):
        self.queues = _queues(queues)
        #: The policy of each queue that has one (``rate_limits``).
        self.rate_limits = queue_policies(rate_limits, self.queues)
        self.concurrency = _concurrency(concurrency)
        self.url = resolve_url(url)
        self.grace_period = grace_period
        self.dead_letter_mode = dead_letter_mode
        self.connect_retries = connect_retries
        self.names = Names(prefix)
        self.topology = Topology(
            self.names,
            queue_options=(queue_options or QueueOptions()).with_queue_type(queue_type),
            on_conflict=on_conflict,
            control=control,
            events=events_options,
        )
        self.cascade = Cascade(self.names)
        #: The parts every consumer of this worker is built from (they outlive configure()).
        self.assembly = Assembly(
            ConnectionSettings(self.url, heartbeat, ssl, transport_options),
            self.names,
            self.topology,
            self.cascade,
            dead_letter_mode=dead_letter_mode,
            cancel_running=cancel_running,
            presence_interval=presence_interval,
            deduplicate=deduplicate,
            completed_options=completed_options,
            unique_backend=unique_backend,
            workflow_retention=workflow_retention,
        )
        self.completed_log: CompletedLog | None = None
        """The completed job ids (``deduplicate=True``)."""
        self.events = events
        self.presence_interval = self.assembly.presence_interval
        self.metrics_port = None if metrics_port is None else check_metrics_port(metrics_port)
        self.metrics_host = metrics_host
        self.metrics_server: MetricsServer | None = None
        """The running metrics endpoint (between :meth:`start` and :meth:`stop` with ``metrics_port``)."""
        self.lifecycle, self.activity = self.assembly.lifecycle, self.assembly.activity
        self.worker_id = self.assembly.worker_id
        self.cancellations = self.assembly.cancellations
        if events:
            self.lifecycle.subscribe(self._offer_event)
        self._beacon: Beacon | None = None
        self._connection_name = connection_name
        self._handlers = Handlers()
        self._inline = inline
        self._init_run_state()
        self._build_consumer()

    def _init_run_state(self) -> None:
        """The state of start / run / stop: nothing started yet."""
        self._consumer_thread: threading.Thread | None = None
        # Lifecycle: _shutdown wakes run(); _stopping / _stopped bracket stop().
        self._lifecycle = threading.Lock()
        self._shutdown = threading.Event()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._run_active = False
        self._error: WorkerError | None = None
        self._handler_exit: BaseException | None = None

    def _build_consumer(self) -> None:
        parts = self.assembly.consuming(
            self.queues,
            self.concurrency,
            self._receive,
            connection_name=self._consumer_name(),
            connect_retries=self.connect_retries,
            on_pass=self._run_ready,
        )
        if self.completed_log is not None:
            self.completed_log.stop()  # configure(): never started, its pipe closed
        self.consumer, self.settler, self.completed_log = parts.consumer, parts.settler, parts.completed
        #: Runs each job in a slot of the concurrency and settles it.
        self.processing = Processing(
            self.settler,
            self._handlers,
            self.cancellations,
            self.lifecycle,
            self.concurrency,
            worker_id=self.worker_id,
            on_exit=self._exit_requested,
        )
        processing = self.processing
        processing.batching = Batching(processing, self.consumer.ack_many, RunningJob.of)
        self._apply_prefetch()
        #: Where each delivered job runs: the consumer thread or a handler thread.
        self.dispatch = Dispatch(self.consumer, processing.handle, lambda: processing.in_flight, inline=self._inline)
        #: The concurrency limits of the jobs (``rate_limit``, ``rate_limits``): permits on a connection of its own.
        self.limiter = processing.limiter = Limiter(
            lambda: self.assembly.permits(f"{self._consumer_name()} permits"),
            self.rate_limits,
            self.settler,
            self.dispatch.submit,
            park_limit=self.concurrency // 2,
            generation=lambda: self.consumer.generation,
            forsake=processing.forsake,
            emit=self._offer_event,  # to the events stream with events=True (spec §11.1)
            worker_id=self.worker_id,
        )

    @property
    def deduplicated(self) -> int:
        """Deliveries acked without running because their job had completed already (``deduplicate=True``)."""
        return self.settler.deduplicated

    def _consumer_name(self) -> str:
        return self._connection_name or f"ojs_kombu worker {','.join(self.queues)}"

    def configure(
        self,
        *,
        queues: Iterable[str] | None = None,
        concurrency: int | None = None,
        metrics_port: int | None = None,
        metrics_host: str | None = None,
    ) -> None:
        """Replace the queues, the concurrency and/or the metrics endpoint, before :meth:`start`
        (``ojs-amqp worker --queues … --concurrency … --metrics-port …``).

        Parameters:
            queues: the OJS queues to consume instead of the constructor's (not added to them).
            concurrency: jobs run at once (handler threads) and prefetch count.
            metrics_port, metrics_host: the metrics endpoint's (``None``: the constructor's).

        Raises:
            OjsError: the worker is already started.
            ValidationError: a queue name, the concurrency or the metrics port is invalid.
        """
        with self._lifecycle:
            if self._consumer_thread is not None:
                raise OjsError("configure() must be called before the worker is started")
            if metrics_port is not None:
                self.metrics_port = check_metrics_port(metrics_port)
            if metrics_host is not None:
                self.metrics_host = metrics_host
            if queues is not None:
                self.queues = _queues(queues)
            if concurrency is not None:
                self.concurrency = _concurrency(concurrency)
            if queues is None and concurrency is None:
                return
            self.consumer.close()
            self._build_consumer()

    # -- registration --------------------------------------------------------------------------

    @overload
    def handler(self, job_type: str) -> Callable[[Callable[P, R]], Callable[P, R]]: ...

    @overload
    def handler(self, job_type: str, fn: Callable[P, R]) -> Callable[P, R]: ...

    def handler(
        self, job_type: str, fn: Callable[P, R] | None = None
    ) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
        """Register ``fn`` for ``job_type``; usable as ``@worker.handler("email.send")``.

        ``fn`` may be an ``async def``: its jobs run on the worker's event loop (see the module).

        Parameters:
            job_type: the OJS job type (``email.send``).
            fn: the handler; omitted when used as a decorator.

        Returns:
            ``fn`` itself, unchanged (its signature is kept for type checkers), or the decorator.

        Raises:
            ValidationError: ``job_type`` is not a valid OJS job type.
        """
        validate_job_type(job_type)

        def register(func: Callable[P, R]) -> Callable[P, R]:
            with self._lifecycle:
                self._handlers.add(job_type, func)
                if self._consumer_thread is not None and not self._stopping.is_set():
                    self._add_handler_threads()  # a plain handler registered after start()
            return func

        return register(fn) if fn is not None else register

    def batch_handler(
        self, job_type: str, *, size: int = 100, timeout: float = 1.0
    ) -> Callable[[Callable[[list[RunningJob]], object]], Callable[[list[RunningJob]], object]]:
        """Register a batch handler for ``job_type``: ``fn(jobs)`` with a list of up to ``size`` jobs
        (``@worker.batch_handler("thumbs", size=100, timeout=1.0)``; :mod:`~ojs_kombu.runtime.batching`).

        A batch is what arrived within ``timeout`` seconds of its first job, at most ``size``.  The
        prefetch grows by ``size`` (``concurrency`` + every batch handler's size), from the next
        connection: register before :meth:`start`.  Returning succeeds every job (one
        ``Basic.Ack(multiple=True)``); returning a list of ``len(jobs)`` results / exceptions, or
        raising :class:`~ojs_kombu.errors.BatchItemFailed`, fails those jobs only; raising
        anything else fails every job; each failed job follows its own retry policy.

        Parameters:
            job_type: the OJS job type.
            size: the most jobs in one call (>= 1).
            timeout: seconds a batch collects after its first job (> 0).

        Returns:
            The decorator (it returns the function unchanged).

        Raises:
            ValidationError: ``job_type`` is not a valid OJS job type, ``size`` or ``timeout`` is out
                of range, or the function is an ``async def``.
        """
        validate_job_type(job_type)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValidationError(f"batch size must be an integer >= 1, got {size!r}")
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not timeout > 0:
            raise ValidationError(f"batch timeout must be a number of seconds > 0, got {timeout!r}")

        def register(func: Callable[[list[RunningJob]], object]) -> Callable[[list[RunningJob]], object]:
            if inspect.iscoroutinefunction(func):
                raise ValidationError("a batch handler cannot be an async def")
            with self._lifecycle:
                self._handlers.add_batch(job_type, BatchSpec(func, size, float(timeout)))
                self._apply_prefetch()
                if self._consumer_thread is not None and not self._stopping.is_set():
                    self._add_handler_threads()
            return func

        return register

    def _apply_prefetch(self) -> None:
        """``concurrency`` plus room for a full batch of each batch handler (from the next connection)."""
        prefetch = self.concurrency + sum(spec.size for spec in self._handlers.batches.values())
        self.consumer.prefetch = self.consumer.window.prefetch = prefetch

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def paused_queues(self) -> frozenset[str]:
        """The queues of this worker paused by :meth:`Client.pause <ojs_kombu.client.Client.pause>`.

        Known once :meth:`wait_until_ready` has returned (the control streams are
        replayed first); a paused queue is not consumed until it is resumed.
        """
        return self.assembly.paused.queues & frozenset(self.queues)

    @property
    def inline(self) -> bool:
        """Whether short jobs run on the consumer thread (see :mod:`~ojs_kombu.runtime.dispatch`)."""
        return self.dispatch.inline

    @inline.setter
    def inline(self, value: bool) -> None:
        self._inline = self.dispatch.inline = value

    @property
    def error(self) -> WorkerError | None:
        """Why the worker stopped on its own (its consumer ended unasked), else ``None``."""
        return self._error

    def start(self) -> None:
        """Start consuming in background threads (for embedding), and the metrics endpoint
        when ``metrics_port`` is set; see :meth:`stop`.

        Raises:
            OjsError: the worker was already started.
            MetricsServerError: the metrics endpoint cannot listen (its port is in use ...);
                nothing was started.
        """
        with self._lifecycle:
            if self._consumer_thread is not None:
                raise OjsError("the worker is already started")
            if self.metrics_port is not None:
                self.metrics_server = serve_metrics(self.metrics_port, self.metrics_host)
            self._add_handler_threads()
            self.dispatch.handover.start()
            self._consumer_thread = threading.Thread(target=self._run_consumer, name="ojs-consumer", daemon=True)
            self._consumer_thread.start()
            self._beacon = self.assembly.beacon(
                self.queues,
                self.concurrency,
                connection_name=f"{self._consumer_name()} events",
                # A node whose presences stay unconfirmed commits nothing (cut off from the
                # majority): its queues deliver nothing either, so the consumer leaves it too.
                on_stalled=self.consumer.leave_node,
            )
            self._beacon.start()
        logger.info(
            "worker consuming %s on %s (concurrency %d)", ", ".join(self.queues), safe_url(self.url), self.concurrency
        )

    def wait_until_ready(self, timeout: float = 30.0) -> bool:
        """Block until the worker is connected and consuming.

        Connected means caught up with the control streams too (the consumer
        replays them before it consumes a job queue).  A worker that is not started
        yet (``run()`` in another thread that has not got that far) is waited for.

        Returns:
            True once connected; False on timeout, or at once if the consumer has ended (see :attr:`error`).
        """
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if self.consumer.connected.wait(max(0.0, min(0.05, remaining))):
                return True
            thread = self._consumer_thread
            if remaining <= 0 or (thread is not None and not thread.is_alive()):
                return self.consumer.connected.is_set()

    def stop(self, timeout: float | None = None) -> None:
        """Shut down gracefully: stop consuming, let running jobs finish within
        ``timeout`` (default ``grace_period``), hand unstarted prefetched jobs back
        unchanged (confirmed republish, then ack: no attempt is spent), close.

        A job still running after that is left to the broker, which redelivers it;
        its handler thread can no longer settle it.  A second, concurrent call waits
        for the first one to finish.
        """
        with self._lifecycle:
            consumer_thread = self._consumer_thread
            if consumer_thread is None:
                return
            first = not self._stopping.is_set()
            self._stopping.set()
        self._shutdown.set()
        if not first:
            self._stopped.wait()
            return
        grace = self.grace_period if timeout is None else timeout
        deadline = time.monotonic() + grace
        processing = self.processing
        self.consumer.stop_consuming()
        processing.draining.set()
        # Deliveries keep arriving until the broker has confirmed the cancel (Basic.CancelOk).
        while time.monotonic() < deadline and self.consumer.consuming and self.consumer.connected.is_set():
            time.sleep(0.01)
        for delivery in self.limiter.stop():  # parked, waiting for a permit
            processing.hand_back(delivery)
        for delivery in self.dispatch.unstarted():  # no thread has started them yet
            processing.hand_back(delivery)
        while time.monotonic() < deadline and processing.unsettled:
            time.sleep(0.01)
        if processing.in_flight:
            logger.warning(
                "%d job(s) still running after %.1fs; the broker will redeliver them", processing.in_flight, grace
            )
        if self.completed_log is not None:
            # Its confirms ack the last completed jobs: before the consumer stops.
            self.completed_log.stop(timeout=max(1.0, deadline - time.monotonic()))
        self.dispatch.release_threads()
        self.consumer.stop()  # a stand-in serving for a job outliving the grace period closes the connection
        if not self.dispatch.handover.lent:  # else the consumer thread runs that job: it ends when it returns
            consumer_thread.join(timeout=max(5.0, deadline - time.monotonic()))
        self.dispatch.handover.stop()
        self.dispatch.join_threads(timeout=0.5)
        processing.stop_coroutines()  # coroutines still running past the grace period: left to the broker
        self.limiter.close()  # permits of jobs still running past the grace period: back with the connection
        self.consumer.close()  # a late handler's settle request is dropped, never written to a closed fd
        self.assembly.close()
        if self._beacon is not None:
            self._beacon.stop()  # after the last settle: its job events, then the offline presence
        if self.metrics_server is not None:
            self.metrics_server.stop()  # last: a scrape during the shutdown still sees it
        self._stopped.set()

    def teardown(self) -> int:
        """After :meth:`stop`: delete every queue and exchange this worker declared
        (job, dead letter, retry and scheduling queues), messages included.

        Returns:
            The number of entities deleted.
        """
        with self.consumer.connection_factory() as conn:
            deleted: int = self.topology.delete_declared(conn.connect())
            return deleted

    def run(self) -> None:
        """Run until SIGTERM or SIGINT (or :meth:`stop` from another thread), then shut down gracefully.

        Raises:
            WorkerError: the worker stopped on its own (its consumer ended: the broker
                refused it, ``connect_retries`` ran out ...); raised after the graceful shutdown.
            SystemExit, KeyboardInterrupt: re-raised from a handler, after the graceful
                shutdown (the job's attempt was failed first).
        """
        previous: dict[signal.Signals, _SignalHandler] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            with self._lifecycle:
                self._run_active = True
            self.start()
            while not self._shutdown.wait(1.0):
                pass
            logger.info("shutting down (grace period %.1fs)", self.grace_period)
            self.stop()
        finally:
            with self._lifecycle:
                self._run_active = False
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self._handler_exit is not None:
            raise self._handler_exit
        if self._error is not None:
            raise self._error

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._shutdown.set()

    def __enter__(self) -> Worker:
        self.start()
        self.wait_until_ready()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- consumer thread -----------------------------------------------------------------------

    def _run_consumer(self) -> None:
        cause: BaseException | None = None
        try:
            self.consumer.run()
        except BaseException as exc:  # noqa: BLE001 - reported by run() / error, never lost
            cause = exc
        finally:
            if not self._stopping.is_set():
                reason = f"{type(cause).__name__}: {cause}" if cause is not None else "it ended without being asked to"
                error = WorkerError(f"the worker's consumer on {safe_url(self.url)} stopped: {reason}")
                error.__cause__ = cause
                self._error = error
                logger.error("%s; shutting down", error, exc_info=cause)
            elif cause is not None:
                logger.error("the consumer failed while stopping: %r", cause, exc_info=cause)
            self._shutdown.set()

    # -- deliveries ----------------------------------------------------------------------------

    def _receive(self, delivery: Delivery) -> None:
        self.processing.received()
        self.dispatch.receive(delivery)  # run or handed out after the pass (_run_ready)

    def _run_ready(self) -> None:
        self.dispatch.run_ready()  # the consumer's on_pass: the dispatch is made after the consumer

    def _add_handler_threads(self) -> None:
        """Start the handler threads still missing (with ``_lifecycle`` held).

        ``concurrency`` of them, or one when every handler is an ``async def``: coroutine
        jobs run on the worker's event loop, the thread only starts those handed to it.
        """
        self.dispatch.add_threads(1 if self._handlers.all_async else self.concurrency)

    def _offer_event(self, event: JobEvent | RateLimitEvent) -> None:
        """The lifecycle subscriber of ``events=True`` (and the limiter's): hand the event to the beacon's thread."""
        beacon = self._beacon
        if beacon is not None:
            beacon.offer(event)

    def _exit_requested(self, exc: BaseException) -> None:
        """A handler raised SystemExit / KeyboardInterrupt: shut down; run() re-raises it."""
        with self._lifecycle:
            if self._handler_exit is None:
                self._handler_exit = exc
            stopper_needed = not self._run_active and not self._stopping.is_set()
        self._shutdown.set()
        if stopper_needed:  # embedded (start/stop): nobody waits in run(), stop from a thread of our own
            threading.Thread(target=self.stop, name="ojs-stop", daemon=True).start()


__all__ = ["RunningJob", "Worker", "WorkerError", "current_job"]
