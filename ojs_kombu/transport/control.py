"""The control plane of an ``ojs://`` connection: the control streams of the job queues it consumes.

The first ``Basic.Consume`` of a job queue ``q`` on a connection first reads
``ojs.queue.control.{q}`` with the runtime's
:class:`~ojs_kombu.runtime.control.ControlReader`, on a channel of its own of
the same py-amqp connection (py-amqp dispatches every channel's frames from
the one ``drain_events``), and returns only once the stream has been replayed
up to the reader's marker.  So every cancel still retained is known before a
job of ``q`` is delivered, on every (re)connection: a new connection replays
again.  Live control messages then arrive with the job deliveries, in the
thread that owns the connection (kombu's consumer, Celery's event loop).

* A cancelled job is acked and dropped when it is delivered (the channel's
  :class:`~ojs_kombu.runtime.settle.Settler` gets ``cancelled=``), wherever it
  was: queued, in the scheduling cascade or waiting for a retry.  The framework
  never sees it.
* Every cancel read (replayed or live) is also handed to the transport option
  ``on_cancel`` (a callable ``on_cancel(job_id)``, or ``"module:function"``):
  that is how a framework learns about jobs it already holds
  (:mod:`ojs_celery.control` revokes them).  The transport itself does not know
  the framework.
* INFO requests are answered with the transport option ``info`` (a function
  ``info(job_id) -> JobInfo | None``, or ``"module:function"``) when it is set.
* Pauses and resumes are recorded (:attr:`ConnectionControl.paused`) and
  applied by the channel (see :meth:`Channel.apply_pauses
  <ojs_kombu.transport.channel.Channel.apply_pauses>`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ojs_kombu.amqp.topology import Topology
from ojs_kombu.model.info import JobInfo
from ojs_kombu.model.naming import Names
from ojs_kombu.runtime.control import Cancellations, ControlReader, PausedQueues

logger = logging.getLogger(__name__)

OnCancel = Callable[[str], None]
"""The ``on_cancel`` hook: called with the (lowercase) id of every cancelled job read."""


class HookedCancellations(Cancellations):
    """:class:`Cancellations` that also hand every cancel read to an ``on_cancel`` hook.

    Parameters:
        on_cancel: called with each cancelled job id (replays included: the hook
            must be idempotent); an exception it raises is logged, never propagated.
    """

    def __init__(self, on_cancel: OnCancel | None = None):
        super().__init__("cooperative")  # the framework runs the jobs, not the transport
        self.on_cancel = on_cancel

    def cancel(self, job_id: str) -> None:
        """Record the cancel, then call the hook."""
        super().cancel(job_id)
        if self.on_cancel is None:
            return
        try:
            self.on_cancel(job_id.lower())
        except Exception:
            logger.exception("the on_cancel hook failed for job %s", job_id)


class ConnectionControl:
    """The control streams read on one py-amqp connection, one reader per consumed job queue.

    Parameters:
        names: the entity names.
        topology: the connection's topology (declares the control streams, knows degraded ones).
        on_cancel: the transport option ``on_cancel``.
        info: the transport option ``info``: answers INFO requests (``None``: they are not answered).
        replay_timeout: seconds a replay may take before the consume fails (recoverable).
    """

    def __init__(
        self,
        names: Names,
        topology: Topology,
        on_cancel: OnCancel | None,
        *,
        info: Callable[[str], JobInfo | None] | None = None,
        replay_timeout: float = 60.0,
    ):
        self.names = names
        self.topology = topology
        self.info = info
        self.cancellations = HookedCancellations(on_cancel)
        self.paused = PausedQueues()
        self.replay_timeout = replay_timeout
        self._readers: dict[str, ControlReader] = {}

    def is_cancelled(self, job_id: str) -> bool:
        """Whether a control stream read on this connection cancelled ``job_id``."""
        return self.cancellations.is_cancelled(job_id)

    def is_reading(self, queue: str) -> bool:
        """Whether the control stream of OJS queue ``queue`` is read on this connection."""
        return queue in self._readers

    def ensure_reading(self, connection: Any, queue: str) -> None:
        """Read the control stream of ``queue`` on ``connection``, replayed up to now, if not yet.

        Parameters:
            connection: the open py-amqp connection (called in its owner thread).
            queue: the OJS queue about to be consumed.

        Raises:
            RecoverableConnectionError: the replay did not finish within ``replay_timeout``.
        """
        if queue in self._readers:
            return
        self.topology.declare(connection, self.topology.control_specs(queue))
        reader = ControlReader(
            self.names,
            self.topology,
            [queue],
            self.cancellations,
            paused=self.paused,
            replay_timeout=self.replay_timeout,
            info=self.info,
        )
        reader.attach(connection)
        self._readers[queue] = reader

    def maintain(self, connection: Any) -> None:
        """Re-consume control streams the broker cancelled (called from the connection's loop)."""
        for reader in self._readers.values():
            reader.maintain(connection)


__all__ = ["ConnectionControl", "HookedCancellations", "OnCancel"]
