"""Dramatiq group completion callbacks on RabbitMQ alone: :class:`OjsGroupCallbacks`, in ``GroupCallbacks``' place.

::

    broker = OjsBroker(url)
    broker.add_middleware(OjsGroupCallbacks())  # instead of GroupCallbacks(RedisBackend())

    g = group(fetch.message(url) for url in urls)
    g.add_completion_callback(summarize.message())
    g.run()  # unchanged: summarize runs once, after every fetch completed

Dramatiq's ``GroupCallbacks`` counts a group down on a ``Barrier`` of a rate-limiter backend
(Redis or Memcached: the stub one is in-process only).  A barrier is a decrementing counter that
does not know *who* decrements: a member whose worker dies between its decrement and its ack is
delivered again and decrements again, and the callbacks then run before the last member ended (and
a later member's decrement finds nothing to clear).  So this middleware does not plug a backend
under the stock barrier: it counts on the fan-in of OJS workflows
(:class:`ojs_kombu.amqp.fanin.FanIn`, DESIGN §21), which records each member's outcome by its
index in a stream and counts *distinct* indexes, and elects the one reporter that publishes the
callbacks under a unique lock:

* ``group.run()`` finds this middleware (it is a ``GroupCallbacks``) and creates its barrier of
  ``n`` parties in :attr:`OjsGroupCallbacks.rate_limiter_backend` (a :class:`GroupCounts`), which
  opens the group's fan-in stream ``ojs.workflow.{group_completion_uuid}`` and notes ``n``;
* before each member is published (``before_enqueue``), its options get ``ojs_group``:
  ``{"index": i, "count": n}`` (a member pipeline: its last message, inside the ``pipe_target``
  chain, which is what ``group.run`` gives the group's options);
* a member whose actor returned reports ``completed`` (``after_process_message``, before the ack);
  a member failed for good reports ``failed`` (``before_nack``).  The one reporter that sees all
  ``n`` publishes the ``group_completion_callbacks`` (confirmed, each once: their message ids are
  fixed when they were added, and the stream records which were published) and deletes the stream;
* as with ``GroupCallbacks``, the callbacks run only when every member completed: a member that
  failed for good means they never run (the stream is deleted all the same).

The reports use the broker's workflow connection (:attr:`ojs_kombu.runtime.assembly.Assembly.workflow`),
one report at a time per process.  A report the broker refused twice hands
the member back (republished unchanged, then acked): it runs again and reports again, which counts
once.  The barrier's ``ttl`` does not apply: a group's stream lives until its callbacks were
published or a member failed for good, at most ``x-max-age`` (7 days) of records.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final, Literal, Protocol

from dramatiq.broker import Broker, MessageProxy
from dramatiq.message import Message
from dramatiq.middleware import GroupCallbacks
from dramatiq.rate_limits import RateLimiterBackend

from ojs_kombu.amqp.fanin import Ready
from ojs_kombu.errors import NotFoundError, ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.runtime.workflow import WorkflowHook, WorkflowRunner

from .consumer import OjsMessageProxy
from .errors import dramatiq_errors

logger = logging.getLogger(__name__)

GROUP_OPTION: Final = "ojs_group"
"""The message option holding a member's place in its group: ``{"index": i, "count": n}``."""

MAX_OPEN_GROUPS: Final = 1024
"""Groups :class:`GroupCounts` keeps the count of between ``group.run()`` creating the barrier and
its last member being published (an older one, whose run failed half-way, is forgotten)."""


class _GroupBroker(Protocol):
    """What :class:`OjsGroupCallbacks` needs of an :class:`~ojs_dramatiq.OjsBroker`."""

    @property
    def assembly(self) -> Any: ...

    def declare_queue(self, queue_name: str, *, ensure: bool = False) -> None: ...

    def job_for(self, message: Message[Any], *, delay_ms: int | None = None) -> Job: ...

    def emit_before(self, signal: str, *args: Any, **kwargs: Any) -> None: ...

    def emit_after(self, signal: str, *args: Any, **kwargs: Any) -> None: ...


class GroupCounts(RateLimiterBackend):
    """The ``rate_limiter_backend`` of :class:`OjsGroupCallbacks`: where ``group.run()`` creates its barrier.

    Only :meth:`add` is used (``Barrier.create``): it opens the group's fan-in and notes the
    number of members, so that the next ``n`` members published by this process get their
    index.  The other barrier and rate-limiter operations raise ``NotImplementedError``.

    Parameters:
        owner: the middleware it belongs to.
    """

    def __init__(self, owner: OjsGroupCallbacks):
        self._owner = owner
        self._lock = threading.Lock()
        self._groups: OrderedDict[str, list[int]] = OrderedDict()  # uuid -> [count, next index]

    def add(self, key: str, value: int, ttl: int) -> bool:
        """Open the fan-in of group ``key`` of ``value`` members (``ttl`` is not used).

        Parameters:
            key: the group's ``group_completion_uuid``.
            value: how many members it has.
            ttl: the barrier's TTL in ms (a fan-in lasts until it fired, see the module).

        Returns:
            True.

        Raises:
            RuntimeError: the middleware was not added to an ``OjsBroker``.
            ojs_kombu.ValidationError: ``value`` below 1.
            dramatiq.errors.BrokerError: the broker did not take the fan-in (twice), as
                ``OjsBroker.enqueue`` raises it (``ConnectionClosed`` ...).
        """
        hook = self._owner.hook()
        with dramatiq_errors():
            hook.run(lambda runner: runner.fan_in.open(key, value), job_id=key)
        self.note(key, value)
        return True

    def note(self, key: str, count: int) -> None:
        """Note that group ``key`` has ``count`` members, the next ones this process publishes.

        Parameters:
            key: the group's ``group_completion_uuid``.
            count: how many members it has.
        """
        with self._lock:
            self._groups[key] = [count, 0]
            while len(self._groups) > MAX_OPEN_GROUPS:
                self._groups.popitem(last=False)

    def take_index(self, key: str) -> tuple[int, int] | None:
        """The place of the next member of group ``key`` published by this process.

        Parameters:
            key: the group's ``group_completion_uuid``.

        Returns:
            ``(index, count)``, or None when :meth:`add` did not open this group here (or all
            its members have their place already).
        """
        with self._lock:
            entry = self._groups.get(key)
            if entry is None:
                return None
            count, index = entry
            entry[1] += 1
            if entry[1] >= count:
                del self._groups[key]
            return index, count


class OjsGroupCallbacks(GroupCallbacks):
    """Dramatiq's group completion callbacks without Redis: the members counted on the OJS fan-in.

    Add it to an :class:`~ojs_dramatiq.OjsBroker` in ``GroupCallbacks``' place (senders and
    workers alike); groups, their callbacks and actors are unchanged.  See the module for how,
    and why it is robust to a member delivered twice.
    """

    def __init__(self) -> None:
        #: Where ``group.run()`` creates its barrier (also ``rate_limiter_backend``, the name it looks for).
        self.counts = GroupCounts(self)
        self.rate_limiter_backend = self.counts
        self.barrier_ttl = 0
        self.broker: _GroupBroker | None = None

    def hook(self) -> WorkflowHook:
        """The workflow hook of the broker this middleware was added to.

        Raises:
            RuntimeError: it was not added to an :class:`~ojs_dramatiq.OjsBroker`.
        """
        hook: WorkflowHook = self._broker().assembly.workflow
        return hook

    def _broker(self) -> _GroupBroker:
        if self.broker is None:
            raise RuntimeError("OjsGroupCallbacks works on an OjsBroker: add it with broker.add_middleware()")
        return self.broker

    def before_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        """Give a member of a group run by this process its place in the group (``ojs_group``)."""
        options = _member_options(message.options)
        uuid = options.get("group_completion_uuid")
        if not uuid or GROUP_OPTION in options:
            return
        place = self.counts.take_index(uuid)
        if place is None:
            logger.warning(
                "message %s of group %s has no ojs_group option: its group was not run through "
                "OjsGroupCallbacks, its completion callbacks will not run",
                message.message_id,
                uuid,
            )
            return
        options[GROUP_OPTION] = {"index": place[0], "count": place[1]}

    def after_process_message(
        self, broker: Broker, message: MessageProxy, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        """A member whose actor returned reports ``completed``; the last one publishes the callbacks."""
        if exception is None and not message.failed:
            self._report(message, "completed")

    def before_nack(self, broker: Broker, message: MessageProxy) -> None:
        """A member failed for good reports ``failed``: its group's callbacks will not run."""
        self._report(message, "failed")

    def _report(self, message: MessageProxy, state: Literal["completed", "failed"]) -> None:
        member = _member(message.options)
        if member is None:
            return
        uuid, index, count, data = member
        broker = self._broker()
        try:  # what a foreign producer put in the options must not make the member run forever
            callbacks = [(callback, broker.job_for(callback)) for callback in _callback_messages(broker, data)]
        except Exception:
            logger.exception(
                "group %s: its completion callbacks are not valid messages; member %d not counted", uuid, index
            )
            return
        error = None if state == "completed" else {"code": "handler_error", "message": "the group member failed"}

        def report(runner: WorkflowRunner) -> list[Message[Any]]:
            try:
                outcome = runner.fan_in.report(uuid, index, count, state, None, error)
            except NotFoundError:
                logger.info("group %s ended already: the report of member %d was not needed", uuid, index)
                return []
            if not isinstance(outcome, Ready):
                return []
            return self._fire(runner, outcome, callbacks)

        try:
            fired = self.hook().run(report, job_id=message.message_id)
        except ValidationError:
            logger.exception("group %s: a completion callback cannot be published (over 1 MiB?)", uuid)
            return
        except Exception:  # the broker, twice: the member runs again and reports again, which counts once
            if state == "completed" and isinstance(message, OjsMessageProxy):
                logger.exception("group %s: the report of member %d failed; the member is handed back", uuid, index)
                message.origin.requeue([message])
            else:
                logger.exception("group %s: the report of failed member %d failed", uuid, index)
            return
        for callback in fired:
            broker.emit_after("enqueue", callback, None)

    def _fire(
        self, runner: WorkflowRunner, ready: Ready, callbacks: list[tuple[Message[Any], Job]]
    ) -> list[Message[Any]]:
        """Publish the callbacks of a group whose members all ended (none if one failed), then delete its fan-in."""
        if ready.failed:
            logger.info(
                "group %s: members %s failed; its completion callbacks do not run",
                ready.workflow_id,
                list(ready.failed),
            )
            runner.fan_in.cleanup(ready.workflow_id)
            return []
        broker = self._broker()
        outgoing = {}
        for callback, job in callbacks:
            broker.emit_before("enqueue", callback, None)
            outgoing[job.id] = (callback, runner.outgoing(job))
        published = runner.fan_in.fire(ready, [message for _, message in outgoing.values()])
        runner.fan_in.cleanup(ready.workflow_id)
        return [outgoing[job_id][0] for job_id in published]


def _callback_messages(broker: _GroupBroker, data: list[Any]) -> list[Message[Any]]:
    """The completion callbacks of a group, from its members' ``group_completion_callbacks``, their queues declared.

    Raises:
      TypeError: an entry is not a message's fields.
      ValidationError: a queue name that has no OJS queue name.
    """
    messages = []
    for fields in data:
        if not isinstance(fields, dict):
            raise TypeError(f"a completion callback must be a message's fields, got {type(fields).__name__}")
        message: Message[Any] = Message(**fields)
        broker.declare_queue(message.queue_name)
        messages.append(message)
    return messages


def _member_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options of the message that is the group member: ``options`` or, when they belong to
    the first message of a member pipeline, those of its last message (down the ``pipe_target`` chain)."""
    while "group_completion_uuid" not in options:
        target = options.get("pipe_target")
        if not isinstance(target, dict) or not isinstance(target.get("options"), dict):
            break
        options = target["options"]
    return options


def _member(options: Mapping[str, Any]) -> tuple[str, int, int, list[Any]] | None:
    """``(group uuid, index, count, callbacks)`` of a member message, or None for any other message."""
    uuid = options.get("group_completion_uuid")
    callbacks = options.get("group_completion_callbacks")
    if not uuid or not callbacks:
        return None
    place = options.get(GROUP_OPTION)
    if (
        not isinstance(place, dict)
        or not isinstance(place.get("index"), int)
        or not isinstance(place.get("count"), int)
        or not isinstance(callbacks, list)
    ):
        logger.warning("a member of group %s has no valid ojs_group option: it is not counted", uuid)
        return None
    return str(uuid), place["index"], place["count"], callbacks


__all__ = ["GROUP_OPTION", "MAX_OPEN_GROUPS", "GroupCounts", "OjsGroupCallbacks"]
