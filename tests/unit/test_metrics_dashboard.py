"""``examples/grafana/ojs.json``: valid JSON whose queries only name metrics the library exports, and show all of them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ojs_kombu.observability.job_metrics import JobMetrics
from ojs_kombu.observability.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "grafana" / "ojs.json"

#: What a metric family exposes: the sample names a PromQL query can select.
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def exported() -> dict[str, str]:
    """Every sample name of the library's metrics -> its family (on a registry of their own)."""
    registry = CollectorRegistry()
    Metrics(registry)
    JobMetrics(registry)
    return {family.name + suffix: family.name for family in registry.collect() for suffix in _SUFFIXES[family.type]}


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL text of the dashboard: panel targets and query variables."""
    found = [target["expr"] for panel in panels(dashboard["panels"]) for target in panel.get("targets", [])]
    variables = dashboard["templating"]["list"]
    found += [variable["query"]["query"] for variable in variables if variable["type"] == "query"]
    return found


def metric_names(expr: str) -> set[str]:
    """The ``ojs_*`` names in a query (label names never start with ``ojs_``)."""
    return set(re.findall(r"\bojs_[a-z0-9_]+", expr))


def test_every_query_names_only_exported_metrics(dashboard: dict[str, Any]) -> None:
    names = exported()
    texts = queries(dashboard)
    assert len(texts) >= 20
    for expr in texts:
        used = metric_names(expr)
        assert used, f"a query that names no ojs metric: {expr}"
        assert used <= names.keys(), f"{sorted(used - names.keys())} are not exported (in {expr})"


def test_every_exported_metric_has_a_panel(dashboard: dict[str, Any]) -> None:
    names = exported()
    shown = {names[name] for expr in queries(dashboard) for name in metric_names(expr) if name in names}
    assert shown == set(names.values())


def test_panels_use_the_prometheus_datasource_variable(dashboard: dict[str, Any]) -> None:
    [variable] = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
    assert (variable["type"], variable["query"]) == ("datasource", "prometheus")
    graphs = [panel for panel in panels(dashboard["panels"]) if panel["type"] != "row"]
    assert graphs
    for panel in graphs:
        sources = [panel["datasource"], *(target["datasource"] for target in panel["targets"])]
        assert all(source == {"type": "prometheus", "uid": "${datasource}"} for source in sources), panel["title"]
    ids = [panel["id"] for panel in panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))
