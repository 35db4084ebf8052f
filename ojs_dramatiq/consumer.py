"""Consuming a Dramatiq queue of an :class:`~ojs_dramatiq.OjsBroker`, and settling its messages.

:meth:`OjsBroker.consume <ojs_dramatiq.OjsBroker.consume>` returns an ``OjsConsumer``: an
:class:`ojs_kombu.runtime.consumer.Consumer` and its :class:`~ojs_kombu.runtime.settle.Settler`,
built by the broker's :class:`~ojs_kombu.runtime.assembly.Assembly` as an ``ojs_kombu.Worker``'s
are.  Its messages are :class:`OjsMessageProxy`; whatever Dramatiq then does with one (ack,
nack, a retry through ``enqueue``, a requeue) is one call of the Settler.

A job's own ``rate_limit`` (``Client.enqueue(..., rate_limit=...)``) holds as it does in an
``ojs_kombu.Worker``: the consumer's :class:`~ojs_kombu.runtime.limits.Limiter` (on the broker's
permits) admits each job before Dramatiq sees it, parks it (``on_limit`` "wait") or settles it, and
the permits go back when the message is settled.
"""

from __future__ import annotations

import logging
import queue as queue_module
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal

from dramatiq.broker import Consumer, MessageProxy
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message

from ojs_kombu.amqp.permits import Permits
from ojs_kombu.errors import DecodeError
from ojs_kombu.model.job import Job
from ojs_kombu.policy.retry import Decision, Failure, Outcome
from ojs_kombu.runtime.assembly import Assembly
from ojs_kombu.runtime.delivery import Delivery
from ojs_kombu.runtime.limits import Admitted, Limiter

from .encoder import updated_job
from .errors import dramatiq_error
from .running import RunningMessage

logger = logging.getLogger(__name__)


class OjsMessageProxy(RunningMessage):
    """A message delivered by :class:`OjsBroker`: the Dramatiq message, plus the OJS job
    (``ojs_job``, ``attempt`` = executions before this one), the AMQP delivery and the
    consumer that received it (``origin``), which settles it."""

    def __init__(self, message: Message[Any], job: Job, delivery: Delivery, origin: OjsConsumer):
        super().__init__(message, job, delivery)
        self.origin = origin
        self.settled = False
        self.held: Admitted = ()  # the permits of its rate_limit, given back when it is settled

    def settle_cancelled(self, state: Literal["pending", "running"]) -> None:
        """Ack the cancelled message (once), count it and emit ``cancelled``."""
        self.origin.settle_cancelled(self.ojs_delivery, self.ojs_job, state, self)


class OjsConsumer(Consumer):
    """Consumes one Dramatiq queue through an :class:`ojs_kombu.runtime.consumer.Consumer`.

    The AMQP consumer loop runs in its own thread and hands deliveries over
    through a queue; acks, nacks and republishes from Dramatiq's worker threads
    are marshalled to that loop (the only user of its connection), which
    reconnects, re-declares and re-consumes by itself (DESIGN §9).  On every
    (re)connection it first replays the queue's control stream into the broker's
    cancellations and paused queues.

    Before it consumes it declares what consuming needs, not the scheduling cascade
    (:meth:`Topology.ensure_consumable <ojs_kombu.amqp.topology.Topology.ensure_consumable>`):
    whoever schedules a job (``delay=``, a retry, an early delivery) declares the cascade first.

    Parameters:
      assembly: the broker's parts (its cancels, pauses, lifecycle ...).
      queue_name: the Dramatiq queue.
      ojs_queue: its OJS queue.
      prefetch: ``Basic.Qos`` prefetch count.
      timeout: milliseconds :meth:`__next__` waits for a message.
      message_for: the Dramatiq message of a delivered job (raises ``DecodeError``).
      permits: the broker's permits (for jobs with a ``rate_limit``; shared, not closed here).
    """

    def __init__(
        self,
        assembly: Assembly,
        queue_name: str,
        ojs_queue: str,
        prefetch: int,
        timeout: int,
        message_for: Callable[[Job], Message[Any]],
        permits: Callable[[], Permits],
    ):
        self.queue_name = queue_name
        self.timeout = timeout / 1000
        self._message_for = message_for
        self._cancellations = assembly.cancellations
        self._deliveries: queue_module.SimpleQueue[Delivery] = queue_module.SimpleQueue()
        self._lock = threading.Lock()
        self._unsettled = 0
        self._error: BaseException | None = None
        parts = assembly.consuming(
            [ojs_queue], prefetch, self._on_delivery, connection_name=f"ojs_dramatiq consumer {queue_name}"
        )
        self.consumer, self.settler, self.completed = parts.consumer, parts.settler, parts.completed
        self.limiter = Limiter(
            permits,
            {},
            self.settler,
            self._deliveries.put,  # a parked delivery admitted: back through __next__ with its permits
            park_limit=prefetch // 2,
            generation=lambda: self.consumer.generation,
            forsake=self._forsake,
        )
        self._thread = threading.Thread(target=self._run, name=f"ojs-dramatiq-{queue_name}", daemon=True)
        self._thread.start()

    @property
    def unsettled(self) -> int:
        """Deliveries received and not yet acked, nacked or republished."""
        return self._unsettled

    def _run(self) -> None:
        try:
            self.consumer.run()
        except BaseException as exc:  # noqa: BLE001 - reported to the ConsumerThread by __next__
            logger.error("the consumer of %s stopped: %s", self.queue_name, exc)
            self._error = exc

    def _on_delivery(self, delivery: Delivery) -> None:
        with self._lock:
            self._unsettled += 1
        self._deliveries.put(delivery)

    def _forsake(self, delivery: Delivery) -> None:  # parked while its connection was lost: redelivered
        self._settled()

    def _settled(self, proxy: OjsMessageProxy | None = None) -> bool:
        if proxy is not None:
            if proxy.settled:
                return False
            proxy.settled = True
            if proxy.held:
                self.limiter.release(proxy.held)
        with self._lock:
            self._unsettled -= 1
        return True

    def __next__(self) -> OjsMessageProxy | None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                delivery = self._deliveries.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue_module.Empty:
                if self._error is not None:
                    raise dramatiq_error(ConnectionClosed, self._error) from self._error
                return None
            proxy = self._proxy(delivery)
            if proxy is not None:
                return proxy

    def _proxy(self, delivery: Delivery) -> OjsMessageProxy | None:
        if delivery.generation != self.consumer.generation:
            self._settled()  # its channel is gone and the broker redelivers it: do not run it twice
            return None
        job = self.settler.triage(delivery)
        if job is None:
            self.limiter.forget(delivery)  # admitted after waiting, then cancelled meanwhile ...
            self._settled()
            return None
        try:
            message = self._message_for(job)
        except DecodeError as exc:
            self.settler.reject_invalid(delivery, exc.code, str(exc))
            self._settled()
            return None
        if self._cancellations.is_cancelled(message.message_id):  # by OjsBroker.cancel (triage knows job ids)
            self.limiter.forget(delivery)
            self.settle_cancelled(delivery, job, "pending")
            return None
        verdict = self.limiter.admit(delivery, job)
        if isinstance(verdict, str):
            if verdict == "settled":  # rescheduled or dropped
                self._settled()
            return None  # or parked: back through __next__ once admitted
        proxy = OjsMessageProxy(message, job, delivery, self)
        proxy.held = verdict
        return proxy

    def settle_cancelled(
        self, delivery: Delivery, job: Job, state: Literal["pending", "running"], proxy: OjsMessageProxy | None = None
    ) -> None:
        """A cancelled message, settled by the Settler: acked (never retried, never dead-lettered),
        counted, logged, ``cancelled``.

        Parameters:
          delivery: its delivery.
          job: its job.
          state: ``"pending"`` (it never ran) or ``"running"`` (its actor ran).
          proxy: the message, once a worker thread has it (settled once only).
        """
        if self._settled(proxy):
            self.settler.cancel(delivery, job, job.attempt + 1, state)

    def ack(self, message: MessageProxy) -> None:
        """Settle a message Dramatiq acks (from any thread), unless it was settled already (retried,
        cancelled): its actor returned (``succeeded``), raised and was not retried (``throws``, no
        ``Retries``: a failed attempt, discarded), or a middleware skipped it (acked, no event)."""
        if not isinstance(message, OjsMessageProxy):
            logger.warning("ignoring an ack of %r: it was not consumed from an OjsBroker", message)
            return
        origin = message.origin
        if not origin._settled(message):
            return
        settler, delivery, job = origin.settler, message.ojs_delivery, message.ojs_job
        exception = message._exception
        if exception is not None:
            failure = Failure.from_exception(exception)
            settler.fail_attempt(
                delivery, job, message.execution, failure, Decision(Outcome.DISCARD, reason="not retried by Dramatiq")
            )
        elif message.ran:
            settler.succeed(delivery, job, message.execution, message.result)
        else:
            settler.skip(delivery, job, "skipped by a Dramatiq middleware")

    def nack(self, message: MessageProxy) -> None:
        """Into ``ojs.queue.dlx.{q}`` (from any thread), as the broker's ``dead_letter_mode`` says."""
        if not isinstance(message, OjsMessageProxy):
            logger.warning("ignoring a nack of %r: it was not consumed from an OjsBroker", message)
            return
        origin = message.origin
        if not origin._settled(message):
            return
        failure = _failure(message, "MessageFailed", "the message failed")
        job = updated_job(message.ojs_job, message._message)
        origin.settler.fail_attempt(
            message.ojs_delivery, job, job.attempt + 1, failure, Decision(Outcome.DEAD_LETTER, reason="failed")
        )

    def retry(self, message: OjsMessageProxy, delay_ms: int) -> None:
        """A failed attempt the ``Retries`` middleware retries (``OjsBroker.enqueue(message, delay=…)``):
        the job to its retry queue ``delay_ms`` from now (attempt+1, error headers), then the delivery
        acked (the Settler's ``failed`` and ``retried``).

        Raises:
          ValidationError: a middleware put what JSON cannot carry into the message's options; the
            message is failed (nacked by Dramatiq), never acked without its retry.
        """
        failure = _failure(message, "Retry", "retry requested")
        try:
            job = updated_job(message.ojs_job, message._message)
        except Exception:
            message.fail()
            raise
        if self._settled(message):
            self.settler.fail_attempt(
                message.ojs_delivery, job, job.attempt + 1, failure, Decision(Outcome.RETRY, delay_ms=delay_ms)
            )

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        """Hand unstarted messages back unchanged (confirmed republish, then ack): no attempt is spent."""
        for message in messages:
            if not isinstance(message, OjsMessageProxy):
                logger.warning("ignoring a requeue of %r: it was not consumed from an OjsBroker", message)
                continue
            origin = message.origin
            if origin._settled(message):
                origin.settler.hand_back(message.ojs_delivery)

    def close(self) -> None:
        """Stop consuming, hand back what was received but never started, settle, close."""
        if self._thread.is_alive():
            self.consumer.stop_consuming()
            deadline = time.monotonic() + 5
            while self.consumer.consuming and self._thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
        while True:
            try:
                delivery = self._deliveries.get_nowait()
            except queue_module.Empty:
                break
            self.limiter.forget(delivery)
            self.settler.hand_back(delivery)
            self._settled()
        for delivery in self.limiter.stop():  # parked, waiting for a permit or a start
            self.settler.hand_back(delivery)
            self._settled()
        if self.completed is not None:
            self.completed.stop()  # its confirms ack the last messages: before the consumer stops
        self.consumer.stop()
        self._thread.join(timeout=30)
        self.limiter.close(close_permits=False)
        self.consumer.close()


def _failure(message: MessageProxy, error_type: str, text: str) -> Failure:
    """What failed in ``message``: the exception its actor raised, else ``error_type`` and ``text``."""
    exception = message._exception
    if exception is not None:
        return Failure.from_exception(exception)
    return Failure("handler_error", error_type, text)


__all__ = ["OjsConsumer", "OjsMessageProxy"]
