"""Subscriptions: pause, resume and broker cancels of one channel's job queue consumers (pure logic)."""

from __future__ import annotations

import pytest

from ojs_kombu.observability.metrics import METRICS
from ojs_kombu.runtime.subscriptions import Subscription, Subscriptions


class Recorder:
    """A Subscriber that records what it was asked, and what was registered as consuming meanwhile."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.subscriptions: Subscriptions[Subscription] | None = None
        self.tags_while_cancelling: list[set[str]] = []
        self._next = 0

    def consume(self, subscription: Subscription) -> str:
        self._next += 1
        self.calls.append(("consume", subscription.ojs_queue))
        return f"tag{self._next}"

    def cancel(self, subscription: Subscription) -> None:
        assert self.subscriptions is not None
        self.tags_while_cancelling.append(set(self.subscriptions.by_tag))
        self.calls.append(("cancel", subscription.ojs_queue))


def subscriptions(*queues: str, paused: frozenset[str] = frozenset()) -> tuple[Subscriptions[Subscription], Recorder]:
    recorder = Recorder()
    subs: Subscriptions[Subscription] = Subscriptions(recorder)
    recorder.subscriptions = subs
    for queue in queues:
        subs.add(Subscription(f"ojs.queue.{queue}", queue), paused)
    return subs, recorder


def test_a_queue_paused_when_added_is_consumed_on_resume_only():
    subs, recorder = subscriptions("a", "b", paused=frozenset({"b"}))
    assert recorder.calls == [("consume", "a")]
    assert {s.ojs_queue for s in subs.by_tag.values()} == {"a"}
    subs.apply(frozenset())
    assert recorder.calls[-1] == ("consume", "b") and subs.consuming


def test_pause_cancels_and_resume_consumes_again_once_per_change():
    subs, recorder = subscriptions("a")
    subs.apply(frozenset({"a"}))
    subs.apply(frozenset({"a"}))  # no change: nothing sent
    assert recorder.calls == [("consume", "a"), ("cancel", "a")]
    assert not subs.consuming
    # The cancel is sent while the tag still maps to its queue: deliveries read during the
    # cancel's wait for Basic.CancelOk are still the queue's.
    assert recorder.tags_while_cancelling == [{"tag1"}]
    subs.apply(frozenset())
    assert recorder.calls[-1] == ("consume", "a") and list(subs.by_tag) == ["tag2"]


def test_resume_false_leaves_a_resumed_queue_unconsumed():
    subs, recorder = subscriptions("a", paused=frozenset({"a"}))
    subs.apply(frozenset(), resume=False)
    assert recorder.calls == [] and not subs.consuming


def test_a_broker_cancel_is_counted_with_the_ojs_queue_and_retried_when_due(monkeypatch: pytest.MonkeyPatch):
    subs, recorder = subscriptions("a")
    counter = METRICS.consumer_cancellations.labels("a")
    before = counter._value.get()
    subscription = subs.broker_cancelled("tag1", 0.0, "re-consuming")
    assert subscription is not None and not subscription.consuming
    assert counter._value.get() == before + 1  # labelled with the OJS queue, not ojs.queue.a
    assert subs.retrying and not subs.consuming
    assert subs.broker_cancelled("unknown", 0.0, "") is None
    [due] = subs.due()
    assert due is subscription and not subs.retrying
    subs.start(due)
    assert recorder.calls[-1] == ("consume", "a") and subs.consuming


def test_a_pause_drops_a_pending_retry_and_resume_consumes_instead():
    subs, recorder = subscriptions("a")
    subs.broker_cancelled("tag1", 60.0, "re-consuming")
    subs.apply(frozenset({"a"}))
    assert not subs.retrying and recorder.calls == [("consume", "a")]  # nothing to cancel at the broker
    subs.apply(frozenset())
    assert recorder.calls[-1] == ("consume", "a") and subs.consuming


def test_cancel_all_and_remove():
    subs, recorder = subscriptions("a", "b")
    subs.broker_cancelled("tag2", 60.0, "re-consuming")
    subs.cancel_all()
    assert not subs.consuming and not subs.retrying
    assert [c for c in recorder.calls if c[0] == "cancel"] == [("cancel", "a")]
    removed = subs.remove("tag1")
    assert removed is not None and removed.ojs_queue == "a" and subs.find("tag1") is None
    subs.clear()
    assert list(subs) == []
