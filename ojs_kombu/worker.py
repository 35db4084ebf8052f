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

Threads: one thread runs the :class:`~ojs_kombu.consumer.Consumer` loop (the
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
from typing import Any, Callable, Iterable

from .client import resolve_url
from .codec import Header, OutgoingMessage, decode, encode
from .consumer import Consumer, Delivery
from .envelope import Job, utcnow
from .errors import DecodeError, OjsError, ValidationError
from .naming import Names, validate_job_type, validate_queue_name
from .retry import Decision, Failure, Outcome, decide, record_failure
from .schedule import Cascade, check_delay, delay_ms_until, routing_key
from .topology import QueueOptions, Topology
from .transport import DEFAULT_HEARTBEAT

logger = logging.getLogger(__name__)

_current_job: contextvars.ContextVar[Job | None] = contextvars.ContextVar("ojs_current_job", default=None)

#: Longest error message carried in ``x-ojs-error-message``.
MAX_ERROR_HEADER = 4096


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

    def __init__(self, url: str | None = None, *, queues: Iterable[str] = ("default",), concurrency: int = 10,
                 prefix: str = "", grace_period: float = 30.0, queue_options: QueueOptions | None = None,
                 heartbeat: float = DEFAULT_HEARTBEAT, dead_letter_mode: str = "nack",
                 connection_name: str | None = None, ssl: Any = None,
                 transport_options: dict[str, Any] | None = None):
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
        self._work: queue_module.Queue[Delivery | None] = queue_module.Queue()
        self._draining = threading.Event()
        self._stopped = threading.Event()
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._consumer_thread: threading.Thread | None = None
        self.consumer = Consumer(
            self.url, {self.names.job_queue(q): q for q in self.queues}, concurrency, self._work.put,
            topology=self.topology, declare=self._declare, heartbeat=heartbeat,
            connection_name=connection_name or f"ojs_kombu worker {','.join(self.queues)}",
            ssl=ssl, transport_options=transport_options,
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
        while time.monotonic() < deadline and (self._in_flight or not self._work.empty()):
            time.sleep(0.01)
        if self._in_flight:
            logger.warning("%d job(s) still running after %.1fs; the broker will redeliver them",
                           self._in_flight, grace)
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

    def __enter__(self) -> "Worker":
        self.start()
        self.wait_until_ready()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    # -- consumer thread -----------------------------------------------------------------------

    def _run_consumer(self) -> None:
        try:
            self.consumer.run()
        except Exception:  # noqa: BLE001 - the worker must report, not vanish
            logger.exception("the consumer stopped")

    def _declare(self, connection) -> None:
        for queue in self.queues:
            self.topology.ensure_scheduling(connection, queue, self.cascade)

    # -- handler threads -----------------------------------------------------------------------

    def _work_loop(self) -> None:
        while True:
            delivery = self._work.get()
            if delivery is None:
                return
            if self._draining.is_set():
                self._hand_back(delivery)
                continue
            with self._in_flight_lock:
                self._in_flight += 1
            try:
                self._process(delivery)
            except Exception:  # noqa: BLE001 - never let a bug kill a handler thread
                logger.exception("unexpected error processing a delivery; sending it to the DLQ")
                self.consumer.nack(delivery)
            finally:
                with self._in_flight_lock:
                    self._in_flight -= 1

    def _hand_back(self, delivery: Delivery) -> None:
        """An unstarted job at shutdown: republish it unchanged to its queue, then ack."""
        self.consumer.republish(delivery, delivery.outgoing(), self.names.direct_exchange, delivery.queue,
                                delivery.queue)

    def _process(self, delivery: Delivery) -> None:
        try:
            job = decode(delivery.body, delivery.properties, delivery.headers)
        except DecodeError as exc:
            self._reject_invalid(delivery, exc.code, str(exc))
            return
        attempt = job.attempt + 1
        if delivery.redelivered:
            failure = Failure("worker_lost", "WorkerLost",
                              f"attempt {attempt} was interrupted: the worker running it was lost")
            logger.warning("job %s was redelivered: counting attempt %d as failed (worker_lost)", job.id, attempt)
            self._fail(delivery, job, attempt, failure, decide(job, attempt, error_type="worker_lost"))
            return
        now = utcnow()
        expires = job.expires_datetime
        if expires is not None and expires <= now:
            logger.info("job %s expired at %s; discarded without running", job.id, job.expires_at)
            self.consumer.ack(delivery)
            return
        scheduled = job.scheduled_datetime
        if scheduled is not None and scheduled > now:
            self._delay(delivery, job, delay_ms_until(scheduled, now))
            return
        handler = self._handlers.get(job.type)
        if handler is None:
            self._reject_invalid(delivery, "unknown_type", f"no handler is registered for job type {job.type!r}")
            return
        running = job.model_copy(update={"attempt": attempt})
        token = _current_job.set(running)
        try:
            handler(*job.args, **job.kwargs)
        except BaseException as exc:  # noqa: BLE001 - any handler failure is a failed attempt
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            logger.info("job %s (%s) attempt %d failed: %r", job.id, job.type, attempt, exc)
            self._fail(delivery, job, attempt, Failure.from_exception(exc), decide(job, attempt, exc))
        else:
            self.consumer.ack(delivery)
        finally:
            _current_job.reset(token)

    # -- outcomes ------------------------------------------------------------------------------

    def _fail(self, delivery: Delivery, job: Job, attempt: int, failure: Failure, decision: Decision) -> None:
        if decision.outcome is Outcome.RETRY:
            self._retry(delivery, job, attempt, failure, decision.delay_ms)
        elif decision.outcome is Outcome.DISCARD:
            logger.info("job %s discarded: %s", job.id, decision.reason)
            self.consumer.ack(delivery)
        elif self.dead_letter_mode == "republish":
            failed = record_failure(job, attempt, failure)
            message = self._republished(delivery, failed, failure)
            self.consumer.republish(delivery, message, self.names.dead_letter_exchange, job.queue, job.queue)
        else:
            logger.info("job %s dead-lettered: %s", job.id, decision.reason)
            self.consumer.nack(delivery)

    def _retry(self, delivery: Delivery, job: Job, attempt: int, failure: Failure, delay_ms: int) -> None:
        retried = record_failure(job, attempt, failure)
        message = self._republished(delivery, retried, failure)
        queue = job.queue
        self.consumer.republish(
            delivery, message, self.names.retry_exchange, self.names.retry_routing_key(queue, delay_ms), queue,
            prepare=lambda connection: self.topology.ensure_retry_queue(connection, queue, delay_ms),
        )

    def _delay(self, delivery: Delivery, job: Job, delay_ms: int) -> None:
        """A job that arrived before its ``scheduled_at``: back into the cascade, unchanged."""
        try:
            key = routing_key(check_delay(delay_ms), job.queue)
        except ValidationError as exc:
            self._reject_invalid(delivery, "invalid_schedule", str(exc))
            return
        logger.debug("job %s arrived %d ms early; delaying it again", job.id, delay_ms)
        self.consumer.republish(delivery, delivery.outgoing(), self.cascade.top_exchange, key, job.queue,
                                prepare=lambda connection: self.topology.ensure_scheduling(
                                    connection, job.queue, self.cascade))

    def _republished(self, delivery: Delivery, job: Job, failure: Failure) -> OutgoingMessage:
        """The retry/dead-letter message: the original's properties and headers, ``x-death*``
        stripped, the envelope and the ``x-ojs-*`` headers updated, error headers set."""
        encoded = encode(job)
        original = delivery.outgoing()
        properties = {**encoded.properties, **original.properties,
                      "content_type": encoded.properties["content_type"],
                      "content_encoding": encoded.properties["content_encoding"]}
        headers = {**original.headers, **encoded.headers,
                   Header.ERROR_MESSAGE: failure.message[:MAX_ERROR_HEADER],
                   Header.ERROR_CODE: failure.code}
        return OutgoingMessage(encoded.body, properties, headers)

    def _reject_invalid(self, delivery: Delivery, code: str, message: str) -> None:
        """A message no handler can run: to its DLQ with the reason in the headers, then ack."""
        logger.warning("message %s on %s sent to the dead letter queue: %s (%s)",
                       delivery.properties.get("message_id"), delivery.queue, message, code)
        outgoing = delivery.outgoing({Header.ERROR_CODE: code, Header.ERROR_MESSAGE: message[:MAX_ERROR_HEADER]})
        self.consumer.republish(delivery, outgoing, self.names.dead_letter_exchange, delivery.queue,
                                delivery.queue)


__all__ = ["Worker", "current_job"]
