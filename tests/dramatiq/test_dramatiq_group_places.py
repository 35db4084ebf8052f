"""How OjsGroupCallbacks finds and numbers the members of a group (pure logic, no broker)."""

from __future__ import annotations

import dramatiq
import pytest
from dramatiq import pipeline
from dramatiq.brokers.stub import StubBroker

from ojs_dramatiq import OjsGroupCallbacks
from ojs_dramatiq.groups import GROUP_OPTION, MAX_OPEN_GROUPS, _callback_messages, _member, _member_options


@pytest.fixture
def stub() -> StubBroker:
    """Dramatiq's in-process broker: only to build messages and pipelines, nothing is sent."""
    return StubBroker()


def test_members_are_numbered_once_each_and_the_group_is_then_forgotten():
    counts = OjsGroupCallbacks().counts
    counts.note("g1", 2)
    counts.note("g2", 1)
    assert [counts.take_index("g1"), counts.take_index("g2"), counts.take_index("g1")] == [(0, 2), (0, 1), (1, 2)]
    assert counts.take_index("g1") is None and counts.take_index("unknown") is None


def test_only_the_most_recent_open_groups_are_kept():
    counts = OjsGroupCallbacks().counts
    for n in range(MAX_OPEN_GROUPS + 1):
        counts.note(f"g{n}", 3)
    assert counts.take_index("g0") is None  # a run that failed half-way does not grow memory forever
    assert counts.take_index(f"g{MAX_OPEN_GROUPS}") == (0, 3)


def test_the_member_of_a_pipeline_in_a_group_is_its_last_message(stub):
    step = dramatiq.Actor(lambda *a: None, broker=stub, actor_name="step", queue_name="q", priority=0, options={})
    last = step.message(3).copy(options={"group_completion_uuid": "g", "group_completion_callbacks": [{}]})
    pipe = pipeline([step.message(1), step.message(2), last], broker=stub)
    first = pipe.messages[0]
    options = _member_options(first.options)
    assert options["group_completion_uuid"] == "g"
    options[GROUP_OPTION] = {"index": 4, "count": 5}  # what before_enqueue does: it travels in pipe_target
    assert first.options["pipe_target"]["options"]["pipe_target"]["options"][GROUP_OPTION] == {"index": 4, "count": 5}
    assert _member_options(step.message(1).options) == {}  # a message of no group: its own options


@pytest.mark.parametrize(
    ("place", "expected"),
    [
        ({"index": 1, "count": 3}, ("g", 1, 3, [{"actor_name": "cb"}])),
        (None, None),  # sent through a stock GroupCallbacks: not counted
        ({"index": "1", "count": 3}, None),
        ({"count": 3}, None),
    ],
)
def test_a_member_is_counted_only_with_a_valid_place(place, expected):
    options = {"group_completion_uuid": "g", "group_completion_callbacks": [{"actor_name": "cb"}]}
    if place is not None:
        options[GROUP_OPTION] = place
    assert _member(options) == expected
    assert _member({"pipe_target": {}}) is None  # no group at all


def test_callbacks_from_the_options_are_messages_or_a_clear_error(stub):
    callback = dramatiq.Actor(lambda: None, broker=stub, actor_name="cb", queue_name="q", priority=0, options={})
    fields = callback.message().asdict()
    assert _callback_messages(stub, [fields])[0].message_id == fields["message_id"]
    with pytest.raises(TypeError, match="message's fields"):
        _callback_messages(stub, ["cb"])
    with pytest.raises(TypeError):
        _callback_messages(stub, [{"actor_name": "cb"}])  # a foreign producer's options: the member is not counted
