"""ConfirmedPublisher settles exactly the tickets a ``Basic.Ack`` / ``Basic.Nack`` covers."""

from __future__ import annotations

from ojs_kombu.amqp.publisher import ConfirmedPublisher, PublishTicket
from ojs_kombu.errors import PublishNackedError


def publisher_with(tags: list[int]) -> ConfirmedPublisher:
    publisher = ConfirmedPublisher.__new__(ConfirmedPublisher)  # no channel: only the bookkeeping is tested
    publisher._unconfirmed = {tag: PublishTicket(tag, f"job-{tag}", "q", "x", "q") for tag in tags}
    publisher.renew_on_nack = True  # __init__'s default
    return publisher


def test_a_multiple_ack_settles_every_tag_up_to_it_and_no_other() -> None:
    publisher = publisher_with([1, 2, 3, 4, 5, 6, 7])
    tickets = dict(publisher._unconfirmed)
    publisher._on_ack(2, False)  # a single ack in the middle first
    publisher._on_ack(5, True)
    assert sorted(publisher._unconfirmed) == [6, 7]
    assert all(tickets[t].done and tickets[t].error is None for t in (1, 2, 3, 4, 5))
    assert not tickets[6].done and not tickets[7].done
    publisher._on_nack(7, True)
    assert publisher.unconfirmed == 0
    assert isinstance(tickets[6].error, PublishNackedError) and isinstance(tickets[7].error, PublishNackedError)


def test_acks_for_unknown_tags_change_nothing() -> None:
    publisher = publisher_with([10, 11])
    publisher._on_ack(9, True)
    publisher._on_ack(12, False)
    assert sorted(publisher._unconfirmed) == [10, 11]
