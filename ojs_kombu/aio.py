"""asyncio front-end: :class:`AsyncClient` enqueues from an event loop without blocking it.

::

    from ojs_kombu import AsyncClient

    async with AsyncClient("amqp://guest:guest@localhost//") as client:
        job = await client.enqueue("email.send", ["user@example.com"], queue="email")
        jobs = await asyncio.gather(*(client.enqueue("report.build", [i]) for i in range(500)))

An :class:`AsyncClient` is a synchronous :class:`~ojs_kombu.client.Client` driven by one
dedicated thread, which owns its connection (a py-amqp connection is not thread-safe).  A
coroutine hands its call to that thread and awaits the outcome; the event loop never waits
for the broker.  Enqueues waiting at the same time (``asyncio.gather``, many requests of a
web service) are published together as one pipelined :meth:`Client.enqueue_many` batch,
and each caller gets its own job or its own error.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, Unpack

from ojs_kombu.amqp.connection import safe_url
from ojs_kombu.amqp.urls import BrokerUrls
from ojs_kombu.client import Client, EnqueueResult, JobOptions
from ojs_kombu.errors import ClientClosedError, OjsError, ValidationError
from ojs_kombu.model.info import JobInfo
from ojs_kombu.model.job import Job
from ojs_kombu.model.workflow import Workflow
from ojs_kombu.model.workflow_info import WorkflowInfo
from ojs_kombu.observability.tracing import current_trace_meta, with_trace_context
from ojs_kombu.runtime.deadletter import DeadLetterEntry

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Enqueues published together at most, as one :meth:`Client.enqueue_many` batch (``max_batch``).
DEFAULT_MAX_BATCH = 500

#: Seconds :meth:`AsyncClient.aclose` waits for the call the I/O thread is running (``close_timeout``).
DEFAULT_CLOSE_TIMEOUT = 10.0


@dataclass(eq=False)
class _Call:
    """One call for the I/O thread: ``fn(client)`` in the caller's context, its outcome to ``future``."""

    fn: Callable[[Client], Any]
    future: asyncio.Future[Any]
    context: contextvars.Context = field(default_factory=contextvars.copy_context)


@dataclass(eq=False)
class _Enqueue:
    """One job to publish; enqueues queued together become one batch."""

    job: Job
    future: asyncio.Future[Job]


_STOP = object()

_Item = _Call | _Enqueue


class AsyncClient:
    """Enqueues OJS jobs from asyncio code; an async context manager over a :class:`Client`.

    Every broker operation runs on one thread started by :meth:`open` and owning the
    client's connection; coroutines await its outcomes, so the event loop is never
    blocked by the broker.  Use one ``AsyncClient`` from one event loop.  Cancelling a
    coroutine that awaits an enqueue does not withdraw a job whose publish has begun.

    Parameters:
        url: broker URL or failover list, as for :class:`Client` (default ``$OJS_AMQP_URL``).
        max_batch: enqueues waiting together that are published as one batch at most (>= 1).
        close_timeout: seconds :meth:`aclose` waits for the call in progress (> 0); past it,
            that call fails with :class:`~ojs_kombu.errors.ClientClosedError` and the thread
            closes the client once the call returns.
        options: the keyword options of :class:`Client` (``prefix``, ``queues``,
            ``publish_timeout``, ``confirm_timeout``, ``ssl``, …).

    Raises:
        ValidationError: a bad ``max_batch`` or ``close_timeout`` (the options of
            :class:`Client` are checked by :meth:`open`).
    """

    def __init__(
        self,
        url: BrokerUrls | None = None,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
        **options: Any,
    ):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValidationError(f"max_batch must be an integer >= 1, got {max_batch!r}", field="max_batch")
        if isinstance(close_timeout, bool) or not isinstance(close_timeout, int | float) or not close_timeout > 0:
            raise ValidationError(f"close_timeout must be > 0 seconds, got {close_timeout!r}", field="close_timeout")
        self._url = url
        self._options = options
        self.max_batch = max_batch
        self.close_timeout = float(close_timeout)
        self._state: Literal["new", "open", "closed"] = "new"
        self._client: Client | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._running: list[_Item] = []  # what the I/O thread works on now
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Future[None] | None = None

    # -- life cycle ------------------------------------------------------------------------------

    async def open(self) -> AsyncClient:
        """Start the I/O thread and create the :class:`Client` on it (``async with`` calls this).

        Returns:
            This client.

        Raises:
            OjsError: the client was opened before.
            ValidationError: a bad :class:`Client` option.
            BrokerConnectionError, BrokerRefusedError: declaring ``queues=`` failed.
        """
        if self._state != "new":
            raise OjsError("an AsyncClient is opened once")
        self._loop = asyncio.get_running_loop()
        self._stopped = self._loop.create_future()
        self._state = "open"
        self._thread = threading.Thread(target=self._serve, name="ojs-async-client", daemon=True)
        self._thread.start()

        def create(_: Client) -> Client:
            # Set on the I/O thread, which closes it at the end even if open() was cancelled meanwhile.
            self._client = Client(self._url, **self._options)
            return self._client

        try:
            await self._call(create)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def aclose(self) -> None:
        """Close the client; idempotent.

        Calls not yet started fail with :class:`~ojs_kombu.errors.ClientClosedError` at
        once (their jobs are not published); the call in progress may finish for at most
        ``close_timeout`` seconds, then fails with it too.  The connection is closed on the
        I/O thread once that call returns.
        """
        if self._state == "new":
            self._state = "closed"
            return
        if self._state == "closed":
            if self._stopped is not None:
                await asyncio.wait([self._stopped], timeout=self.close_timeout)
            return
        self._state = "closed"
        closed = ClientClosedError("the client was closed before this call ran")
        while True:
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                _fail(item.future, closed)
        self._calls.put(_STOP)
        assert self._stopped is not None
        done, _ = await asyncio.wait([self._stopped], timeout=self.close_timeout)
        if not done:
            logger.warning("AsyncClient closed while a call still runs after %.1fs", self.close_timeout)
            for item in list(self._running):
                _fail(item.future, ClientClosedError("the client was closed while this call ran"))

    async def __aenter__(self) -> AsyncClient:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        target = safe_url(self._client.url) if self._client is not None else "(not open)"
        return f"<AsyncClient {target} {self._state}>"

    # -- public API ------------------------------------------------------------------------------

    async def enqueue(
        self, type: str, args: list[Any] | tuple[Any, ...] | None = None, **options: Unpack[JobOptions]
    ) -> Job:
        """Create a job (:meth:`Job.create`) and enqueue it, as :meth:`Client.enqueue` does.

        Enqueues awaited at the same time are published as one batch.

        Parameters:
            type: the job type (``"email.send"``).
            args: its positional arguments (JSON values).
            options: the keyword options of :meth:`Job.create` (:class:`~ojs_kombu.client.JobOptions`).

        Returns:
            The confirmed job.

        Raises:
            ValidationError: a bad argument (nothing is published).
            UnroutableError, PublishNackedError, PublishTimeoutError: the broker did not take it.
            BrokerConnectionError: the broker could not be reached within ``publish_timeout``.
            BrokerRefusedError: the broker refused the login, the vhost or a permission.
            ClientClosedError: the client is not open, or was closed before the job was published.
        """
        return await self.enqueue_job(Job.create(type, args, **options))

    async def enqueue_job(self, job: Job) -> Job:
        """Enqueue an existing :class:`Job`, as :meth:`Client.enqueue_job` does.

        Parameters:
            job: the job.

        Returns:
            The confirmed job.

        Raises:
            ValidationError, UnroutableError, PublishNackedError, PublishTimeoutError,
            BrokerConnectionError, BrokerRefusedError, ClientClosedError: as for :meth:`enqueue`.
        """
        loop = self._ready()
        if isinstance(job, Job) and current_trace_meta():  # the caller's context, not the I/O thread's
            job = with_trace_context(job)
        future: asyncio.Future[Job] = loop.create_future()
        self._calls.put(_Enqueue(job, future))
        return await future

    async def enqueue_many(self, jobs: Iterable[Job]) -> list[EnqueueResult]:
        """Enqueue many jobs in one pipelined batch, as :meth:`Client.enqueue_many` does.

        Parameters:
            jobs: the jobs, e.g. from :meth:`Job.create`.

        Returns:
            One :class:`~ojs_kombu.client.EnqueueResult` per job, in order; a job that failed
            carries its error and does not affect the others.

        Raises:
            ClientClosedError: the client is not open, or was closed before the batch ran.
        """
        batch = list(jobs)
        if current_trace_meta():
            batch = [with_trace_context(job) if isinstance(job, Job) else job for job in batch]
        return await self._call(lambda client: client.enqueue_many(batch))

    async def cancel(self, job_id: str, *, queue: str) -> None:
        """CANCEL job ``job_id`` of ``queue``, wherever it is (:meth:`Client.cancel`).

        Parameters:
            job_id: the job's id.
            queue: the OJS queue the job belongs to.

        Raises:
            ValidationError: a bad queue name or job id (nothing is published).
            UnroutableError, PublishNackedError, PublishTimeoutError: the broker did not take it.
            BrokerConnectionError, BrokerRefusedError: as for :meth:`enqueue`.
            ClientClosedError: the client is not open, or was closed before the call ran.
        """
        await self._call(lambda client: client.cancel(job_id, queue=queue))

    async def enqueue_workflow(self, workflow: Workflow) -> str:
        """Enqueue a workflow (:meth:`Client.enqueue_workflow`).

        Parameters:
            workflow: ``ojs_kombu.chain``, ``group`` or ``batch``.

        Returns:
            The workflow's id.

        Raises:
            ValidationError, PublishError, BrokerConnectionError, BrokerRefusedError, ClientClosedError:
            as for :meth:`enqueue`.
        """
        return await self._call(lambda client: client.enqueue_workflow(workflow))

    async def workflow(self, workflow_id: str) -> WorkflowInfo:
        """The state of a workflow (:meth:`Client.workflow`).

        Parameters:
            workflow_id: what :meth:`enqueue_workflow` returned.

        Returns:
            Its :class:`~ojs_kombu.model.workflow_info.WorkflowInfo`.

        Raises:
            NotFoundError: no such workflow.
            BrokerConnectionError, BrokerRefusedError, ClientClosedError: as for :meth:`enqueue`.
        """
        return await self._call(lambda client: client.workflow(workflow_id))

    async def cancel_workflow(self, workflow_id: str) -> WorkflowInfo:
        """Cancel a workflow (:meth:`Client.cancel_workflow`).

        Parameters:
            workflow_id: what :meth:`enqueue_workflow` returned.

        Returns:
            Its :class:`~ojs_kombu.model.workflow_info.WorkflowInfo`, cancelled.

        Raises:
            WorkflowStateError: it already ended.
            NotFoundError: no such workflow.
            BrokerConnectionError, BrokerRefusedError, ClientClosedError: as for :meth:`enqueue`.
        """
        return await self._call(lambda client: client.cancel_workflow(workflow_id))

    async def pause(self, queue: str) -> None:
        """Pause ``queue`` on every worker (:meth:`Client.pause`).

        Parameters:
            queue: the OJS queue.

        Raises:
            ValidationError, UnroutableError, PublishNackedError, PublishTimeoutError,
            BrokerConnectionError, BrokerRefusedError, ClientClosedError: as for :meth:`cancel`.
        """
        await self._call(lambda client: client.pause(queue))

    async def resume(self, queue: str) -> None:
        """Resume ``queue`` after :meth:`pause` (:meth:`Client.resume`).

        Parameters:
            queue: the OJS queue.

        Raises:
            ValidationError, UnroutableError, PublishNackedError, PublishTimeoutError,
            BrokerConnectionError, BrokerRefusedError, ClientClosedError: as for :meth:`cancel`.
        """
        await self._call(lambda client: client.resume(queue))

    async def info(self, job_id: str, *, queue: str, timeout: float = 2.0) -> JobInfo | None:
        """INFO: what the live workers of ``queue`` know about job ``job_id`` (:meth:`Client.info`).

        While it waits for answers the I/O thread runs no other call of this client.

        Parameters:
            job_id: the job's id (any case).
            queue: the OJS queue the job belongs to.
            timeout: seconds to wait for answers (> 0).

        Returns:
            The job's :class:`~ojs_kombu.model.info.JobInfo`, or None when no live worker
            knows it (after ``timeout``).

        Raises:
            ValidationError: a bad job id, queue name or timeout (nothing is published).
            PublishNackedError, PublishTimeoutError, UnroutableError: the broker did not take the request.
            BrokerConnectionError, BrokerRefusedError: as for :meth:`enqueue`.
            ClientClosedError: the client is not open, or was closed before the call ran.
        """
        result: JobInfo | None = await self._call(lambda client: client.info(job_id, queue=queue, timeout=timeout))
        return result

    async def dead_letters(
        self, queue: str, limit: int | None = 100, *, select: Callable[[DeadLetterEntry], bool] | None = None
    ) -> list[DeadLetterEntry]:
        """Up to ``limit`` jobs in ``ojs.queue.dlx.{queue}``, oldest first, left in place
        (:meth:`Client.dead_letters`).

        Parameters:
            queue: the OJS queue whose dead letters to read.
            limit: at most this many entries (``None``: all of them).
            select: only the entries it picks; called on the I/O thread.

        Returns:
            The entries, oldest first.

        Raises:
            ValidationError: a bad queue name.
            NotFoundError: the dead letter queue does not exist.
            BrokerConnectionError, BrokerRefusedError: as for :meth:`enqueue`.
            ClientClosedError: the client is not open, or was closed before the call ran.
        """
        entries: list[DeadLetterEntry] = await self._call(
            lambda client: client.dead_letters(queue, limit, select=select)
        )
        return entries

    async def declare_queue(self, name: str, *, scheduling: bool = False, **queue_options: Any) -> str:
        """Declare job queue ``name`` and its dead letter queue (:meth:`Client.declare_queue`).

        Parameters:
            name: the OJS queue.
            scheduling: also declare its scheduling cascade.
            queue_options: optional queue arguments, as for :meth:`Client.declare_queue`.

        Returns:
            The AMQP name of the job queue.

        Raises:
            ValidationError: a bad queue name or option.
            TopologyError: the queue exists with arguments that conflict.
            BrokerConnectionError, BrokerRefusedError: as for :meth:`enqueue`.
            ClientClosedError: the client is not open, or was closed before the call ran.
        """
        amqp_name: str = await self._call(
            lambda client: client.declare_queue(name, scheduling=scheduling, **queue_options)
        )
        return amqp_name

    # -- the I/O thread --------------------------------------------------------------------------

    def _ready(self) -> asyncio.AbstractEventLoop:
        """The client's loop, checked to be the running one; raises when the client is not open."""
        if self._state != "open":
            raise ClientClosedError("the AsyncClient is closed" if self._state == "closed" else "open it first")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            raise OjsError("an AsyncClient is used from the event loop that opened it")
        return loop

    async def _call(self, fn: Callable[[Client], T]) -> T:
        """``fn(client)`` on the I/O thread, in the caller's context; its result or exception."""
        loop = self._ready()
        future: asyncio.Future[T] = loop.create_future()
        self._calls.put(_Call(fn, future))
        return await future

    def _serve(self) -> None:
        """The I/O thread: run the calls in order, publishing enqueues that wait together as one batch."""
        held: deque[Any] = deque()  # taken from the queue while gathering a batch, not yet run
        try:
            while True:
                item = held.popleft() if held else self._calls.get()
                if item is _STOP:
                    break
                if isinstance(item, _Call):
                    self._running[:] = [item]
                    self._run_call(item)
                    continue
                batch = [item]
                while len(batch) < self.max_batch and not held:
                    try:
                        following = self._calls.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(following, _Enqueue):
                        batch.append(following)
                    else:
                        held.append(following)
                self._running[:] = batch
                self._run_batch(batch)
        finally:
            self._running.clear()
            closed = ClientClosedError("the client was closed before this call ran")
            leftovers = [item for item in held if item is not _STOP]
            while True:
                try:
                    item = self._calls.get_nowait()
                except queue.Empty:
                    break
                if item is not _STOP:
                    leftovers.append(item)
            self._settle([(item.future, None, closed) for item in leftovers])
            if self._client is not None:
                try:
                    self._client.close()
                except Exception:
                    logger.exception("closing the AsyncClient's connection failed")
            self._settle([], stopped=True)

    def _run_call(self, call: _Call) -> None:
        if call.future.done():  # cancelled while it waited
            return
        try:
            client = self._client
            result = call.context.run(call.fn, client)  # type: ignore[arg-type]  # None only for open()
        except BaseException as exc:  # noqa: BLE001  # the caller's to handle
            self._settle([(call.future, None, exc)])
        else:
            self._settle([(call.future, result, None)])

    def _run_batch(self, batch: list[_Enqueue]) -> None:
        batch = [item for item in batch if not item.future.done()]  # cancelled while they waited
        if not batch:
            return
        assert self._client is not None
        try:
            results = self._client.enqueue_many([item.job for item in batch])
        except BaseException as exc:  # noqa: BLE001  # a batch of one bad job raises; so does a closed client
            self._settle([(item.future, None, exc) for item in batch])
        else:
            self._settle([(item.future, result.job, result.error) for item, result in zip(batch, results, strict=True)])

    def _settle(
        self, outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]], *, stopped: bool = False
    ) -> None:
        """Hand ``outcomes`` to the event loop (one wake-up for a whole batch)."""
        assert self._loop is not None

        def settle() -> None:
            for future, result, error in outcomes:
                if error is not None:
                    _fail(future, error)
                elif not future.done():
                    future.set_result(result)
            if stopped and self._stopped is not None and not self._stopped.done():
                self._stopped.set_result(None)

        try:
            self._loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop is closed: nobody awaits these any more
            pass


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


__all__ = ["DEFAULT_CLOSE_TIMEOUT", "DEFAULT_MAX_BATCH", "AsyncClient"]
