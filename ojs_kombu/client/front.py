"""The producer side: :class:`Client`, a front over capability services sharing one session.

::

    from ojs_kombu import Client

    with Client("amqp://guest:guest@localhost//") as client:
        job = client.enqueue("email.send", ["user@example.com", "welcome"], queue="email")
        outcomes = client.enqueue_many([Job.create("report.build", [i]) for i in range(1000)])

Each public method is a delegate to a service (:mod:`~ojs_kombu.client.publishing`,
:mod:`~ojs_kombu.client.control`, :mod:`~ojs_kombu.client.deadletters`,
:mod:`~ojs_kombu.client.observation`), and every service works through the one
:class:`~ojs_kombu.client.session.Session` (connection pool, reconnect budget, settings).
The job queue and its dead letter queue are declared before the first publish to a
queue (lazy declaration) or up front with ``queues=`` / :meth:`Client.declare_queue`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar, Unpack, overload

from ojs_kombu.amqp.connection import DEFAULT_HEARTBEAT, resolve_url, safe_url
from ojs_kombu.amqp.topology import OnConflict, Topology
from ojs_kombu.amqp.urls import BrokerUrls
from ojs_kombu.client.control import Control
from ojs_kombu.client.deadletters import DEFAULT_REPLAY_WINDOW, DeadLetters
from ojs_kombu.client.observation import DEFAULT_STALE_AFTER, Observation
from ojs_kombu.client.publishing import Publishing
from ojs_kombu.client.results import EnqueueResult, JobOptions, QueueCounts
from ojs_kombu.client.session import ConnectionSettings, Session
from ojs_kombu.client.uniqueness import DEFAULT_REPLACE_TIMEOUT, Uniqueness
from ojs_kombu.client.workflows import Workflows
from ojs_kombu.model.cron import CronJob, OverlapPolicy
from ojs_kombu.model.info import JobInfo
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import Names
from ojs_kombu.model.workflow import Workflow
from ojs_kombu.model.workflow_info import WorkflowInfo
from ojs_kombu.policy.schedule import Cascade
from ojs_kombu.runtime.cron import CronRegistry, RegisteredCron
from ojs_kombu.runtime.deadletter import DeadLetterEntry, ReplayProgress
from ojs_kombu.wire.control import ControlOptions
from ojs_kombu.wire.entities import QueueOptions, QueueType
from ojs_kombu.wire.events import EventsOptions, JobEventRecord, WorkerPresence

#: Seconds a Client operation keeps reconnecting before BrokerConnectionError (``publish_timeout``).
DEFAULT_PUBLISH_TIMEOUT = 5.0

T = TypeVar("T")


class _Shared(Generic[T]):
    """A Client attribute that is the session's setting of the same name (read and written there)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, client: None, owner: type) -> _Shared[T]: ...
    @overload
    def __get__(self, client: Client, owner: type) -> T: ...
    def __get__(self, client: Client | None, owner: type) -> _Shared[T] | T:
        if client is None:
            return self
        value: T = getattr(client._session, self.name)
        return value

    def __set__(self, client: Client, value: T) -> None:
        setattr(client._session, self.name, value)


class Client:
    """Enqueues OJS jobs on RabbitMQ; thread-safe, a context manager.

    Parameters:
        url: broker URL (``amqp://``, ``amqps://``, ``ojs://``, ``ojss://``), or a cluster's nodes as a
            ``;``-separated list or a list of URLs: on a connection loss the client moves to the next
            node, backing off once all failed in a row (``docs/cluster.md``).  Default ``$OJS_AMQP_URL``.
        prefix: multi-tenant prefix of every entity name (``tenant1.ojs.queue.email``).
        queue_options: optional arguments of every job queue this client declares.
        queue_type: ``"quorum"`` or ``"classic"``: ``queue_options.queue_type`` (``docs/cluster.md``).
        queues: job queues declared eagerly when the client starts.
        declare: declare a job queue lazily before the first publish to it.
        pool_size: at most this many connections (one per concurrently publishing thread).
        confirm_timeout: seconds to wait for publisher confirms.
        publish_timeout: seconds an operation keeps reconnecting once an attempt failed (back-off
            ``min(2^(n-1), 60)`` s ±25 %, DESIGN §9; each connect capped by what is left), then
            :class:`BrokerConnectionError`.  Default 5 s; ``None``: no time limit.
        connect_retries: also give up after this many failed reconnections (``None``: no limit).
        heartbeat: AMQP heartbeat in seconds.
        app_id: ``app_id`` property of published jobs (default ``"ojs"``).
        on_conflict: a queue that exists with other arguments: ``"use-existing"`` (warn) or ``"raise"``.
        connection_name: shown by the broker (management UI) for this client's connections.
        ssl: TLS: ``None`` (``amqps://`` / ``ojss://`` URLs only, system CAs), ``True``, or a dict
            (:func:`ojs_kombu.amqp.connection.tls_options`); chain and host name are verified unless
            ``verify`` is ``False`` (else :class:`~ojs_kombu.errors.TlsVerificationError` at once).
        transport_options: passed to :class:`kombu.Connection`.
        window: publishes a connection may have awaiting their confirm.
        control: retention of the control streams ``ojs.queue.control.{q}`` this client declares.
        events_options: retention of the events stream ``ojs.stream.events`` (declared by
            :meth:`workers` and :meth:`events`); must match the workers'.
        gc_pause: pause the cyclic garbage collector while a large :meth:`enqueue_many` publishes.
        unique_backend: where unique jobs' locks are: None (RabbitMQ queues) or a Redis URL (the
            ``redis`` extra); the same for a deployment's publishers and workers (``docs/unique-jobs.md``).
        unique_replace_timeout: seconds ``on_conflict="replace"`` waits for a *running* holder to end
            once cancelled, then :class:`DuplicateJobError` (:mod:`ojs_kombu.client.uniqueness`).

    Raises:
        ValidationError: a bad option, or a bad failover list (empty, malformed, mixed schemes).
        BrokerConnectionError, BrokerRefusedError: declaring ``queues`` failed.
    """

    url: _Shared[str] = _Shared()
    names: _Shared[Names] = _Shared()
    topology: _Shared[Topology] = _Shared()
    cascade: _Shared[Cascade] = _Shared()
    declare: _Shared[bool] = _Shared()
    confirm_timeout: _Shared[float] = _Shared()
    publish_timeout: _Shared[float | None] = _Shared()
    connect_retries: _Shared[int | None] = _Shared()
    heartbeat: _Shared[float] = _Shared()
    app_id: _Shared[str | None] = _Shared()
    window: _Shared[int] = _Shared()
    connection_name: _Shared[str] = _Shared()

    def __init__(
        self,
        url: BrokerUrls | None = None,
        *,
        prefix: str = "",
        queue_options: QueueOptions | None = None,
        queue_type: QueueType | None = None,
        queues: Iterable[str] = (),
        declare: bool = True,
        pool_size: int = 10,
        confirm_timeout: float = 30.0,
        publish_timeout: float | None = DEFAULT_PUBLISH_TIMEOUT,
        connect_retries: int | None = None,
        heartbeat: float = DEFAULT_HEARTBEAT,
        app_id: str | None = None,
        on_conflict: OnConflict = "use-existing",
        ssl: Any = None,
        transport_options: dict[str, Any] | None = None,
        window: int = 1000,
        connection_name: str | None = None,
        control: ControlOptions | None = None,
        events_options: EventsOptions | None = None,
        gc_pause: bool = True,
        unique_backend: str | None = None,
        unique_replace_timeout: float = DEFAULT_REPLACE_TIMEOUT,
    ):
        name = connection_name or f"ojs_kombu client {socket.gethostname()} pid {os.getpid()}"
        options = (queue_options or QueueOptions()).with_queue_type(queue_type)
        self._session = Session(
            ConnectionSettings(resolve_url(url), heartbeat, ssl, transport_options, name, pool_size),
            Topology(
                Names(prefix), queue_options=options, on_conflict=on_conflict, control=control, events=events_options
            ),
            declare=declare,
            confirm_timeout=confirm_timeout,
            publish_timeout=publish_timeout,
            connect_retries=connect_retries,
            app_id=app_id,
            window=window,
        )
        # The capability services; a new one (workflows, cron) is a Service over the same session.
        self._control = Control(self._session)
        self._uniqueness = Uniqueness(
            self._session, self._control, backend=unique_backend, replace_timeout=unique_replace_timeout
        )
        self._publishing = Publishing(self._session, gc_pause=gc_pause, uniqueness=self._uniqueness)
        self._dead_letters = DeadLetters(self._session)
        self._observation = Observation(self._session)
        self._workflows = Workflows(self._session)
        self._cron = CronRegistry(self._session.run, self._session.names, self._session.topology)
        for queue in queues:
            self.declare_queue(queue)

    def enqueue(self, type: str, args: list[Any] | tuple[Any, ...] | None = None, **options: Unpack[JobOptions]) -> Job:
        """Create a job (:meth:`Job.create`) and enqueue it.

        Parameters:
            type: the job type (``"email.send"``).
            args: its positional arguments (JSON values).
            options: the keyword options of :meth:`Job.create` (:class:`JobOptions`): ``queue``,
                ``kwargs``, ``meta``, ``priority``, ``retry``, ``scheduled_at``, ``expires_at``,
                ``unique`` (a :class:`~ojs_kombu.UniquePolicy`: see ``docs/unique-jobs.md``),
                ``rate_limit`` (a :class:`~ojs_kombu.RateLimitPolicy`: see ``docs/limits.md``), ...

        Returns:
            The confirmed job.  A duplicate under ``unique=UniquePolicy(on_conflict="ignore")``
            publishes nothing and returns the job passed with the existing job's id.

        Raises:
            DuplicateJobError: ``unique`` and another job holds its key (``on_conflict="reject"``);
                ``.existing_id`` is that job's id.
            ValidationError: a bad argument (nothing is published).
            UnroutableError, PublishNackedError, PublishTimeoutError: the broker did not take it.
            BrokerConnectionError: the broker could not be reached within ``publish_timeout``.
            BrokerRefusedError: the broker refused the login, the vhost or a permission.
        """
        return self._publishing.enqueue_job(Job.create(type, args, **options))

    def enqueue_job(self, job: Job) -> Job:
        """Enqueue an existing :class:`Job`; same outcomes as :meth:`enqueue`.

        A job whose ``scheduled_at`` lies ahead goes through the scheduling
        cascade and reaches its queue at that time, never earlier.
        """
        return self._publishing.enqueue_job(job)

    def enqueue_many(self, jobs: Iterable[Job]) -> list[EnqueueResult]:
        """Enqueue many jobs: pipelined publishes on one channel, then all confirms.

        Unless ``Client(gc_pause=False)``, a batch of 1,000 jobs or more is published with the
        cyclic garbage collector paused, for its first publishing attempt at most (never a
        reconnect's wait, never a stalled broker's): see :meth:`~ojs_kombu.client.publishing.Publishing.enqueue_many`.

        Parameters:
            jobs: the jobs, e.g. from :meth:`Job.create`.

        Returns:
            One :class:`EnqueueResult` per job, in order; a failed job carries its error alone.
        """
        return self._publishing.enqueue_many(list(jobs))

    def enqueue_workflow(self, workflow: Workflow) -> str:
        """Enqueue a workflow (``ojs_kombu.chain``, ``group`` or ``batch``); returns its id.

        Parameters, result and errors: :meth:`~ojs_kombu.client.workflows.Workflows.enqueue`.
        """
        return self._workflows.enqueue(workflow)

    def workflow(self, workflow_id: str) -> WorkflowInfo:
        """The state of a workflow (ojs-workflows.md §11.2): its state, every job's, the counters.

        Parameters, result and errors: :meth:`~ojs_kombu.client.workflows.Workflows.workflow`.
        """
        return self._workflows.workflow(workflow_id)

    def cancel_workflow(self, workflow_id: str) -> WorkflowInfo:
        """Cancel a workflow (ojs-workflows.md §11.3): its jobs not yet enqueued never run, the others get :meth:`cancel`.

        Parameters, result and errors: :meth:`~ojs_kombu.client.workflows.Workflows.cancel`.
        """
        return self._workflows.cancel(workflow_id)

    def cancel(self, job_id: str, *, queue: str) -> None:
        """CANCEL (binding §5.6, AMQP-019): cancel job ``job_id`` of ``queue``, wherever it is.

        Publishes ``type=ojs.control.cancel`` with key ``control.{queue}`` (confirmed, mandatory) to
        the control stream ``ojs.queue.control.{queue}``, which every worker of the queue reads,
        including workers started later (within its retention).  A job not yet run is acked and
        dropped when delivered; a running job on an ``ojs_kombu.Worker`` gets ``current_job().cancelled``
        set and, by default, :class:`~ojs_kombu.errors.Cancelled` raised in its handler.  Cancelling a
        finished or unknown job is harmless.

        Parameters:
            job_id: the job's id.
            queue: the OJS queue the job belongs to.

        Raises:
            ValidationError: a bad queue name or job id (nothing is published).
            UnroutableError: nothing is bound to ``control.{queue}`` (only possible in the
                degraded mode of a classic control queue, with no worker running).
            PublishNackedError, PublishTimeoutError: the broker did not take it.
            BrokerConnectionError, BrokerRefusedError: as for :meth:`enqueue`.
        """
        self._control.cancel(job_id, queue)

    def pause(self, queue: str) -> None:
        """Pause ``queue``: every ``ojs_kombu.Worker`` of it stops consuming it (``Basic.Cancel``).

        Published (``type=ojs.control.pause``) to the control stream as :meth:`cancel` is.  Workers
        settle the jobs they hold; new ones wait in the queue.  The pause outlives worker restarts:
        a worker replays the control stream at start, and the queue's last pause or resume decides.

        Parameters:
            queue: the OJS queue.

        Raises:
            ValidationError, UnroutableError, PublishNackedError, PublishTimeoutError,
            BrokerConnectionError, BrokerRefusedError: as for :meth:`cancel`.
        """
        self._control.pause(queue)

    def resume(self, queue: str) -> None:
        """Resume ``queue`` after :meth:`pause`: its workers consume it again (``Basic.Consume``).

        Publishes ``type=ojs.control.resume``; resuming a queue that is not paused is harmless.

        Parameters:
            queue: the OJS queue.

        Raises:
            ValidationError, UnroutableError, PublishNackedError, PublishTimeoutError,
            BrokerConnectionError, BrokerRefusedError: as for :meth:`cancel`.
        """
        self._control.pause(queue, paused=False)

    def info(self, job_id: str, *, queue: str, timeout: float = 2.0) -> JobInfo | None:
        """INFO (binding §5.8, AMQP-021): what the live workers of ``queue`` know about job ``job_id``.

        An RPC over the control stream (``type=ojs.control.info`` with ``reply_to`` a server-named
        exclusive queue and a fresh ``correlation_id``): every worker that runs the job, or
        finished it recently, answers.  The first ``active`` answer is returned at once; else the
        latest outcome received until ``INFO_SETTLE_WINDOW`` s after the first (or ``timeout``).

        Parameters:
            job_id: the job's id (any case).
            queue: the OJS queue the job belongs to.
            timeout: seconds to wait for answers (> 0).

        Returns:
            The job's :class:`~ojs_kombu.model.info.JobInfo`, or None: no live worker knows it.

        Raises:
            ValidationError: a bad job id, queue name or timeout (nothing is published).
            PublishNackedError, PublishTimeoutError, UnroutableError: the broker did not take the request.
            BrokerConnectionError, BrokerRefusedError: as for :meth:`enqueue`.
        """
        return self._control.info(job_id, queue, timeout)

    def workers(self, *, stale_after: float = DEFAULT_STALE_AFTER, timeout: float = 10.0) -> list[WorkerPresence]:
        """The live workers, from their latest presence on the events stream (BEAT, DESIGN §14).

        Parameters, result and errors: :meth:`~ojs_kombu.client.observation.Observation.workers`.
        """
        return self._observation.workers(stale_after, timeout)

    def events(
        self, since: datetime | timedelta, *, queue: str | None = None, limit: int | None = None, timeout: float = 10.0
    ) -> list[JobEventRecord]:
        """Job lifecycle events read back from the events stream, oldest first.

        Parameters, result and errors: :meth:`~ojs_kombu.client.observation.Observation.events`.
        """
        return self._observation.events(since, queue, limit, timeout)

    def dead_letters(
        self, queue: str, limit: int | None = 100, *, select: Callable[[DeadLetterEntry], bool] | None = None
    ) -> list[DeadLetterEntry]:
        """Up to ``limit`` jobs in ``ojs.queue.dlx.{queue}``, oldest first, left in place.

        Parameters, result and errors: :meth:`~ojs_kombu.client.deadletters.DeadLetters.browse`.
        """
        return self._dead_letters.browse(queue, limit, select)

    def replay_dead_letters(
        self,
        queue: str,
        *,
        limit: int | None = None,
        ids: Iterable[str] | None = None,
        window: int = DEFAULT_REPLAY_WINDOW,
        progress: Callable[[ReplayProgress], None] | None = None,
        select: Callable[[DeadLetterEntry], bool] | None = None,
    ) -> list[str]:
        """Move dead letters of ``queue`` back to their job queue; returns the replayed job ids.

        Parameters, result and errors: :meth:`~ojs_kombu.client.deadletters.DeadLetters.replay`.
        """
        return self._dead_letters.replay(queue, limit=limit, ids=ids, window=window, progress=progress, select=select)

    def purge_dead_letters(
        self,
        queue: str,
        *,
        ids: Iterable[str] | None = None,
        window: int = DEFAULT_REPLAY_WINDOW,
        select: Callable[[DeadLetterEntry], bool] | None = None,
        limit: int | None = None,
        progress: Callable[[ReplayProgress], None] | None = None,
    ) -> int:
        """Delete dead letters of ``queue``: all of them, or exactly those whose id is in ``ids``.

        Parameters, result and errors: :meth:`~ojs_kombu.client.deadletters.DeadLetters.purge`.
        """
        return self._dead_letters.purge(queue, ids=ids, window=window, select=select, limit=limit, progress=progress)

    def queue_counts(self, amqp_queues: Iterable[str]) -> dict[str, QueueCounts | None]:
        """Ready messages and consumers of AMQP queues, exact and current (passive ``Queue.Declare``).

        Parameters, result and errors: :meth:`~ojs_kombu.client.observation.Observation.queue_counts`.
        """
        return self._observation.queue_counts(amqp_queues)

    def paused_queues(self, queues: Iterable[str], *, timeout: float = 10.0) -> dict[str, bool | None]:
        """Whether each OJS queue is paused, as its workers see it (its control stream replayed).

        Parameters, result and errors: :meth:`~ojs_kombu.client.observation.Observation.paused_queues`.
        """
        return self._observation.paused_queues(queues, timeout)

    def register_cron(
        self,
        name: str,
        expression: str,
        job_type: str,
        args: list[Any] | tuple[Any, ...] = (),
        *,
        queue: str,
        timezone: str = "UTC",
        overlap_policy: OverlapPolicy = "skip",
        enabled: bool = True,
        description: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> RegisteredCron:
        """Register (or replace) the periodic job ``name``, fired by a :class:`~ojs_kombu.CronScheduler`.

        Parameters and errors: :meth:`~ojs_kombu.runtime.cron.CronRegistry.register_cron`.
        """
        return self._cron.register_cron(
            name,
            expression,
            job_type,
            args,
            queue=queue,
            timezone=timezone,
            overlap_policy=overlap_policy,
            enabled=enabled,
            description=description,
            options=options,
        )

    def register_cron_job(self, cron: CronJob) -> RegisteredCron:
        """Register (or replace) a built cron definition (:meth:`~ojs_kombu.runtime.cron.CronRegistry.register`)."""
        return self._cron.register(cron)

    def crons(self, *, enabled: bool | None = None) -> list[RegisteredCron]:
        """The registered periodic jobs with their last and next runs (:meth:`~ojs_kombu.runtime.cron.CronRegistry.list`)."""
        return self._cron.list(enabled=enabled)

    def remove_cron(self, name: str) -> None:
        """Remove the periodic job ``name``; raises :class:`~ojs_kombu.errors.NotFoundError` when none has it."""
        self._cron.remove(name)

    def declare_queue(self, name: str, *, scheduling: bool = False, **queue_options: Any) -> str:
        """Eagerly declare job queue ``name`` with its DLQ; returns the AMQP queue name.

        ``queue_options`` are :class:`QueueOptions` fields (``max_priority=10``,
        ``max_length=…``, ``overflow="reject-publish"``, ``queue_type="quorum"``, …)
        and replace the client-wide options for this queue.  ``scheduling=True``
        also declares the scheduling cascade and its binding to the queue (else
        declared by the first scheduled enqueue).

        Raises:
            TopologyConflictError: the queue exists with other arguments (see ``on_conflict``).
        """
        return self._publishing.declare_queue(name, scheduling, queue_options)

    def teardown(self) -> int:
        """Delete every queue and exchange this client declared, messages included.

        Meant for tests, demos and removing a tenant; returns the number deleted.
        """
        return self._session.run(lambda conn: self.topology.delete_declared(conn.connection))

    def close(self) -> None:
        """Close every pooled connection (and the unique locks' Redis connections).  Idempotent."""
        self._uniqueness.close()
        self._session.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client {safe_url(self.url)} prefix={self.names.prefix!r}>"


__all__ = ["DEFAULT_PUBLISH_TIMEOUT", "DEFAULT_REPLAY_WINDOW", "DEFAULT_STALE_AFTER", "Client"]
