"""The dead letters service: browse, replay and purge ``ojs.queue.dlx.{queue}``.

Browsing reads with ``Basic.Get`` on a channel closed without acking.  Replaying and
purging some letters walk the queue (:class:`DeadLetterWalk`): at most ``window``
letters held unacknowledged, each letter taken (republished to its job queue, or
removed) or moved to the back of the dead letter queue unchanged, so the letters
left keep their order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from amqp import Channel, Message
from kombu.connection import Connection

from ojs_kombu.amqp.connection import close_quietly
from ojs_kombu.amqp.errors import map_exceptions
from ojs_kombu.amqp.publisher import ConfirmedPublisher, PublishTicket
from ojs_kombu.client.session import Service, Session
from ojs_kombu.errors import PublishError, ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import validate_queue_name
from ojs_kombu.runtime.deadletter import (
    DeadLetterEntry,
    FinalFailureJoin,
    ReplayProgress,
    SameDeath,
    read_final_failures,
    replayable,
)
from ojs_kombu.wire.codec import OutgoingMessage, encode

#: Dead letters a replay holds unacknowledged at most (``replay_dead_letters(window=)``).
DEFAULT_REPLAY_WINDOW = 100

#: What a walk does with a letter it takes: republish its job (returns the publish's ticket).
Take = Callable[[Connection, ConfirmedPublisher, Job, Message], PublishTicket]


def final_failures(session: Session, conn: Connection, queue: str) -> FinalFailureJoin:
    """What joins the nacked letters of ``queue`` to their final failures (read at the first need)."""
    return FinalFailureJoin(lambda: read_final_failures(conn.connection, session.names, session.topology, queue))


def get_dead_letter(session: Session, channel: Channel, dead_letter_queue: str) -> Message | None:
    """``Basic.Get`` one message of ``dead_letter_queue``, unacked; None when it is empty.

    Raises:
        NotFoundError: the dead letter queue does not exist (it must: a 404 is final here).
    """
    with map_exceptions(url=session.url, must_exist=True):
        message: Message | None = channel.basic_get(dead_letter_queue, no_ack=False)
    return message


@dataclass
class _Held:
    """A letter fetched and not yet acked: its republish's ticket, and its id if it is taken."""

    message: Message
    ticket: PublishTicket | None
    letter_id: str | None


class DeadLetterWalk:
    """One walk over ``ojs.queue.dlx.{queue}``; :meth:`run` is its session operation.

    A letter that ``select`` picks (while fewer than ``limit`` are taken) is taken:
    republished by ``take`` and acked once that is confirmed, or, when ``take`` is None,
    acked at once (removed).  Every other letter is moved to the back of the queue
    unchanged (confirmed, then acked), and the walk then covers every message that was
    in the queue when it began, so the letters left keep their order (letters dead-lettered
    during the walk may end up among them).  When nothing was passed over, the walk stops as
    soon as ``limit`` letters are taken.  A crash mid-walk may leave a passed-over letter twice
    in the queue, never none.  The id of a taken letter is its job's id, else its
    ``message_id``; :attr:`taken_ids` lists them.

    Parameters:
        session: the client's session.
        queue: the OJS queue.
        select: which letters to take.
        take: how to take one (None: remove it).
        limit: take at most this many.
        window: letters held unacknowledged at most (>= 1).
        progress: called once per window, before its letters are acked.

    Raises:
        ValidationError: a bad queue name or window.
    """

    def __init__(
        self,
        session: Session,
        queue: str,
        *,
        select: Callable[[DeadLetterEntry], bool],
        take: Take | None,
        limit: int | None = None,
        window: int = DEFAULT_REPLAY_WINDOW,
        progress: Callable[[ReplayProgress], None] | None = None,
    ):
        validate_queue_name(queue)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValidationError(f"window must be an integer >= 1, got {window!r}", field="window")
        self.session = session
        self.queue = queue
        self.dead_letter_queue = session.names.dead_letter_queue(queue)
        self.select = select
        self.take = take
        self.limit = limit
        self.window = window
        self.progress = progress
        self.taken_ids: list[str] = []  # kept across reconnects: those letters are acked
        self._start()

    def _start(self) -> None:
        """An attempt starts over: what it counts is of the letters it fetched itself."""
        self.to_scan: int | None = None  # messages in the queue when the attempt began
        self.scanned = 0
        self.passed_over = 0
        self._held: list[_Held] = []

    def _taken(self) -> int:
        """Letters taken, or taken and awaiting their republish's confirm."""
        return len(self.taken_ids) + sum(held.letter_id is not None for held in self._held)

    def _done(self) -> bool:
        if self.to_scan is not None and self.scanned >= self.to_scan:
            return True
        # Stop at the limit, unless letters were moved to the back: then they must come round.
        return self.limit is not None and self._taken() >= self.limit and not self.passed_over

    def run(self, conn: Connection) -> None:
        """Walk the queue on ``conn``, one window at a time (the operation :meth:`Session.run` retries)."""
        self._start()
        self._join, self._taken_deaths = final_failures(self.session, conn, self.queue), SameDeath()
        publisher = self.session.publisher(conn)
        channel = conn.connection.channel()
        channel.auto_decode = False
        try:
            while not self._done():
                self._fetch_window(conn, publisher, channel)
                publisher.wait([h.ticket for h in self._held if h.ticket is not None], self.session.confirm_timeout)
                if self.progress is not None and self._held:
                    self.progress(
                        ReplayProgress(
                            self.to_scan, self.scanned, len(self.taken_ids), self.passed_over, held=len(self._held)
                        )
                    )
                self._ack_window(channel)
        finally:
            close_quietly(channel)  # what is not acked goes back to the queue

    def _fetch_window(self, conn: Connection, publisher: ConfirmedPublisher, channel: Channel) -> None:
        """Fetch up to ``window`` letters, taking or moving each one."""
        self._held = []
        while len(self._held) < self.window and not self._done():
            message = get_dead_letter(self.session, channel, self.dead_letter_queue)
            if message is None:
                self.to_scan = self.scanned
                return
            if self.to_scan is None:
                self.to_scan = int(message.delivery_info.get("message_count") or 0) + 1
            self.scanned += 1
            entry = self._join(DeadLetterEntry.from_message(message))
            if self._taken_deaths.repeats(entry):
                self._held.append(_Held(message, None, None))  # a second letter of a death taken: removed
            elif self.select(entry) and (self.limit is None or self._taken() < self.limit):
                self._taken_deaths.add(entry)
                chosen = entry.job.id if entry.job is not None else str(entry.message_id)
                take = self.take
                ticket = take(conn, publisher, entry.job, message) if take is not None and entry.job else None
                self._held.append(_Held(message, ticket, chosen))
            else:
                self.passed_over += 1
                self._held.append(_Held(message, self._requeue_at_back(publisher, message), None))

    def _ack_window(self, channel: Channel) -> None:
        """Ack every held letter whose republish was confirmed; raise the first refusal after.

        Raises:
            PublishError: a republish was refused (its letter returns to the queue with the channel).
        """
        failure: PublishError | None = None
        for held in self._held:
            if held.ticket is not None and held.ticket.error is not None:
                failure = failure or held.ticket.error
                continue  # unacked: back in the queue when the channel closes
            channel.basic_ack(held.message.delivery_info["delivery_tag"])
            if held.letter_id is not None:
                self.taken_ids.append(held.letter_id)
        self._held = []
        if failure is not None:
            raise failure

    def _requeue_at_back(self, publisher: ConfirmedPublisher, message: Message) -> PublishTicket:
        """Publish ``message`` unchanged to the back of the dead letter queue (default exchange)."""
        properties = dict(message.properties)
        headers = properties.pop("application_headers", None) or {}
        return publisher.publish(
            OutgoingMessage(message.body, properties, headers),
            exchange="",
            routing_key=self.dead_letter_queue,
            queue=self.dead_letter_queue,
            job_id=properties.get("message_id"),
            confirm_timeout=self.session.confirm_timeout,
        )


class DeadLetters(Service):
    """Browses, replays and purges dead letters through the client's session (see :class:`~ojs_kombu.Client`)."""

    def browse(
        self, queue: str, limit: int | None, select: Callable[[DeadLetterEntry], bool] | None
    ) -> list[DeadLetterEntry]:
        """Up to ``limit`` jobs in ``ojs.queue.dlx.{queue}``, oldest first, left in place (:meth:`ojs_kombu.Client.dead_letters`).

        Read with ``Basic.Get`` on a channel then closed without acking, so the broker keeps every
        one of them.  Inspection is not FETCH: workers never use ``Basic.Get``.

        Parameters:
            queue: the OJS queue whose dead letters to read.
            limit: at most this many entries (``None``: all of them).
            select: only the entries it picks (e.g. a :class:`~ojs_kombu.runtime.deadletter.DeadLetterFilter`);
                the letters it passes over are read too (held unacked until the browse ends).

        Raises:
            NotFoundError: the dead letter queue does not exist.
        """
        validate_queue_name(queue)
        dead_letter_queue = self.session.names.dead_letter_queue(queue)

        def browse(conn: Connection) -> list[DeadLetterEntry]:
            channel = conn.connection.channel()
            channel.auto_decode = False
            entries: list[DeadLetterEntry] = []
            join, shown = final_failures(self.session, conn, queue), SameDeath()
            try:
                while limit is None or len(entries) < limit:
                    message = get_dead_letter(self.session, channel, dead_letter_queue)
                    if message is None:
                        break
                    entry = join(DeadLetterEntry.from_message(message))
                    if shown.repeats(entry):
                        continue  # a second letter of one death (a crash before its republish's ack)
                    shown.add(entry)
                    if select is None or select(entry):
                        entries.append(entry)
            finally:
                close_quietly(channel)  # unacked messages go back where they were
            return entries

        return self.session.run(browse)

    def replay(
        self,
        queue: str,
        *,
        limit: int | None,
        ids: Iterable[str] | None,
        window: int,
        progress: Callable[[ReplayProgress], None] | None,
        select: Callable[[DeadLetterEntry], bool] | None,
    ) -> list[str]:
        """Move dead letters of ``queue`` back to their job queue; returns the replayed job ids.

        Serves :meth:`ojs_kombu.Client.replay_dead_letters`.  Each replayed job starts again at
        attempt 0 (its error history kept, ``meta["ojs.replay_count"]`` incremented, ``x-death*``
        and error headers removed); its republish is confirmed before its ack.

        The queue is walked as :class:`DeadLetterWalk` says: at most ``window`` letters
        unacknowledged, a letter passed over (not among ``ids``, not an OJS job, or past
        ``limit``) moved to the back unchanged, so the letters left keep their order.

        Parameters:
            queue: the OJS queue whose ``ojs.queue.dlx.{queue}`` is read.
            limit: replay at most this many jobs.
            ids: replay only these job ids.
            window: dead letters held unacknowledged at most (>= 1).
            progress: called with a :class:`~ojs_kombu.runtime.deadletter.ReplayProgress` once per
                window, right before its acks.
            select: replay only the letters it also picks (a ``DeadLetterFilter``, say).

        Raises:
            NotFoundError: the dead letter queue does not exist.
            PublishError: a republish was refused (the walk stops; letters not acked return).
        """
        wanted = {i.lower() for i in ids} if ids is not None else None
        walk = DeadLetterWalk(
            self.session,
            queue,
            select=lambda entry: (
                entry.job is not None
                and (wanted is None or entry.job.id in wanted)
                and (select is None or select(entry))
            ),
            take=self._republish,
            limit=limit,
            window=window,
            progress=progress,
        )
        self.session.run(walk.run)
        return walk.taken_ids

    def _republish(self, conn: Connection, publisher: ConfirmedPublisher, job: Job, message: Message) -> PublishTicket:
        """Publish ``job`` replayed to its queue (not waiting for the confirm)."""
        job = replayable(job)
        session = self.session
        if session.declare:
            session.topology.ensure_queue(conn.connection, job.queue)
        return publisher.publish(
            encode(job, app_id=message.properties.get("app_id")),
            exchange=session.names.direct_exchange,
            routing_key=job.queue,
            queue=job.queue,
            job_id=job.id,
            confirm_timeout=session.confirm_timeout,
        )

    def purge(
        self,
        queue: str,
        *,
        ids: Iterable[str] | None,
        window: int,
        select: Callable[[DeadLetterEntry], bool] | None,
        limit: int | None,
        progress: Callable[[ReplayProgress], None] | None,
    ) -> int:
        """Delete dead letters of ``queue``: all of them, or exactly those whose id is in ``ids``.

        Serves :meth:`ojs_kombu.Client.purge_dead_letters`.  Without ``ids``, ``select`` and
        ``limit`` the queue is purged.  Otherwise (``ids``: job ids, or the ``message_id`` of a
        letter that is not an OJS job; any case) the queue is walked as :meth:`replay` walks it,
        each chosen letter removed.  Meant for a pipeline that archived some dead letters (e.g. to
        Parquet) and must remove exactly those.

        Parameters:
            queue: the OJS queue whose ``ojs.queue.dlx.{queue}`` is purged.
            ids: delete only these letters.
            window: letters held unacknowledged at most during a walk (>= 1).
            select: delete only the letters it also picks (a ``DeadLetterFilter``, say).
            limit: delete at most this many letters.
            progress: called once per window of a walk, as for :meth:`replay`.

        Returns:
            How many letters were deleted.

        Raises:
            NotFoundError: the dead letter queue does not exist.
            PublishError: moving a letter to the back was refused (the walk stops; nothing is lost).
        """
        validate_queue_name(queue)
        if ids is None and select is None and limit is None:
            return self._purge_all(queue)
        wanted = {i.lower() for i in ids} if ids is not None else None
        if wanted is not None and not wanted:
            return 0
        walk = DeadLetterWalk(
            self.session,
            queue,
            select=lambda entry: (wanted is None or entry.letter_id in wanted) and (select is None or select(entry)),
            take=None,
            limit=limit,
            window=window,
            progress=progress,
        )
        self.session.run(walk.run)
        return len(walk.taken_ids)

    def _purge_all(self, queue: str) -> int:
        dead_letter_queue = self.session.names.dead_letter_queue(queue)

        def purge(conn: Connection) -> int:
            channel = conn.connection.channel()
            try:
                with map_exceptions(url=self.session.url, must_exist=True):
                    return int(channel.queue_purge(dead_letter_queue) or 0)
            finally:
                close_quietly(channel)

        return self.session.run(purge)


__all__ = ["DEFAULT_REPLAY_WINDOW", "DeadLetterWalk", "DeadLetters", "get_dead_letter"]
