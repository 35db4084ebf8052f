"""Fan-in on RabbitMQ alone (DESIGN §21): a group's or batch's outcomes counted in the broker, callbacks fired once.

Each group or batch has a **stream** ``ojs.workflow.{id}`` (:meth:`Names.fan_in_stream`), created
by :meth:`FanIn.open` before its jobs are published (with the workflow's continuation).  A job
that ended appends one record ``{"kind": "outcome", "index", "state", "result", "error"}`` with
publisher confirms, then reads the stream from where this object last stopped up to its own
record.  Counting *distinct indexes* makes a second report of the same job (a worker SIGKILLed
between "handler finished" and "ack" runs the job again and reports again) count once; the first
record of an index wins.  A stream is read without consuming it, so every reporter sees every
record before its own: the reporter of the last record appended sees all of them.

When a reporter sees every index, it takes the **unique lock** ``fanin.{id}``
(:class:`~ojs_kombu.amqp.locks.UniqueLocks`, an atomic set-if-absent) with its own index as the
holder.  Only the winner gets :class:`Ready`; every other reporter gets :class:`Pending`.  The
winner publishes the callbacks with :meth:`FanIn.fire`: each callback job goes to its job queue
*and* (``BCC``, one publish, one routing decision) into the stream, so the stream records which
callbacks exist.  If the winner dies before it fired them all, its job was not acknowledged: the
broker delivers it again, its new report finds the lock held *by its own index*, and gets
:class:`Ready` again with :attr:`Ready.fired` naming the callbacks already published, which
:meth:`fire` skips.  A callback is therefore published once — unless the winner died after the
broker routed a callback and before it received the confirm, or the winner's job runs twice at
the same time (delivered again while its first run is alive, e.g. after a consumer timeout): the
same job id (fixed in the workflow's definition) is then published twice, and
``Worker(deduplicate=True)`` runs it once.

Clean-up: :meth:`FanIn.cleanup` deletes the stream once the workflow ended (its callbacks may read
results from it, :attr:`~ojs_kombu.model.workflow.WorkflowContext.results_from`); the lock token
expires by itself.  RabbitMQ refuses ``x-expires`` on a stream (406 ``invalid arg 'x-expires'``,
measured on 4.3.6), so the safety net is ``x-max-age`` (:data:`STREAM_MAX_AGE`: segments older
than it are dropped) and small segments; a stream whose workflow never ended stays until deleted
(``ojs-amqp`` lists them as ``ojs.workflow.*``).

A :class:`FanIn` uses one py-amqp connection from one thread.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from amqp import Connection
from amqp.exceptions import NotFound, PreconditionFailed

from ojs_kombu.amqp.connection import close_quietly
from ojs_kombu.amqp.errors import map_exceptions
from ojs_kombu.amqp.locks import Acquired, UniqueLocks
from ojs_kombu.amqp.publisher import ConfirmedPublisher, PublishTicket
from ojs_kombu.errors import NotFoundError, PublishTimeoutError, UnroutableError, ValidationError
from ojs_kombu.model.naming import Names
from ojs_kombu.model.workflow import StepState, check_result
from ojs_kombu.wire.codec import OutgoingMessage

STREAM_MAX_AGE: Final = "7D"
"""``x-max-age`` of the fan-in streams: the longest a group or batch may take."""

STREAM_SEGMENT_BYTES: Final = 1_000_000
"""``x-stream-max-segment-size-bytes``: small segments, so ``x-max-age`` can drop them."""

MAX_READERS: Final = 32
"""Workflows a :class:`FanIn` keeps a stream consumer open and its records for (the most recently
reported to); an older one is read again from the start on its next report."""

_READ_TIMEOUT: Final = 30.0  # seconds a reader waits for its own record to come back
_PREFETCH: Final = 500
_TERMINAL: Final = frozenset({"completed", "failed"})


@dataclass(frozen=True, slots=True)
class Pending:
    """Not every job ended yet, or another reporter fires the callbacks: ``reported`` of ``count`` seen."""

    workflow_id: str
    reported: int
    count: int


@dataclass(frozen=True, slots=True)
class Ready:
    """Every job ended and this reporter won: enqueue the callbacks (:meth:`FanIn.fire`).

    Attributes:
        workflow_id: the group's or batch's id.
        results: every job's ``parent_results`` entry by index (``"0"``...): its result, or
            ``{"error": {...}}`` when it failed (ojs-workflows.md §7.4: all of them).
        states: every job's final state by index.
        fired: ids of the callback jobs already published (by an earlier incarnation of this winner).
        continuation: what :meth:`FanIn.open` was given.
    """

    workflow_id: str
    results: dict[str, Any]
    states: dict[int, StepState]
    fired: frozenset[str] = frozenset()
    continuation: dict[str, Any] | None = None

    @property
    def failed(self) -> tuple[int, ...]:
        """The indexes of the jobs that failed, in order."""
        return tuple(index for index, state in sorted(self.states.items()) if state == "failed")


@dataclass(frozen=True, slots=True)
class MemberReport:
    """One job's end, for :meth:`FanIn.report_many` (the arguments of :meth:`FanIn.report`)."""

    workflow_id: str
    index: int
    count: int
    state: StepState
    result: Any = None
    error: Mapping[str, Any] | None = None


@dataclass(slots=True)
class _Log:
    """What this object read of one stream so far."""

    next_offset: int = 0
    records: dict[int, dict[str, Any]] = field(default_factory=dict)
    fired: set[str] = field(default_factory=set)
    done: bool = False  # a "fired" record: every callback was published
    continuation: dict[str, Any] | None = None
    consumer_tag: str | None = None
    seen_ids: set[str] = field(default_factory=set)  # message ids read and not yet waited for
    holder_checked: bool = False


class FanIn:
    """Count a group's or batch's outcomes in the broker and elect the one reporter that fires its callbacks.

    Parameters:
        connection: a connected py-amqp connection, used from this thread only.
        names: the deployment's entity names (its prefix).
        locks: the unique locks to guard the callbacks with (default: a new :class:`UniqueLocks`
            on ``connection``, closed by :meth:`close`).
    """

    def __init__(self, connection: Connection, *, names: Names | None = None, locks: UniqueLocks | None = None):
        self.connection = connection
        self.names = names if names is not None else Names()
        self._own_locks = locks is None
        self.locks = locks if locks is not None else UniqueLocks(connection, names=self.names)
        self._publisher = ConfirmedPublisher(connection)
        self._channel: Any = connection.channel()  # the stream readers
        self._probe: Any = connection.channel()  # declarations and deletions: a 404 closes it, not the readers
        self._logs: dict[str, _Log] = {}
        self._readers: OrderedDict[str, None] = OrderedDict()
        self._qos_set = False

    def open(self, workflow_id: str, count: int, continuation: Mapping[str, Any] | None = None) -> None:
        """Create the fan-in of a group or batch, before its jobs are published (idempotent).

        Declares the stream and appends an ``open`` record (confirmed), so the stream is
        writable before any job reports: on RabbitMQ 3.10 a publish from another connection
        to a stream still being created kills that connection (541 INTERNAL_ERROR,
        ``osiris_writer:write(none, ...)`` in the broker's log), so reporters never declare it.

        Parameters:
            workflow_id: the group's or batch's id.
            count: how many jobs it has.
            continuation: what to do once it ended (the root definition, ``workflow_to_dict``),
                returned in :attr:`Ready.continuation`.

        Raises:
            ValidationError: ``count`` below 1.
            PublishError: the record was not confirmed.
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValidationError(f"count must be an integer >= 1, got {count!r}", field="count")
        stream = self._declare(workflow_id)
        record: dict[str, Any] = {"kind": "open", "count": count}
        if continuation is not None:
            record["continuation"] = dict(continuation)
        self._append(stream, str(uuid.uuid4()), record)

    def report(
        self,
        workflow_id: str,
        index: int,
        count: int,
        state: StepState,
        result: Any = None,
        error: Mapping[str, Any] | None = None,
    ) -> Ready | Pending:
        """Record that job ``index`` of ``count`` ended, and say whether this reporter fires the callbacks.

        Call it after the job's handler ended for good (completed, or failed with no retry left)
        and before acknowledging the job: a report repeated after a crash counts once.

        Parameters:
            workflow_id: the group's or batch's id.
            index: the job's index in it.
            count: how many jobs it has.
            state: ``completed`` or ``failed``.
            result: the handler's return value: JSON, at most
                :data:`~ojs_kombu.model.workflow.MAX_RESULT_BYTES`.
            error: the OJS error object of a failed job.

        Returns:
            :class:`Ready` for exactly one reporter per workflow (and again for the same index
            when it died before :meth:`fire` finished), :class:`Pending` for every other.

        Raises:
            ValidationError: an index outside ``0..count-1``, a state that is not terminal, a
                result that is not JSON.
            ResultTooLargeError: a result over :data:`~ojs_kombu.model.workflow.MAX_RESULT_BYTES`.
            NotFoundError: no fan-in stream: :meth:`open` was not called, or the workflow was
                cleaned up before every job reported (cancelled).
            PublishError: the record was not confirmed, or did not come back from the stream
                within 30 s (:class:`~ojs_kombu.errors.PublishTimeoutError`).
        """
        return self.report_many([MemberReport(workflow_id, index, count, state, result, error)])[0]

    def report_many(self, reports: Sequence[MemberReport]) -> list[Ready | Pending]:
        """:meth:`report` for several jobs at once: every record published, then one wait for their
        confirms and one read of each stream (what makes a worker's reports cheap when several of
        its jobs end together).  Each report is confirmed when this returns, as with :meth:`report`.

        Parameters:
            reports: the jobs that ended (several may be of the same group or batch).

        Returns:
            What :meth:`report` would have returned for each, in order: the reports of one fan-in
            are judged in order, so at most one of them gets :class:`Ready`.

        Raises:
            ValidationError, ResultTooLargeError, NotFoundError, PublishError: as :meth:`report`,
                for any of them (none is then known to be recorded: report them again).
        """
        for report in reports:
            index, count = report.index, report.count
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
                raise ValidationError(f"index must be in 0..{count - 1}, got {index!r}", field="index")
            if report.state not in _TERMINAL:
                raise ValidationError(f"state must be completed or failed, got {report.state!r}", field="state")
            check_result(report.result)
        outcomes: list[Ready | Pending | None] = [None] * len(reports)
        holders: dict[str, str | None] = {}
        appended: dict[str, list[str]] = {}  # workflow id -> its record ids, in publish order
        tickets: list[tuple[str, Any]] = []
        for position, report in enumerate(reports):
            workflow_id = report.workflow_id
            log = self._logs.get(workflow_id)
            if log is None or not log.holder_checked:
                # Once per workflow and object: a late report after the callbacks fired (and the
                # stream was deleted) must not declare the stream again.
                if workflow_id not in holders:
                    holders[workflow_id] = self._holder(workflow_id)
                holder = holders[workflow_id]
                if holder is not None and (holder != str(report.index) or not self._stream_exists(workflow_id)):
                    outcomes[position] = Pending(workflow_id, report.count, report.count)  # another fires, or gone
                    continue
                self._logs.setdefault(workflow_id, _Log()).holder_checked = True
            record_id = str(uuid.uuid4())
            record = {"kind": "outcome", "index": report.index, "state": report.state, "result": report.result}
            if report.error is not None:
                record["error"] = dict(report.error)
            stream = self.names.fan_in_stream(workflow_id)
            tickets.append((workflow_id, self._publish(stream, record_id, record)))
            appended.setdefault(workflow_id, []).append(record_id)
        self._publisher.wait([ticket for _, ticket in tickets])
        for workflow_id, ticket in tickets:
            try:
                self._check(self.names.fan_in_stream(workflow_id), ticket)
            except NotFoundError:
                self._forget(workflow_id)  # what was read of a deleted stream says nothing of a new one
                raise
        logs = {workflow_id: self._read(workflow_id, until=ids) for workflow_id, ids in appended.items()}
        for position, report in enumerate(reports):
            if outcomes[position] is None:
                outcomes[position] = self._judge(report, logs[report.workflow_id])
        return [outcome for outcome in outcomes if outcome is not None]

    def _judge(self, report: MemberReport, log: _Log) -> Ready | Pending:
        """Whether ``report``, its record read back into ``log``, is the one that fires the callbacks."""
        workflow_id, index, count = report.workflow_id, report.index, report.count
        if len(log.records) < count:
            return Pending(workflow_id, len(log.records), count)
        outcome = self.locks.acquire(self.names.fan_in_lock_key(workflow_id), str(index), None)
        if not isinstance(outcome, Acquired) and (outcome.existing_id != str(index) or log.done):
            return Pending(workflow_id, count, count)  # another reporter fires, or this one fired already
        states: dict[int, StepState] = {i: log.records[i]["state"] for i in range(count)}
        results = {str(i): _entry(log.records[i]) for i in range(count)}
        return Ready(workflow_id, results, states, frozenset(log.fired), log.continuation)

    def fire(self, ready: Ready, callbacks: Iterable[tuple[str, OutgoingMessage]]) -> list[str]:
        """Publish the callback jobs of a :class:`Ready`, skipping those already published.

        Each goes to its job queue through the default exchange and, in the same publish
        (``BCC``), into the fan-in stream, which is how a later :class:`Ready` knows it was fired.
        Once all are confirmed a ``fired`` record follows: a later report of the winner's job
        (its acknowledgement was lost) then gets :class:`Pending`.

        Parameters:
            ready: what :meth:`report` returned.
            callbacks: ``(AMQP job queue name, encoded job)`` pairs; the job's ``message_id``
                must be derived from the workflow id, so a repeated firing is recognised.

        Returns:
            The ids of the jobs published now.

        Raises:
            ValidationError: a callback without ``message_id``.
            PublishError: a callback was not confirmed.
        """
        stream = self.names.fan_in_stream(ready.workflow_id)
        published: list[str] = []
        tickets = []
        for queue, message in callbacks:
            job_id = message.properties.get("message_id")
            if not job_id:
                raise ValidationError("a callback needs a message_id derived from the workflow id", field="message_id")
            if job_id in ready.fired:
                continue
            bcc = OutgoingMessage(message.body, message.properties, {**message.headers, "BCC": [stream]})
            tickets.append(self._publisher.publish(bcc, exchange="", routing_key=queue, queue=queue, job_id=job_id))
            published.append(job_id)
        self._publisher.wait(tickets)
        for ticket in tickets:
            ticket.raise_for_error()
        self._append(stream, str(uuid.uuid4()), {"kind": "fired"})
        return published

    def results(self, workflow_id: str) -> dict[str, Any]:
        """Every recorded job's ``parent_results`` entry, read from the stream (for results too big to carry inline).

        Parameters:
            workflow_id: the group's or batch's id.

        Returns:
            The entries by index (``"0"``...), first record of each index.
        """
        stream = self.names.fan_in_stream(workflow_id)
        marker = str(uuid.uuid4())
        self._append(stream, marker, {"kind": "read"})
        log = self._read(workflow_id, until=(marker,))
        return {str(i): _entry(record) for i, record in sorted(log.records.items())}

    def cleanup(self, workflow_id: str) -> None:
        """Delete the fan-in stream of a workflow that ended (idempotent).

        Parameters:
            workflow_id: the group's or batch's id.
        """
        stream = self.names.fan_in_stream(workflow_id)
        self._forget(workflow_id)
        try:
            self._call(lambda ch: ch.queue_delete(stream))
        except NotFound:
            pass

    def _forget(self, workflow_id: str) -> None:
        self._close_reader(workflow_id)
        self._logs.pop(workflow_id, None)

    def close(self) -> None:
        """Close this object's channels (not the connection)."""
        self._publisher.close()
        close_quietly(self._channel)
        close_quietly(self._probe)
        if self._own_locks:
            self.locks.close()

    # -- steps

    def _holder(self, workflow_id: str) -> str | None:
        """The index holding the callbacks' lock, or None when none does yet (no record to read)."""
        key = self.names.fan_in_lock_key(workflow_id)
        try:
            count = int(self._call(lambda ch: ch.queue_declare(self.names.lock_queue(key), passive=True)).message_count)
        except NotFound:
            return None
        return self.locks.holder(key) if count else None

    def _stream_exists(self, workflow_id: str) -> bool:
        try:
            self._call(lambda ch: ch.queue_declare(self.names.fan_in_stream(workflow_id), passive=True))
        except NotFound:
            return False
        return True

    def _declare(self, workflow_id: str) -> str:
        stream = self.names.fan_in_stream(workflow_id)
        arguments = {
            "x-queue-type": "stream",
            "x-max-age": STREAM_MAX_AGE,
            "x-stream-max-segment-size-bytes": STREAM_SEGMENT_BYTES,
        }
        with map_exceptions():
            self._call(lambda ch: ch.queue_declare(stream, durable=True, auto_delete=False, arguments=arguments))
        return stream

    def _append(self, stream: str, record_id: str, record: dict[str, Any]) -> None:
        ticket = self._publish(stream, record_id, record)
        self._publisher.wait([ticket])
        self._check(stream, ticket)

    def _publish(self, stream: str, record_id: str, record: dict[str, Any]) -> PublishTicket:
        message = OutgoingMessage(
            orjson.dumps(record), {"message_id": record_id, "delivery_mode": 2, "content_type": "application/json"}
        )
        return self._publisher.publish(message, exchange="", routing_key=stream, queue=stream, job_id=record_id)

    def _check(self, stream: str, ticket: PublishTicket) -> None:
        if isinstance(ticket.error, UnroutableError):
            raise NotFoundError(
                f"no fan-in stream {stream!r}: open() it before the group's jobs are published "
                "(or the workflow was cleaned up)",
                reply_code=404,
                method="Basic.Publish",
            )
        ticket.raise_for_error()

    def _read(self, workflow_id: str, *, until: Collection[str]) -> _Log:
        """Read the stream up to (at least) the messages ``until``, through this object's reader of it.

        A reader is a stream consumer kept open between reports (starting one costs about 4 ms on
        RabbitMQ 4.3, most of a report); the :data:`MAX_READERS` most recently used stay open.
        """
        log = self._logs.setdefault(workflow_id, _Log())
        if log.consumer_tag is None:
            self._open_reader(workflow_id, log)
        self._readers.pop(workflow_id, None)
        self._readers[workflow_id] = None  # most recently used last
        deadline = time.monotonic() + _READ_TIMEOUT
        stream = self.names.fan_in_stream(workflow_id)
        while not log.seen_ids.issuperset(until):
            if log.consumer_tag is None:
                self._logs.pop(workflow_id, None)
                raise NotFoundError(f"the fan-in stream {stream!r} was deleted while it was read", reply_code=404)
            left = deadline - time.monotonic()
            if left <= 0:
                raise PublishTimeoutError(
                    f"the fan-in records {sorted(until)} did not come back from {stream} in {_READ_TIMEOUT} s"
                )
            try:
                self.connection.drain_events(timeout=min(left, 1.0))
            except TimeoutError:
                continue
        log.seen_ids.difference_update(until)
        while len(self._readers) > MAX_READERS:
            self._forget(next(iter(self._readers)))  # its records too: a later report reads from offset 0
        return log

    def _open_reader(self, workflow_id: str, log: _Log) -> None:
        channel = self._channel
        if not self._qos_set:
            channel.basic_qos(0, _PREFETCH, False)
            self._qos_set = True

        def on_message(message: Any) -> None:
            offset = int(message.headers.get("x-stream-offset", log.next_offset))
            if offset >= log.next_offset:
                log.next_offset = offset + 1
                _absorb(log, message)
            record_id = message.properties.get("message_id")
            if isinstance(record_id, str):
                log.seen_ids.add(record_id)
            channel.basic_ack(message.delivery_tag)

        def on_cancel(tag: str) -> None:  # the stream was deleted under the reader
            if log.consumer_tag == tag:
                log.consumer_tag = None

        log.consumer_tag = channel.basic_consume(
            self.names.fan_in_stream(workflow_id),
            callback=on_message,
            on_cancel=on_cancel,
            no_ack=False,
            arguments={"x-stream-offset": log.next_offset},
        )

    def _close_reader(self, workflow_id: str) -> None:
        self._readers.pop(workflow_id, None)
        log = self._logs.get(workflow_id)
        if log is None or log.consumer_tag is None:
            return
        tag, log.consumer_tag = log.consumer_tag, None
        log.seen_ids.clear()
        try:
            self._channel.basic_cancel(tag)
        except Exception:  # noqa: BLE001 - the stream was deleted: the broker cancelled the consumer already
            pass

    def _call(self, operation: Any) -> Any:
        """Run ``operation(probe channel)``; a channel the broker closed (404, 406) is replaced before the error rises."""
        try:
            return operation(self._probe)
        except (NotFound, PreconditionFailed):
            close_quietly(self._probe)
            self._probe = self.connection.channel()
            raise


def _absorb(log: _Log, message: Any) -> None:
    try:
        record = orjson.loads(message.body)
    except orjson.JSONDecodeError:
        return  # not ours: nothing else publishes to the stream, but a stray message must not stop the count
    if not isinstance(record, dict):
        return
    if record.get("kind") == "fired":
        log.done = True
    elif record.get("kind") == "open":
        continuation = record.get("continuation")
        if isinstance(continuation, dict) and log.continuation is None:
            log.continuation = continuation
    elif record.get("kind") == "outcome":
        index = record.get("index")
        if isinstance(index, int) and index not in log.records:
            log.records[index] = record
    elif "specversion" in record or "kind" not in record:
        job_id = message.properties.get("message_id")
        if isinstance(job_id, str):
            log.fired.add(job_id)


def _entry(record: Mapping[str, Any]) -> Any:
    if record.get("state") == "failed":
        return {"error": record.get("error") or {}}
    return record.get("result")


__all__ = ["MAX_READERS", "STREAM_MAX_AGE", "STREAM_SEGMENT_BYTES", "FanIn", "MemberReport", "Pending", "Ready"]
