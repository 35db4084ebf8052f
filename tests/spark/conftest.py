"""One SparkSession for the whole test session: ``local[2,4]`` (2 cores, a task may fail 4 times), UI off."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")

from pyspark.sql import SparkSession

from ojs_kombu.spark import register


@pytest.fixture(scope="session")
def spark(amqp_url: str) -> Iterator[SparkSession]:
    """The session's SparkSession, with the ``ojs`` data source registered; stopped at the end.

    ``$OJS_AMQP_URL`` (the data source's default ``url``) is the test broker while it runs, and the
    environment is restored afterwards."""
    settings = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, "OJS_AMQP_URL": amqp_url}
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("ojs_kombu tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
