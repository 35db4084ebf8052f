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
with every kind of delivery (DESIGN §5):

===========================================  ===================================================
delivery                                     outcome
===========================================  ===================================================
handler returned                             ``Basic.Ack``
handler raised, attempts left                retry queue (confirmed publish, attempt+1), then ack
handler raised, exhausted / non-retryable    ``Basic.Nack(requeue=False)`` -> ``ojs.queue.dlx.{q}``
                                             (ack and drop if ``on_exhaustion="discard"``)
``redelivered`` (a worker died running it)   a failed attempt with error code ``worker_lost``
``expires_at`` passed                        ack, not run (logged)
``scheduled_at`` still ahead                 back into the scheduler (confirmed), then ack
undecodable / invalid envelope / no handler  republished to the DLQ with ``x-ojs-error-code``
                                             and ``x-ojs-error-message``, then ack
===========================================  ===================================================

Threads: one thread runs the :class:`~ojs_kombu.runtime.consumer.Consumer` loop (the
only user of the connection); ``concurrency`` handler threads run jobs and hand
their outcomes back to it.  ``Basic.Qos(prefetch=concurrency, global=False)``.
"""

from __future__ import annotations

import contextvars
import logging
import queue as queue_module
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ojs_kombu.amqp.connection import DEFAULT_HEARTBEAT, resolve_url
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.errors import OjsError, ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import Names, validate_job_type, validate_queue_name
from ojs_kombu.observability.tracing import job_span
from ojs_kombu.policy.retry import Failure, decide
from ojs_kombu.policy.schedule import Cascade
from ojs_kombu.runtime.consumer import Consumer, Delivery
from ojs_kombu.runtime.settle import Settler
from ojs_kombu.wire.entities import QueueOptions

logger = logging.getLogger(__name__)

_current_job: contextvars.ContextVar[Job | None] = contextvars.ContextVar("ojs_current_job", default=None)


def current_job() -> Job:
    """The job the calling handler is running (``attempt`` is this execution, 1-based).

    Raises :class:`~ojs_kombu.errors.OjsError` outside a handler.
    """
    job = _current_job.get()
    if job is None:
        raise OjsError("current_job() is only available inside a job handler")
    return job


class Worker:
    """Consumes OJS job queues and runs the registered handlers.

    Arguments:
        url: broker URL (default ``$OJS_AMQP_URL``).
        queues: OJS queue names to consume.
        concurrency: handler threads, and the prefetch count.
        prefix: multi-tenant entity prefix.
        grace_period: seconds a graceful shutdown waits for running jobs.
        queue_options: optional arguments of the job queues (must match the producers').
        dead_letter_mode: ``"nack"`` (``Basic.Nack``, the binding's FAIL) or
            ``"republish"`` (publish to the DLX with the final error headers, then ack).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        queues: Iterable[str] = ("default",),
        concurrency: int = 10,
        prefix: str = "",
        grace_period: float = 30.0,
        queue_options: QueueOptions | None = None,
        heartbeat: float = DEFAULT_HEARTBEAT,
        dead_letter_mode: str = "nack",
        connection_name: str | None = None,
        ssl: Any = None,
        transport_options: dict[str, Any] | None = None,
    ):
        self.queues = [validate_queue_name(q) for q in queues]
        if not self.queues:
            raise ValidationError("a worker needs at least one queue", field="queues")
        if concurrency < 1:
            raise ValidationError("concurrency must be at least 1", field="concurrency")
        if dead_letter_mode not in ("nack", "republish"):
            raise ValidationError("dead_letter_mode must be 'nack' or 'republish'", field="dead_letter_mode")
        self.url = resolve_url(url)
        self.concurrency = concurrency
        self.grace_period = grace_period
        self.dead_letter_mode = dead_letter_mode
        self.names = Names(prefix)
        self.topology = Topology(self.names, queue_options=queue_options)
        self.cascade = Cascade(self.names)
        self._handlers: dict[str, Callable[..., Any]] = {}
        self._work: queue_module.SimpleQueue[Delivery | None] = queue_module.SimpleQueue()  # cheaper hand-off
        self._draining = threading.Event()
        self._stopped = threading.Event()
        self._in_flight = 0
        self._unsettled = 0  # received and not yet settled (acked, republished, handed back ...)
        self._in_flight_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._consumer_thread: threading.Thread | None = None
        self.consumer = Consumer(
            self.url,
            {self.names.job_queue(q): q for q in self.queues},
            concurrency,
            self._receive,
            topology=self.topology,
            declare=self._declare,
            heartbeat=heartbeat,
            connection_name=connection_name or f"ojs_kombu worker {','.join(self.queues)}",
            ssl=ssl,
            transport_options=transport_options,
        )
        self.settler = Settler(
            self.consumer, self.names, self.topology, self.cascade, dead_letter_mode=dead_letter_mode
        )

    # -- registration --------------------------------------------------------------------------

    def handler(self, job_type: str, fn: Callable[..., Any] | None = None):
        """Register ``fn`` for ``job_type``; usable as ``@worker.handler("email.send")``."""
        validate_job_type(job_type)

        def register(func: Callable[..., Any]) -> Callable[..., Any]:
            self._handlers[job_type] = func
            return func

        return register(fn) if fn is not None else register

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start consuming in background threads (for embedding); see :meth:`stop`."""
        if self._consumer_thread is not None:
            raise OjsError("the worker is already started")
        for index in range(self.concurrency):
            thread = threading.Thread(target=self._work_loop, name=f"ojs-handler-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self._consumer_thread = threading.Thread(target=self._run_consumer, name="ojs-consumer", daemon=True)
        self._consumer_thread.start()

    def wait_until_ready(self, timeout: float = 30.0) -> bool:
        """Block until the worker is connected and consuming; False on timeout."""
        return self.consumer.connected.wait(timeout)

    def stop(self, timeout: float | None = None) -> None:
        """Shut down gracefully: stop consuming, let running jobs finish within
        ``timeout`` (default ``grace_period``), hand unstarted prefetched jobs back
        unchanged (confirmed republish, then ack: no attempt is spent), close."""
        if self._consumer_thread is None or self._stopped.is_set():
            return
        grace = self.grace_period if timeout is None else timeout
        deadline = time.monotonic() + grace
        self.consumer.stop_consuming()
        self._draining.set()
        # Deliveries keep arriving until the broker has confirmed the cancel (Basic.CancelOk).
        while time.monotonic() < deadline and self.consumer.consuming and self.consumer.connected.is_set():
            time.sleep(0.01)
        self._hand_back_waiting()
        while time.monotonic() < deadline and self._unsettled:
            time.sleep(0.01)
        if self._in_flight:
            logger.warning(
                "%d job(s) still running after %.1fs; the broker will redeliver them", self._in_flight, grace
            )
        for _ in self._threads:
            self._work.put(None)
        self.consumer.stop()
        self._consumer_thread.join(timeout=max(5.0, deadline - time.monotonic()))
        for thread in self._threads:
            thread.join(timeout=0.5)
        self.consumer.close()
        self._stopped.set()

    def teardown(self) -> int:
        """After :meth:`stop`: delete every queue and exchange this worker declared
        (job, dead letter, retry and scheduling queues), messages included."""
        with self.consumer.connection_factory() as conn:
            return self.topology.delete_declared(conn.connect())

    def run(self) -> None:
        """Run until SIGTERM or SIGINT (or :meth:`stop` from another thread), then shut down gracefully."""
        stop_requested = threading.Event()
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: stop_requested.set())
        try:
            self.start()
            while not stop_requested.is_set() and self._consumer_thread.is_alive():
                stop_requested.wait(0.5)
            logger.info("shutting down (grace period %.1fs)", self.grace_period)
            self.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def __enter__(self) -> Worker:
        self.start()
        self.wait_until_ready()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    # -- consumer thread -----------------------------------------------------------------------

    def _run_consumer(self) -> None:
        try:
            self.consumer.run()
        except Exception:
            logger.exception("the consumer stopped")

    def _declare(self, connection) -> None:
        for queue in self.queues:
            self.topology.ensure_scheduling(connection, queue, self.cascade)

    # -- handler threads -----------------------------------------------------------------------

    def _receive(self, delivery: Delivery) -> None:
        with self._in_flight_lock:
            self._unsettled += 1
        self._work.put(delivery)

    def _settled(self) -> None:
        with self._in_flight_lock:
            self._unsettled -= 1

    def _work_loop(self) -> None:
        while True:
            delivery = self._work.get()
            if delivery is None:
                return
            if self._draining.is_set():
                try:
                    self._hand_back(delivery)
                finally:
                    self._settled()
                continue
            with self._in_flight_lock:
                self._in_flight += 1
            try:
                self._process(delivery)
            except Exception:
                logger.exception("unexpected error processing a delivery; sending it to the DLQ")
                self.consumer.nack(delivery)
            finally:
                with self._in_flight_lock:
                    self._in_flight -= 1
                    self._unsettled -= 1

    def _hand_back_waiting(self) -> None:
        """At shutdown: hand back every delivery no handler thread has taken yet."""
        while True:
            try:
                delivery = self._work.get_nowait()
            except queue_module.Empty:
                return
            if delivery is None:  # a concurrent stop()'s sentinel: leave it for its thread
                self._work.put(None)
                return
            try:
                self._hand_back(delivery)
            finally:
                self._settled()

    def _hand_back(self, delivery: Delivery) -> None:
        """An unstarted job at shutdown: republish it unchanged to its queue, then ack."""
        self.settler.hand_back(delivery)

    def _process(self, delivery: Delivery) -> None:
        job = self.settler.triage(delivery)
        if job is None:
            return
        attempt = job.attempt + 1
        handler = self._handlers.get(job.type)
        if handler is None:
            self.settler.reject_invalid(delivery, "unknown_type", f"no handler is registered for job type {job.type!r}")
            return
        running = job.model_copy(update={"attempt": attempt})
        token = _current_job.set(running)
        try:
            with job_span(job, attempt):
                handler(*job.args, **job.kwargs)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            logger.info("job %s (%s) attempt %d failed: %r", job.id, job.type, attempt, exc)
            self.settler.fail(delivery, job, attempt, Failure.from_exception(exc), decide(job, attempt, exc))
        else:
            self.consumer.ack(delivery)
        finally:
            _current_job.reset(token)


__all__ = ["Worker", "current_job"]
