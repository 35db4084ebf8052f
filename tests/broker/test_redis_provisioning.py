"""The Redis provisioning helpers (``tools.redis``), checked against real ``redis-server``s.

No RabbitMQ is needed; each private server starts in a fraction of a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from support import wait_until

import ojs_kombu.testing
from tools.redis import PrivateRedis, RedisServerError, ping, provision_redis, server_pid

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateRedis]:
    try:
        private = PrivateRedis(tmp_path)
    except RedisServerError as exc:
        pytest.skip(str(exc))
    with private:
        yield private


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5)


def test_redis_is_the_repositorys_tooling_not_the_packages() -> None:
    """``ojs_kombu.testing`` provisions RabbitMQ only (DESIGN §22): Redis is ``tools.redis``'s."""
    assert "provision_redis" not in ojs_kombu.testing.__all__
    assert not hasattr(ojs_kombu.testing, "PrivateRedis")
    assert issubclass(RedisServerError, RuntimeError)


def test_external_server_is_used_as_given(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OJS_REDIS_URL", "redis://:s3cret@redis.example:6380/3")
    with provision_redis(tmp_path) as url:
        assert url == "redis://:s3cret@redis.example:6380/3"
    assert list(tmp_path.iterdir()) == []  # nothing was started


def test_private_server_is_ours_and_persists_nothing(server: PrivateRedis) -> None:
    assert server.url == f"redis://127.0.0.1:{server.port}/0" and server.port != 6379
    client = _client(server.url)
    assert client.ping()
    assert client.config_get("save") == {"save": ""}
    assert client.config_get("appendonly") == {"appendonly": "no"}
    assert client.config_get("bind") == {"bind": "127.0.0.1"}
    assert client.config_get("dir") == {"dir": str(server.dir)}
    client.set("k", "v")
    assert client.get("k") == b"v"
    client.close()


def test_stopping_one_server_leaves_another_running(server: PrivateRedis, tmp_path: Path) -> None:
    other = PrivateRedis(tmp_path / "other")
    other.start()
    assert other.port != server.port and other.dir != server.dir
    other.cleanup()
    assert not other.is_running() and not other.dir.exists()
    assert not ping(other.host, other.port)
    assert server.is_running() and ping(server.host, server.port)


def test_a_port_taken_meanwhile_is_not_mistaken_for_ours(server: PrivateRedis, tmp_path: Path) -> None:
    late = PrivateRedis(tmp_path / "late")
    late.port = server.port  # as if another server had bound it after `late` chose it
    with late:
        assert late.port != server.port
        assert server_pid(late.host, late.port) == late.pid != server.pid
    assert server.is_running() and server_pid(server.host, server.port) == server.pid


def test_stop_never_signals_a_process_it_did_not_start(server: PrivateRedis) -> None:
    # A stale record whose pid now belongs to an unrelated process.
    stranger = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        stale = PrivateRedis.from_dict({**server.to_dict(), "pid": stranger.pid})
        assert not stale.is_running()
        stale.stop()
        assert stranger.poll() is None
    finally:
        stranger.communicate(b"")
    assert server.is_running()


def test_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv (util-linux): the server would outlive a killed parent")
    script = (
        "import sys; from tools.redis import PrivateRedis; s = PrivateRedis(sys.argv[1]); "
        "s.start(); print(s.port, flush=True); sys.stdin.read()"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=ROOT,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        line = parent.stdout.readline()  # type: ignore[union-attr]
        if not line:
            pytest.skip("redis-server is not available")
        port = int(line)
        assert ping("127.0.0.1", port)
    finally:
        parent.kill()  # no cleanup runs
        parent.wait()
    wait_until(lambda: not ping("127.0.0.1", port), timeout=10, message="the orphaned server to exit")


def test_server_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    try:
        broken = PrivateRedis(tmp_path)
    except RedisServerError as exc:
        pytest.skip(str(exc))
    broken._command = lambda: [broken._server, "--no-such-option", "1"]  # type: ignore[method-assign]
    with pytest.raises(RedisServerError, match=r"(?s)exited with code.*no-such-option"):
        broken.start()
    assert not broken.is_running()
    broken.cleanup()


def test_command_line_start_url_stop(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tools.redis", *args, "--dir", str(tmp_path)],
            cwd=ROOT,
            env={**os.environ, "OJS_REDIS_URL": ""},
            capture_output=True,
            text=True,
            timeout=60,
        )

    started = cli("start")
    if started.returncode != 0 and "not installed" in started.stderr:
        pytest.skip(started.stderr.strip())
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    try:
        assert cli("url").stdout.strip() == url
        assert _client(url).ping()
    finally:
        stopped = cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert cli("url").returncode == 1
    assert list(tmp_path.iterdir()) == []
