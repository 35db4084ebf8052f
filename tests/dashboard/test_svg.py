"""The dashboard's pure parts: the sparkline and the depth history (no broker, no browser)."""

from __future__ import annotations

from ojs_kombu.dashboard.history import DepthHistory
from ojs_kombu.dashboard.overview import QueueStatus, Snapshot
from ojs_kombu.dashboard.svg import sparkline


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
