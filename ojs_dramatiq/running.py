"""Running Dramatiq messages under OJS: the delivered message, cancels while running, lifecycle events.

:class:`OjsRunning` is the middleware :class:`~ojs_dramatiq.OjsBroker` adds, last of those it
is given (so its before-hook runs after every other one, and its after-hooks, which Dramatiq
calls in reverse order, before ``Retries``).  Around every message an ``OjsBroker`` consumer
delivers it

* registers the worker thread with the broker's
  :class:`~ojs_kombu.runtime.control.Cancellations`, under the OJS job id and the Dramatiq
  message id (``OjsBroker.cancel`` names either), as ``TimeLimit`` registers it with its timer;
* skips the message (``SkipMessage``, acked, never run) when it was cancelled after it was
  delivered but before a worker thread took it;
* when the message is cancelled while its actor runs: sets :func:`current_cancelled` and, unless
  the broker was made with ``cancel_running="cooperative"``, raises
  :class:`ojs_kombu.Cancelled` in the actor's thread (``PyThreadState_SetAsyncExc``, what
  ``TimeLimit`` does; the same caveats: a thread blocked in C is interrupted when the call
  returns).  The message is then acked whatever the actor did, counted as cancelled, never
  retried by ``Retries`` and never dead-lettered; the worker thread goes on;
* emits the ``started`` event of the broker's :class:`~ojs_kombu.runtime.lifecycle.Lifecycle`
  (a message another middleware skips, such as ``AgeLimit``, never started: it has none) and
  notes what the actor did (:attr:`RunningMessage.ran`, :attr:`RunningMessage.result`); the
  outcome's event (``succeeded``, ``failed`` then ``retried`` / ``dead-lettered``, ``cancelled``)
  is the :class:`~ojs_kombu.runtime.settle.Settler`'s, when the consumer settles the message.

An actor that must not be cut short uses ``cancel_running="cooperative"`` and polls::

    from ojs_dramatiq import current_cancelled

    @dramatiq.actor
    def crunch(items):
        for item in items:
            if current_cancelled().is_set():
                return  # acked as cancelled, whatever it returns or raises
            process(item)
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any, Literal

from dramatiq.broker import Broker, MessageProxy
from dramatiq.message import Message
from dramatiq.middleware import Middleware, SkipMessage

from ojs_kombu.errors import OjsError
from ojs_kombu.model.job import Job
from ojs_kombu.runtime.activity import Activity
from ojs_kombu.runtime.consumer import Delivery
from ojs_kombu.runtime.control import Cancellations, RunningEntry
from ojs_kombu.runtime.lifecycle import Lifecycle

#: The run of the calling actor (its event is made only if the actor asks: most never do).
_current_run: contextvars.ContextVar[RunningEntry | None] = contextvars.ContextVar(
    "ojs_dramatiq_current_run", default=None
)


def current_cancelled() -> threading.Event:
    """The ``cancelled`` event of the message the calling actor runs: set (within ~1 s of
    ``OjsBroker.cancel`` or ``ojs_kombu.Client.cancel``) when it has been cancelled.

    Raises:
        OjsError: outside an actor run by a worker of an :class:`~ojs_dramatiq.OjsBroker`.
    """
    run = _current_run.get()
    if run is None:
        raise OjsError("current_cancelled() is only available inside an actor run from an OjsBroker")
    return run.cancelled


class RunningMessage(MessageProxy):
    """A message delivered with its OJS job (``ojs_job``, ``attempt`` = executions before this
    one) and its AMQP delivery: what :class:`OjsRunning` looks after.

    :class:`~ojs_dramatiq.OjsMessageProxy` is the one :class:`~ojs_dramatiq.OjsBroker` delivers.
    """

    def __init__(self, message: Message[Any], job: Job, delivery: Delivery):
        super().__init__(message)
        self.ojs_job = job
        self.ojs_delivery = delivery
        self.running: RunningEntry | None = None  # while a worker thread runs it
        #: Whether its actor ran to the end, not cancelled (returned or raised): set after it ran.
        self.ran = False
        #: What its actor returned (``None`` until it has).
        self.result: Any = None
        self._cancellations: Cancellations | None = None  # the broker's, while a worker thread runs it
        self._run_token: contextvars.Token[RunningEntry | None] | None = None

    @property
    def execution(self) -> int:
        """This execution of the job, 1-based (the ``attempt`` of its events and logs)."""
        return self.ojs_job.attempt + 1

    def stuff_exception(self, exception: BaseException) -> None:
        """Dramatiq's first step after an actor raised: from here on, a cancel no longer
        interrupts this thread (Dramatiq's own code runs until the after-hooks: an exception
        raised in its error logging would kill the worker thread; seen in CI)."""
        super().stuff_exception(exception)
        entry, cancellations = self.running, self._cancellations
        if entry is not None and cancellations is not None:
            cancellations.ended(entry)
            if entry.is_cancelled:
                # What a cancel makes the actor raise is expected: Dramatiq logs an exception the
                # message "throws" at INFO, not as an unhandled one at ERROR (and never retries it).
                self.options["throws"] = BaseException

    def settle_cancelled(self, state: Literal["pending", "running"]) -> None:
        """Ack the cancelled message (once), count it and emit ``cancelled``."""
        raise NotImplementedError


class OjsRunning(Middleware):
    """Cancels of running messages and lifecycle events (see the module docstring).

    Parameters:
        cancellations: the broker's cancels, shared with its consumers' control readers.
        lifecycle: where the events go.
        activity: the broker's INFO answers: told each message's id as an alias of its job id,
            so INFO finds it by the Dramatiq ``message_id`` too (None: not told).
    """

    def __init__(self, cancellations: Cancellations, lifecycle: Lifecycle, activity: Activity | None = None):
        self.cancellations = cancellations
        self.lifecycle = lifecycle
        self.activity = activity
        self._by_thread: dict[int, RunningMessage] = {}  # what each worker thread runs now

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        """Register the thread; skip the message if it is cancelled already."""
        if not isinstance(message, RunningMessage):
            return
        thread_id = threading.get_ident()
        stale = self._by_thread.pop(thread_id, None)
        if stale is not None:  # its after-hook never ran (an interruption landed in Dramatiq's own code)
            self._leave(stale)
        job = message.ojs_job
        entry = self.cancellations.enter(job.id, job.queue, aliases=(message.message_id,))
        message.running = entry
        message._cancellations = self.cancellations
        message._run_token = _current_run.set(entry)
        self._by_thread[thread_id] = message
        if self.activity is not None:
            self.activity.alias(job.id, (message.message_id,))
        if entry.is_cancelled:
            raise SkipMessage(f"message {message.message_id} was cancelled")
        self.lifecycle.emit("started", job, message.execution)

    def after_process_message(
        self, broker: Broker, message: MessageProxy, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        """Unregister the thread; settle a cancelled message (ack) before ``Retries`` sees it, else note
        that the actor ran and what it returned (its consumer settles it)."""
        if not isinstance(message, RunningMessage) or not self._leave(message):
            return
        assert message.running is not None
        if message.running.is_cancelled:
            message.settle_cancelled("running")
            if exception is not None:
                # Dramatiq's own way to say "do not retry this": Retries fails the message instead
                # (a no-op nack: it is acked already) and sends no on_retry_exhausted message.
                message.options["throws"] = BaseException
            return
        message.ran, message.result = True, result  # settled (and its event emitted) by the ack or nack

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        """Unregister the thread; settle a message skipped because it was cancelled."""
        if not isinstance(message, RunningMessage) or not self._leave(message):
            return
        assert message.running is not None
        if message.running.is_cancelled:
            message.settle_cancelled("pending")

    def _leave(self, message: RunningMessage) -> bool:
        """Unregister ``message``'s run; False when it was not registered (or left already)."""
        entry = message.running
        if entry is None or not entry.active:
            return False
        self.cancellations.leave(entry)
        self._by_thread.pop(entry.thread_id, None)
        token, message._run_token = message._run_token, None
        if token is not None:
            try:
                _current_run.reset(token)
            except ValueError:  # left from another context (a stale run): nothing to restore
                _current_run.set(None)
        return True


__all__ = ["OjsRunning", "RunningMessage", "current_cancelled"]
