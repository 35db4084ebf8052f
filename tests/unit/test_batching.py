"""Batch consumption's pure parts: each member's outcome from what the handler did, and when a
batch's acks may be one ``Basic.Ack(multiple=True)``."""

from __future__ import annotations

from typing import Any

from ojs_kombu import BatchItemFailed
from ojs_kombu.runtime.batching import outcomes
from ojs_kombu.runtime.delivery import Delivery
from ojs_kombu.runtime.requests import SettleExecutor, SettleRequests
from ojs_kombu.runtime.wakeup import Wakeup
from ojs_kombu.runtime.window import Window


def test_outcomes_of_a_return_an_item_failure_a_result_list_and_a_whole_failure():
    boom, bad = RuntimeError("boom"), ValueError("bad")
    assert outcomes(3, None, None) == [(None, None)] * 3
    assert outcomes(3, "not a list", None) == [(None, None)] * 3
    assert outcomes(3, None, BatchItemFailed(1, bad)) == [(None, None), (bad, None), (None, None)]
    assert outcomes(2, None, boom) == [(boom, None), (boom, None)]
    assert outcomes(2, [bad, 7], None) == [(bad, None), (None, 7)]
    assert outcomes(2, [1, 2, 3], None) == [(None, None)] * 2  # not one item per job: no results
    failed = BatchItemFailed(5, bad)  # out of range: the whole batch failed with it
    assert outcomes(2, None, failed) == [(failed, None)] * 2


class _Box:
    """Records the settle frames an executor writes (the outbox's part is tested on a broker)."""

    def __init__(self) -> None:
        self.frames: list[tuple[str, int]] = []

    def hold(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def ack(self, channel: Any, tag: int) -> None:
        self.frames.append(("ack", tag))

    def ack_multiple(self, channel: Any, tag: int) -> None:
        self.frames.append(("multiple", tag))


def _executor() -> tuple[SettleExecutor, _Box, Wakeup]:
    wakeup = Wakeup()
    executor = SettleExecutor(SettleRequests(wakeup), Window("t", 10, ["q"]))
    box = _Box()
    executor.attach(object(), box, object(), 1)  # type: ignore[arg-type]
    return executor, box, wakeup


def _deliveries(*tags: int, generation: int = 1) -> tuple[Delivery, ...]:
    return tuple(Delivery(b"{}", {}, {}, tag, False, "", "q", "q", generation) for tag in tags)


def test_a_batch_of_the_outstanding_tags_is_one_multiple_ack_else_one_ack_each():
    executor, box, wakeup = _executor()
    try:
        for tag in range(1, 8):
            executor.delivered(tag)
        executor.ack_many(_deliveries(1, 2, 3))
        assert box.frames == [("multiple", 3)] and executor.outstanding == {4, 5, 6, 7}
        box.frames.clear()
        executor.ack_many(_deliveries(4, 6))  # 5 is another handler's, outstanding: not acked with them
        assert box.frames == [("ack", 4), ("ack", 6)] and executor.outstanding == {5, 7}
        box.frames.clear()
        executor.ack_many(_deliveries(7))  # 5 still outstanding below it
        assert box.frames == [("ack", 7)]
        assert (executor.multiple_acks, executor.single_ack_batches) == (1, 1)
        box.frames.clear()
        executor.ack_many(_deliveries(5, generation=0))  # an older connection's: redelivered, not acked
        assert box.frames == [] and executor.outstanding == {5}
    finally:
        wakeup.close()
