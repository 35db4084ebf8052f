"""How the dashboard shows values (issue 29 item 6): pure functions, no broker, no browser."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ojs_kombu.dashboard.render import NONE, age, describe_error, error_runs, queue_state, show, when
from ojs_kombu.dashboard.replays import Replays, predates
from ojs_kombu.model.info import JobInfo

NOW = datetime(2026, 11, 27, 11, 30, 0, 571000, tzinfo=UTC)


def test_age_reads_in_the_largest_whole_unit_past_and_future():
    assert age(NOW, NOW) == "just now"
    assert age(NOW - timedelta(seconds=42.9), NOW) == "42 s ago"
    assert age(NOW - timedelta(minutes=3, seconds=59), NOW) == "3 min ago"
    assert age(NOW - timedelta(hours=2, minutes=1), NOW) == "2 h ago"
    assert age(NOW - timedelta(days=5, hours=23), NOW) == "5 d ago"
    assert age(NOW + timedelta(minutes=20), NOW) == "in 20 min"


def test_when_prints_the_cli_timestamp_with_its_age():
    then = NOW - timedelta(minutes=3)
    html = str(when(then, NOW))
    assert (
        html
        == '<time datetime="2026-11-27T11:27:00.571Z">2026-11-27T11:27:00.571Z</time> <span class="age">3 min ago</span>'
    )
    assert str(when("2026-11-27T11:27:00.571Z", NOW)) == html  # an RFC 3339 string reads the same
    assert str(when(None)) == NONE
    assert str(when("<not a time>")) == "&lt;not a time&gt;"  # shown as it is, escaped


def test_show_never_prints_a_python_repr():
    assert str(show(None)) == NONE == "–"
    assert (str(show(True)), str(show(False))) == ("yes", "no")
    assert str(show(0)) == "0"
    assert str(show(("a", "b"))) == "a, b" and str(show([])) == NONE
    assert str(show({"code": "E1", "retry": None})) == f"code: E1 · retry: {NONE}"
    assert str(show("<b>")) == "&lt;b&gt;"
    assert "+00:00" not in str(show(NOW)) and "2026-11-27T11:30:00.571Z" in str(show(NOW))
    assert (queue_state(True), queue_state(False), queue_state(None)) == ("paused", "running", NONE)


def test_describe_error_puts_code_and_message_first_and_keeps_every_other_field():
    text = str(describe_error({"code": "E", "message": "boom", "attempt": 2, "occurred_at": "2026-11-27T11:29:00Z",
                               "details": {"k": 1}}))  # fmt: skip
    assert text.startswith(
        '<span class="error-text">E: boom</span> · attempt 2 · <time datetime="2026-11-27T11:29:00.000Z">'
    )
    assert text.endswith(" · details: {&#34;k&#34;: 1}")  # JSON, escaped
    assert str(describe_error({"type": "ValueError", "message": "x"})).startswith(
        '<span class="error-text">ValueError: x'
    )
    assert str(describe_error(None)) == NONE
    assert str(describe_error({"code": None, "message": "only"})) == '<span class="error-text">only</span>'


def _error(n: int, at: str) -> dict[str, object]:
    return {"code": "E", "message": f"#{n}", "attempt": n, "occurred_at": at}


def test_error_runs_split_the_errors_at_the_last_replay():
    old, new = _error(1, "2026-11-27T11:00:00Z"), _error(1, "2026-11-27T11:20:00Z")
    runs = error_runs([old, new], {"ojs.replay_count": 1, "ojs.last_replayed_at": "2026-11-27T11:10:00.000Z"})
    assert [(r.errors, r.replayed_at) for r in runs] == [
        ([old], datetime(2026, 11, 27, 11, 10, tzinfo=UTC)),
        ([new], None),
    ]
    assert [r.errors for r in error_runs([old, new], None)] == [[old, new]]  # never replayed: one run
    assert error_runs([], {"ojs.last_replayed_at": "2026-11-27T11:10:00.000Z"}) == []
    # an error with no readable time, and every one after it, counts as since the replay (never hidden)
    odd = {"code": "E", "message": "no time"}
    runs = error_runs([old, odd, _error(2, "2026-11-27T11:01:00Z")], {"ojs.last_replayed_at": "2026-11-27T11:10:00Z"})
    assert [len(r.errors) for r in runs] == [1, 2] and runs[1].replayed_at is None


def test_an_info_predates_a_replay_when_it_finished_before_it():
    replays = Replays(size=2)
    replays.record(["A", "b"], NOW)
    replays.record(["c"], NOW + timedelta(seconds=1))
    assert replays.last("a") is None and replays.last("B") == NOW  # the oldest forgotten; ids in any case

    def info(state: str, finished: datetime | None) -> JobInfo:
        return JobInfo("b", "q", "t", state, "w", 1, NOW - timedelta(minutes=1), finished)  # type: ignore[arg-type]

    assert predates(info("discarded", NOW - timedelta(seconds=1)), NOW)
    assert not predates(info("completed", NOW + timedelta(seconds=1)), NOW)  # the replayed run's outcome
    assert not predates(info("active", None), NOW)  # running again
    assert not predates(info("discarded", NOW - timedelta(seconds=1)), None)  # no replay known
    assert not predates(None, NOW)
