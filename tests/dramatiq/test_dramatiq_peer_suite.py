"""Dramatiq's own test suite, run against OjsBroker.

The sdist of the installed Dramatiq is downloaded at test time (``pip download``,
cached under ``.cache/dramatiq-peer/``) and its ``tests/`` are extracted next to
two files of ours, ``peer/conftest_ojs.py`` (as ``conftest.py``: the broker
fixtures become OjsBroker) and ``peer/common_ojs.py`` (as ``common.py``).
Nothing of Dramatiq's is copied into this repository.  ``EXCLUDED`` lists every
test that does not run, and why; the README ("Migrating a Dramatiq project") repeats it.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "dramatiq-peer"
PEER = Path(__file__).parent / "peer"
VERSION = importlib.metadata.version("dramatiq")

#: test_rabbitmq.py runs whole, minus the tests of RabbitmqBroker's own internals.
RABBITMQ_FILES = ["tests/test_rabbitmq.py"]
#: The broker-independent files (they are written against ``stub_broker``).
GENERIC_FILES = [
    "tests/test_actors.py",
    "tests/test_callbacks.py",
    "tests/test_composition.py",
    "tests/test_messages.py",
    "tests/test_worker.py",
    "tests/test_generic_actors.py",
    "tests/test_results.py",
    "tests/test_broker.py",
    "tests/test_encoders.py",
]

_PIKA = "uses RabbitmqBroker's pika connection/channel attributes"
#: Test id -> why it does not run against OjsBroker.
EXCLUDED = {
    "tests/test_rabbitmq.py::test_rabbitmq_broker_stops_retrying_declaring_queues_when_max_attempts_reached": "patches RabbitmqBroker._declare_queue (pika internals)",
    "tests/test_rabbitmq.py::test_rabbitmq_broker_retries_declaring_queues_when_connection_related_errors_occur": "patches RabbitmqBroker._declare_queue (pika internals)",
    "tests/test_rabbitmq.py::test_rabbitmq_broker_reconnects_after_enqueue_failure": _PIKA
    + "; tests/dramatiq/test_dramatiq_resilience.py covers a closed publisher connection",
    "tests/test_rabbitmq.py::test_rabbitmq_connections_can_be_deleted_multiple_times": _PIKA,
    "tests/test_rabbitmq.py::test_rabbitmq_channels_can_be_deleted_multiple_times": _PIKA,
    "tests/test_rabbitmq.py::test_rabbitmq_broker_consuming_messages_re_declares_queues_when_declared_queue_disappears": _PIKA
    + "; tests/dramatiq/test_dramatiq_resilience.py covers a deleted queue (consumer side)",
    "tests/test_rabbitmq.py::test_rabbitmq_broker_enqueueing_message_re_declares_queues_when_declared_queue_disappears": _PIKA
    + "; tests/dramatiq/test_dramatiq_resilience.py covers a deleted queue (enqueue side)",
    "tests/test_rabbitmq.py::test_rabbitmq_workers_handle_rabbit_failures_gracefully": "runs `rabbitmqctl stop_app` on the default node: never against a shared broker",
    "tests/test_rabbitmq.py::test_rabbitmq_messages_that_failed_to_decode_are_rejected": "swaps the global Dramatiq encoder; OjsBroker always writes OJS envelopes (invalid envelopes are "
    "dead-lettered with x-ojs-error-code, see test_dramatiq_worker.py)",
    "tests/test_actors.py::test_actors_can_be_sent_messages": "reads StubBroker.queues[name] (an in-memory Queue)",
    "tests/test_actors.py::test_worker_handles_non_numeric_eta_and_logs_warning": "puts raw messages with an eta on StubBroker.queues[name]; OjsBroker never delivers an eta",
    "tests/test_actors.py::test_worker_handles_none_eta": "puts raw messages with an eta on StubBroker.queues[name]; OjsBroker never delivers an eta",
    "tests/test_worker.py::test_exception_from_actor_doesnt_leak": "our stub_broker keeps the exceptions of dead letters for join(fail_fast=True), as StubBroker's docs promise",
    "tests/test_results.py::test_messages_without_actor_not_crashing_lookup_options": "needs a Redis server",
}


def _sdist() -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    archive = CACHE / f"dramatiq-{VERSION}.tar.gz"
    if not archive.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-binary",
                ":all:",
                "--no-deps",
                f"dramatiq=={VERSION}",
                "-d",
                str(CACHE),
            ],
            check=True,
            timeout=300,
        )
    return archive


@pytest.fixture(scope="module")
def suite() -> Path:
    """Dramatiq's tests of the installed version, with our conftest.py and common.py beside them."""
    run = CACHE / f"run-{VERSION}"
    shutil.rmtree(run, ignore_errors=True)
    tests = run / "tests"
    tests.mkdir(parents=True)
    prefix = f"dramatiq-{VERSION}/tests/"
    with tarfile.open(_sdist()) as archive:
        for member in archive.getmembers():
            if (
                member.isfile()
                and member.name.startswith(prefix)
                and member.name.endswith(".py")
                and "/" not in member.name[len(prefix) :]
            ):
                (tests / member.name[len(prefix) :]).write_bytes(archive.extractfile(member).read())
    (tests / "__init__.py").write_text("")
    shutil.copy(PEER / "conftest_ojs.py", tests / "conftest.py")
    shutil.copy(PEER / "common_ojs.py", tests / "common.py")
    return run


def _run(suite: Path, files: list[str], broker, tmp_path: Path) -> dict[str, list[str]]:
    report = tmp_path / "junit.xml"
    deselect = [arg for test in EXCLUDED if test.split("::")[0] in files for arg in ("--deselect", test)]
    env = {**os.environ, **broker.env()}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "-o",
            "timeout=90",
            "--rootdir",
            str(suite),
            f"--junitxml={report}",
            *deselect,
            *files,
        ],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    outcomes: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kind = (
            "failed"
            if case.find("failure") is not None or case.find("error") is not None
            else "skipped"
            if case.find("skipped") is not None
            else "passed"
        )
        outcomes[kind].append(name)
    assert not outcomes["failed"], f"{outcomes['failed']}\n{result.stdout[-6000:]}"
    assert result.returncode == 0, result.stdout[-6000:]
    return outcomes


@pytest.mark.timeout(900)
def test_dramatiq_rabbitmq_tests_pass_on_ojs_broker(suite, broker, tmp_path):
    outcomes = _run(suite, RABBITMQ_FILES, broker, tmp_path)
    assert len(outcomes["passed"]) >= 15, outcomes


@pytest.mark.timeout(900)
def test_dramatiq_generic_tests_pass_on_ojs_broker(suite, broker, tmp_path):
    outcomes = _run(suite, GENERIC_FILES, broker, tmp_path)
    assert len(outcomes["passed"]) >= 93, outcomes
