"""Serving the dashboard with uvicorn: in the foreground (the CLI) or in a thread (the tests)."""

from __future__ import annotations

import threading
import time

import uvicorn
from starlette.applications import Starlette


class DashboardServer:
    """uvicorn serving ``app`` on ``host:port`` (port 0: a free one, see :attr:`port`).

    Parameters:
        app: the application (:func:`~ojs_kombu.dashboard.app.create_app`).
        host: the interface; 127.0.0.1 by default, so that only this machine reaches it.
        port: the TCP port, 0 for any free one.
    """

    def __init__(self, app: Starlette, *, host: str = "127.0.0.1", port: int = 8787) -> None:
        # access_log off: a ?token= query would otherwise be written to the log
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (once started)."""
        servers = getattr(self._server, "servers", None) or []
        for server in servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return int(self._server.config.port)

    def run(self) -> None:
        """Serve in the foreground until SIGINT / SIGTERM."""
        self._server.run()

    def start(self, timeout: float = 10.0) -> DashboardServer:
        """Serve in a daemon thread; returns once it accepts connections.

        Raises:
            RuntimeError: it did not start within ``timeout`` seconds.
        """
        self._thread = threading.Thread(target=self._server.run, name="ojs-dashboard", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the dashboard server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Stop serving and wait for the thread."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
