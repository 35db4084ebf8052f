"""RabbitMQ releases: 4.3 (the default) and 4.0 from cached Debian chroots, 3.10 from the host.

Each release is started for real and asked its version; the chroot cache is shown to be
reused, and a node's files to live inside its chroot and to go with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ojs_kombu.testing
from ojs_kombu.testing import BrokerError, PrivateNode
from ojs_kombu.testing.releases import DEFAULT_RELEASE, ENV_RABBITMQ, RELEASES, chroot_for, release

_PACKAGE_ROOT = Path(ojs_kombu.testing.__file__).resolve().parents[2]


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OJS_")}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", *args], env=environ, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_the_default_is_4_3_and_the_environment_chooses_another(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_RABBITMQ, raising=False)
    assert DEFAULT_RELEASE == "4.3" and release().name == "4.3"
    monkeypatch.setenv(ENV_RABBITMQ, "3.10")
    assert release().name == "3.10" and not release().in_chroot
    assert release("4.0").name == "4.0"  # an explicit choice wins over the environment


def test_an_unknown_release_is_a_broker_error_naming_the_choices() -> None:
    with pytest.raises(BrokerError, match=r"unknown RabbitMQ release '3\.13'.*4\.3, 4\.0, 3\.10"):
        PrivateNode(rabbitmq="3.13")


@pytest.mark.parametrize("name", ["4.3", "4.0", "3.10"])
def test_each_release_starts_and_reports_its_version(name: str, tmp_path: Path) -> None:
    with PrivateNode(tmp_path, rabbitmq=name) as node:
        assert node.release == name
        overview = node.management().overview()
        assert overview["rabbitmq_version"].startswith(name + ".")
        if RELEASES[name].in_chroot:
            chroot = chroot_for(RELEASES[name])
            assert overview["rabbitmq_version"] == chroot.rabbitmq
            # the node's files are inside its chroot, under the path it was given
            assert node.dir == chroot.host_path(tmp_path.absolute()) / node.short_name
            assert node.log_file.is_file()
        else:
            assert node.dir.name == node.short_name and node.log_file.is_file()
    assert not node.is_running()
    assert not node.dir.exists()


def test_a_built_chroot_is_reused_not_rebuilt() -> None:
    chosen = RELEASES[DEFAULT_RELEASE]
    first = chroot_for(chosen)
    marker = first.root / "ojs-chroot.json"
    before = marker.stat().st_mtime_ns
    began = time.monotonic()
    again = chroot_for(chosen)
    assert time.monotonic() - began < 5  # a debootstrap takes ~40 s
    assert again == first
    assert marker.stat().st_mtime_ns == before
    assert json.loads(marker.read_text())["rabbitmq"].startswith("4.3.")


def test_the_command_line_starts_a_chosen_release_finds_it_and_stops_it(tmp_path: Path) -> None:
    started = _cli("ojs_kombu.testing.broker", "start", "--rabbitmq", "4.0", "--dir", str(tmp_path))
    try:
        assert started.returncode == 0, started.stderr
        url = started.stdout.strip()
        assert url.startswith("amqp://guest:guest@127.0.0.1:")
        record = json.loads((tmp_path / "node.json").read_text())
        assert record["rabbitmq"] == "4.0"
        node = PrivateNode.from_dict(record)
        assert node.is_running()
        assert node.management().overview()["rabbitmq_version"].startswith("4.0.")
        found = _cli("ojs_kombu.testing.broker", "url", "--dir", str(tmp_path))
        assert (found.returncode, found.stdout.strip()) == (0, url)
    finally:
        stopped = _cli("ojs_kombu.testing.broker", "stop", "--dir", str(tmp_path))
    assert stopped.returncode == 0, stopped.stderr
    assert not node.is_running()
    assert not node.dir.exists()


def test_url_finds_the_node_of_a_running_run_command(tmp_path: Path) -> None:
    # `run` records its node while CMD runs, so CMD (or another shell) can ask `url` for it.
    script = (
        "import os, subprocess, sys;"
        f"done = subprocess.run([sys.executable, '-m', 'ojs_kombu.testing.broker', 'url', '--dir', {str(tmp_path)!r}],"
        " capture_output=True, text=True);"
        "sys.exit(0 if done.stdout.strip() == os.environ['OJS_AMQP_URL'] else 7)"
    )
    run = ("run", "--rabbitmq", "4.3", "--dir", str(tmp_path), "--", sys.executable, "-c", script)
    done = _cli("ojs_kombu.testing.broker", *run)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "node.json").exists()  # the record goes with the node
