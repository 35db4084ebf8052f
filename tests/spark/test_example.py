"""examples/spark_pipeline.py end to end, as a user runs it (a subprocess, real broker, real Spark)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ojs_kombu.amqp.management import ManagementClient
from ojs_kombu.model.timefmt import parse_timestamp
from ojs_kombu.spark.ids import key_id

ROOT = Path(__file__).resolve().parents[2]
ROWS = 3000


def example_module():
    """The example's module (for its constants), loaded without running it."""
    spec = importlib.util.spec_from_file_location("spark_pipeline", ROOT / "examples" / "spark_pipeline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected_counts(rows: int) -> tuple[int, int]:
    """What the example must select and fail, computed here in plain Python (not with Spark)."""
    selected = [i for i in range(rows) if i % 10 != 0 and i % 3 != 0]  # active, and plan != "free"
    return len(selected), sum(1 for i in selected if i % 997 == 0)


def test_spark_pipeline_example(amqp_url: str, prefix: str, management: ManagementClient, tmp_path: Path) -> None:
    selected, failing = expected_counts(ROWS)
    assert failing == 2  # ids 997 and 1994 (0 is inactive, 2991 is on the free plan)
    env = {**os.environ, "OJS_AMQP_URL": amqp_url, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [
            sys.executable,
            "examples/spark_pipeline.py",
            "--rows",
            str(ROWS),
            "--archive",
            str(tmp_path),
            "--prefix",
            prefix,
            "--master",
            "local[2]",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("SUMMARY ")]
    summary = json.loads(line.removeprefix("SUMMARY "))

    assert summary["selected"] == selected
    assert summary["expected_failures"] == failing
    assert summary["sent"] == selected - failing
    assert summary["failed"] == failing
    assert summary["archived"] == summary["archived_distinct"] == summary["purged"] == failing
    assert summary["left"] == 0
    parquet = Path(summary["parquet"])
    assert parquet.parent == tmp_path
    pyarrow_parquet = pytest.importorskip("pyarrow.parquet")
    table = pyarrow_parquet.read_table(parquet)
    assert table.num_rows == failing
    assert sorted(json.loads(args)[0] for args in table.column("args").to_pylist()) == [997, 1994]
    # keyColumns=customer_id: the archived ids are the deterministic ids of those customers.
    example = example_module()
    unix_ms = int(parse_timestamp(example.CAMPAIGN_STARTED).timestamp() * 1000)
    assert sorted(table.column("id").to_pylist()) == sorted(key_id(example.CAMPAIGN, [c], unix_ms) for c in (997, 1994))
    # The example removed what it declared (the prefix fixture would otherwise hide a leak).
    assert management.queues(prefix + ".") == []
    assert management.exchanges(prefix + ".") == []
