"""The dashboard's pure parts: the sparkline, the bar chart and the depth history (no broker, no browser)."""

from __future__ import annotations

from datetime import UTC, datetime

from ojs_kombu.dashboard.history import DepthHistory
from ojs_kombu.dashboard.overview import QueueStatus, Snapshot
from ojs_kombu.dashboard.svg import bars, sparkline


def test_sparkline_scales_the_samples_into_the_box():
    svg = str(sparkline([0, 5, 10], width=100, height=20))
    assert 'points="0.0,19.0 50.0,10.0 100.0,1.0"' in svg
    assert "<title>depth, max 10</title>" in svg


def test_sparkline_of_no_or_flat_samples():
    assert "polyline" not in str(sparkline([]))
    assert 'points="0.0,19.0 50.0,19.0 100.0,19.0"' in str(sparkline([0, 0, 0], width=100, height=20))


def test_depth_history_keeps_the_last_samples_of_existing_queues():
    history = DepthHistory(size=3)
    for depth in range(5):
        history.record(Snapshot([QueueStatus("a", True, ready=depth), QueueStatus("gone", False)], 0, True))
    assert history.of("a") == [2, 3, 4]
    assert history.of("gone") == []


def test_bars_stack_each_bucket_with_its_counts_as_data():
    starts = [datetime(2026, 11, 27, 12, m, tzinfo=UTC) for m in range(3)]
    svg = str(bars(starts, [("succeeded", "completed", [0, 2, 4]), ("failed", "failed <x>", [0, 2, 0])], title="t <1>"))
    assert svg.count('<g class="bar"') == 3 and 'aria-label="t &lt;1&gt;"' in svg
    assert '<g class="bar" data-start="2026-11-27T12:01:00.000Z" data-succeeded="2" data-failed="2">' in svg
    assert "failed &lt;x&gt; 2" in svg  # the tooltip, escaped
    assert svg.count('class="s-succeeded"') == 2 and svg.count('class="s-failed"') == 1  # no empty segment
    assert '<text class="peak" x="2" y="10">4</text>' in svg
    empty = str(bars(starts, [("succeeded", "completed", [0, 0, 0])], title="t"))
    assert "s-succeeded" not in empty and empty.count('<g class="bar"') == 3
