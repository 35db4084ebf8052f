"""A local RabbitMQ cluster of private nodes, for tests and demos (DESIGN §16).

``N`` :class:`~ojs_kombu.testing.broker.PrivateNode` s on loopback, each with its own node
name (``ojs-<id>-<i>@localhost``), AMQP / distribution / management ports and data
directory, sharing one private epmd port and one Erlang cookie, joined into one cluster
(``rabbitmqctl stop_app / join_cluster <first node> / start_app``).  No other broker on
the machine is touched: every ``rabbitmqctl`` call names its node and uses the private epmd.

Command line::

    python -m ojs_kombu.testing.cluster start [--nodes 3] [--rabbitmq 4.3] [--dir D]  # prints the URLs
    python -m ojs_kombu.testing.cluster urls  [--dir D]  # one AMQP URL per node, then management
    python -m ojs_kombu.testing.cluster url   [--dir D]  # kombu's failover form "a;b;c"
    python -m ojs_kombu.testing.cluster stop  [--dir D]  # stops the nodes, deletes their files
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from ojs_kombu.amqp.management import ManagementClient, ManagementError

from ._servers import ServerCommands, free_ports
from .broker import BrokerError, PrivateNode, _default_base_dir, add_release_option, ensure_rabbitmq_installed

__all__ = ["Cluster", "main"]

log = logging.getLogger("ojs_kombu.testing.cluster")

STATE_FILE = "cluster.json"
DEFAULT_NODES = 3
_POLL = 0.2
#: The cookie :meth:`Cluster.isolate` sets for the other nodes: not theirs, so neither side reconnects.
_ISOLATION_COOKIE = "ojs_isolated"

_T = TypeVar("_T")


def _await(condition: Callable[[], bool], timeout: float, what: str, interval: float = _POLL) -> None:
    """Poll ``condition`` until it holds; :class:`BrokerError` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise BrokerError(f"timed out after {max(0.0, timeout):.0f}s waiting for {what}")
        time.sleep(interval)


def _each(nodes: Sequence[PrivateNode], action: Callable[[PrivateNode], _T]) -> list[_T]:
    """``action`` on every node at once (threads: the work is waiting on subprocesses)."""
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        return list(pool.map(action, nodes))


class Cluster:
    """A RabbitMQ cluster of ``nodes`` private nodes on 127.0.0.1.

    Use it as a context manager (start, then :meth:`cleanup`) or call :meth:`start` /
    :meth:`cleanup`.  :meth:`kill` and :meth:`restart` act on one node, for failover tests;
    :meth:`isolate` and :meth:`heal` partition one node off the others and back.
    The user is ``guest``/``guest`` on vhost ``/`` on every node.

    Parameters:
        nodes: how many nodes (at least 1).
        base_dir: parent of the nodes' directories (default ``<cwd>/.cache/rabbitmq``).
        rabbitmq: the release every node runs (default ``$OJS_RABBITMQ``, else 4.3).

    Raises:
        BrokerError: ``nodes`` < 1, or RabbitMQ is not installed and cannot be.
    """

    def __init__(
        self,
        nodes: int = DEFAULT_NODES,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        rabbitmq: str | None = None,
    ):
        if nodes < 1:
            raise BrokerError(f"a cluster needs at least one node, not {nodes}")
        ensure_rabbitmq_installed(rabbitmq)
        self.cluster_id = secrets.token_hex(3)
        self.cookie = secrets.token_hex(16)
        self.epmd_port = free_ports(1)[0]
        self.nodes: list[PrivateNode] = []
        taken = {self.epmd_port}
        while len(self.nodes) < nodes:
            node = PrivateNode(
                base_dir,
                node_name=f"ojs-{self.cluster_id}-{len(self.nodes) + 1}@localhost",
                epmd_port=self.epmd_port,
                cookie=self.cookie,
                rabbitmq=rabbitmq,
            )
            ports = {node.amqp_port, node.dist_port, node.management_port}
            if ports & taken:  # free_ports() calls apart may hand out a port twice
                continue
            taken |= ports
            self.nodes.append(node)

    # -- identity ---------------------------------------------------------

    @property
    def name(self) -> str:
        """The cluster's name: its first node's name (``rabbitmqctl cluster_status`` shows it)."""
        return self.nodes[0].name

    @property
    def release(self) -> str:
        """The RabbitMQ release its nodes run (``"4.3"``, ``"4.0"``, ``"3.10"``)."""
        return self.nodes[0].release

    @property
    def urls(self) -> list[str]:
        """One AMQP URL per node, in node order."""
        return [node.url for node in self.nodes]

    @property
    def url(self) -> str:
        """All nodes' AMQP URLs in kombu's failover form ``a;b;c``."""
        return ";".join(self.urls)

    @property
    def management_url(self) -> str:
        """The management API of the first node (it reports on the whole cluster)."""
        return self.nodes[0].management_url

    def management(self, node: PrivateNode | None = None) -> ManagementClient:
        """A :class:`ManagementClient` for ``node`` (default: the first node)."""
        return (node or self.nodes[0]).management()

    def node(self, name: str) -> PrivateNode:
        """The node called ``name`` (``ojs-…@localhost``).

        Raises:
            KeyError: no node of this cluster has that name.
        """
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def __repr__(self) -> str:
        return f"Cluster({[node.name for node in self.nodes]!r}, management_url={self.management_url!r})"

    # -- state file (used by the CLI) -------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Everything needed to find this cluster again (see :meth:`from_dict`)."""
        return {
            "cluster_id": self.cluster_id,
            "epmd_port": self.epmd_port,
            "urls": self.urls,
            "management_url": self.management_url,
            "nodes": [node.to_dict() for node in self.nodes],
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Cluster:
        """The cluster described by ``state`` (from :meth:`to_dict`), without starting anything."""
        cluster = cls.__new__(cls)
        cluster.cluster_id = state["cluster_id"]
        cluster.epmd_port = state["epmd_port"]
        cluster.nodes = [PrivateNode.from_dict(node) for node in state["nodes"]]
        cluster.cookie = cluster.nodes[0].cookie or ""
        return cluster

    # -- lifecycle --------------------------------------------------------

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cleanup()

    def is_running(self) -> bool:
        """Whether every node's Erlang VM is alive."""
        return all(node.is_running() for node in self.nodes)

    def start(self, timeout: float = 180) -> None:
        """Start every node (in parallel), join them to the first one by one, wait for the formed cluster.

        Formed means: the first node's management API lists every node as running.  Nodes
        already running are left as they are (a restarted member rejoins by itself).

        Parameters:
            timeout: seconds for the whole start-up.

        Raises:
            BrokerError: a node failed to start or join, or the cluster did not form in time;
                every node is stopped then (their files are kept for the logs).
        """
        began = time.monotonic()
        deadline = began + timeout
        try:
            _each(self.nodes, lambda node: node.start(timeout=timeout))
            first = self.nodes[0]
            joined = set(self._running_members())
            # One join at a time.  Joined at once (~20 s instead of ~29 s for 3 nodes), a joining node's
            # mnesia could crash while another node joined (`start_app` failed with
            # `{badmatch, {error, {normal, {mnesia_app, start, ...}}}}`: seen in CI; upstream
            # rabbitmq-server#15502 describes the same race of parallel start-ups).
            for node in self.nodes[1:]:
                if node.name not in joined:
                    self._join(node, first, deadline)
            self._wait_formed(deadline)
        except BaseException:
            self.stop()
            raise
        log.info(
            "RabbitMQ cluster of %d nodes (%s) formed in %.1fs; management %s",
            len(self.nodes),
            ", ".join(node.name for node in self.nodes),
            time.monotonic() - began,
            self.management_url,
        )

    def stop(self) -> None:
        """Stop every node (in parallel) and the cluster's epmd; data stays on disk."""
        _each(self.nodes, lambda node: node.stop())
        # Each node's stop leaves the shared epmd alone while other nodes are registered with it.
        self.nodes[0]._stop_epmd()

    def cleanup(self) -> None:
        """Stop every node and delete their directories."""
        self.stop()
        for node in self.nodes:
            shutil.rmtree(node.dir, ignore_errors=True)

    def kill(self, node: PrivateNode) -> None:
        """SIGKILL ``node``'s Erlang VM (a crash, for failover tests); see :meth:`restart`.

        Raises:
            BrokerError: the VM survived.
        """
        log.info("killing RabbitMQ node %s", node.name)
        node.kill()

    def restart(self, node: PrivateNode, timeout: float = 90) -> None:
        """Start ``node`` again (stopping it first if it runs) and wait until the cluster is whole.

        Its data (cluster membership included) is kept, so it rejoins by itself.

        Raises:
            BrokerError: it did not start or rejoin within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        node.restart(timeout=timeout)
        self._wait_formed(deadline)

    # -- partitions -------------------------------------------------------

    def isolate(self, node: PrivateNode, timeout: float = 30) -> None:
        """Cut ``node`` off from the other nodes (a network partition); it keeps serving its clients.

        At the Erlang distribution level: its cookie for each other node becomes a wrong one, so
        that neither side can reconnect, and its connections to them are closed.  Returns once
        another node sees it down.  :meth:`heal` undoes it.

        Parameters:
            node: one of this cluster's nodes (not its only one).
            timeout: seconds for the others to see it down.

        Raises:
            BrokerError: ``rabbitmqctl eval`` failed, or the others did not see it down in time.
        """
        others = self._others(node)
        self._eval(
            node,
            f"[erlang:set_cookie(N, {_ISOLATION_COOKIE}) || N <- [{others}]], "
            f"[erlang:disconnect_node(N) || N <- [{others}]], ok.",
        )
        majority = next(other for other in self.nodes if other is not node)
        _await(
            lambda: node.name not in self._running_members(majority),
            timeout,
            f"the other nodes to see {node.name} down",
        )
        log.info("isolated RabbitMQ node %s from the rest of the cluster", node.name)

    def heal(self, node: PrivateNode, timeout: float = 150) -> None:
        """Undo :meth:`isolate`: ``node`` reconnects to the others.

        Returns once every node sees every node running and, with Khepri (:meth:`khepri_enabled`),
        once ``node`` commits metadata again: after a partition with writes pending on it (a
        client's declarations), its metadata writes still time out for a while after the cluster
        looks whole (tens of seconds on RabbitMQ 4.3).

        Parameters:
            node: the node :meth:`isolate` cut off.
            timeout: seconds for the whole.

        Raises:
            BrokerError: ``rabbitmqctl eval`` failed, or the cluster was not whole (or the node
                not committing) in time.
        """
        deadline = time.monotonic() + timeout
        others = self._others(node)
        self._eval(
            node,
            f"[erlang:set_cookie(N, erlang:get_cookie()) || N <- [{others}]], [net_adm:ping(N) || N <- [{others}]].",
        )
        names = {each.name for each in self.nodes}
        _await(
            lambda: all(set(self._running_members(each)) == names for each in self.nodes),
            deadline - time.monotonic(),
            "the cluster whole again",
        )
        whole_at = time.monotonic()
        if self.khepri_enabled(node):
            _await(
                lambda: self._commits_metadata(node),
                deadline - time.monotonic(),
                f"{node.name} to commit metadata again",
                interval=1.0,
            )
        log.info(
            "healed RabbitMQ node %s: it commits metadata %.1fs after the cluster looked whole",
            node.name,
            time.monotonic() - whole_at,
        )

    def khepri_enabled(self, node: PrivateNode | None = None) -> bool:
        """Whether the cluster keeps its metadata in Khepri (feature flag ``khepri_db`` enabled), as
        ``node`` (default: the first) reports it: RabbitMQ 4.3 always, 4.0 when enabled, 3.10 never.

        Raises:
            ManagementError: the node's management API did not answer.
        """
        flags = self.management(node).request("GET", "/api/feature-flags") or []
        return any(flag.get("name") == "khepri_db" and flag.get("state") == "enabled" for flag in flags)

    # -- internals --------------------------------------------------------

    def _others(self, node: PrivateNode) -> str:
        """The other nodes' names as an Erlang list's elements (``'a@localhost', 'b@localhost'``)."""
        return ", ".join(f"'{other.name}'" for other in self.nodes if other is not node)

    @staticmethod
    def _eval(node: PrivateNode, expression: str) -> None:
        done = node.ctl("eval", expression)
        if done is None or done.returncode != 0:
            output = "timed out" if done is None else (done.stdout + done.stderr).strip()
            raise BrokerError(f"`rabbitmqctl -n {node.name} eval` failed: {output}")

    @staticmethod
    def _commits_metadata(node: PrivateNode) -> bool:
        """Whether a metadata write through ``node`` is committed within 2 s (a Khepri put of a key of our own)."""
        done = node.ctl("eval", "khepri:put(rabbitmq_metadata, [ojs_probe], 1, #{timeout => 2000}).", timeout=20)
        return done is not None and done.returncode == 0 and done.stdout.strip() == "ok"

    def _running_members(self, node: PrivateNode | None = None) -> list[str]:
        """Names of the running nodes ``node``'s (default: the first node's) management API lists
        (``[]`` on error)."""
        try:
            listed = self.management(node).request("GET", "/api/nodes?columns=name,running")
        except ManagementError:
            return []
        return [entry["name"] for entry in listed or [] if entry.get("running")]

    def _join(self, node: PrivateNode, first: PrivateNode, deadline: float) -> None:
        for args in (("stop_app",), ("join_cluster", first.name), ("start_app",)):
            done = node.ctl(*args, timeout=max(10.0, deadline - time.monotonic()))
            if done is None or done.returncode != 0:
                output = "timed out" if done is None else (done.stdout + done.stderr).strip()
                raise BrokerError(f"`rabbitmqctl -n {node.name} {' '.join(args)}` failed: {output}")

    def _wait_formed(self, deadline: float) -> None:
        expected = {node.name for node in self.nodes}
        while True:
            running = set(self._running_members())
            if running == expected:
                return
            if time.monotonic() >= deadline:
                raise BrokerError(f"the cluster did not form: running {sorted(running)}, expected {sorted(expected)}")
            time.sleep(_POLL)


# -- command line ------------------------------------------------------------


def _print_urls(cluster: Cluster) -> None:
    print("\n".join([*cluster.urls, cluster.management_url]))


def _install(args: argparse.Namespace) -> int:
    for name in args.rabbitmq or [None]:
        ensure_rabbitmq_installed(name)
    return 0


def _commands() -> ServerCommands:
    """The stop / url / install commands, shared with :mod:`.broker`'s command line."""
    return ServerCommands(
        prog="python -m ojs_kombu.testing.cluster",
        what="RabbitMQ cluster",
        state_file=STATE_FILE,
        default_dir=_default_base_dir,
        create=lambda directory, args: Cluster(DEFAULT_NODES, directory, rabbitmq=args.rabbitmq),
        load=Cluster.from_dict,
        install=_install,
        install_help="install RabbitMQ (a chroot, or apt for 3.10)",
        error=BrokerError,
        log=log,
    )


def _recorded(args: argparse.Namespace) -> tuple[Path, Cluster | None]:
    state_path = _commands().state_path(args.dir)
    cluster = _commands().recorded(state_path)
    return state_path, cluster if isinstance(cluster, Cluster) else None


def _cmd_start(args: argparse.Namespace) -> int:
    state_path, cluster = _recorded(args)
    if cluster is not None and cluster.is_running():
        log.info("RabbitMQ cluster %s recorded in %s is already running", cluster.name, state_path)
    else:
        cluster = Cluster(args.nodes, state_path.parent, rabbitmq=args.rabbitmq)
        cluster.start()
        state_path.parent.mkdir(parents=True, exist_ok=True)
        state_path.write_text(json.dumps(cluster.to_dict(), indent=2) + "\n")
    _print_urls(cluster)
    return 0


def _cmd_urls(args: argparse.Namespace) -> int:
    state_path, cluster = _recorded(args)
    if cluster is None or not cluster.is_running():
        log.error("no running RabbitMQ cluster recorded in %s (run `start` first)", state_path)
        return 1
    _print_urls(cluster)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m ojs_kombu.testing.cluster``; returns the exit status.

    ``start`` and ``urls`` print one AMQP URL per node, one per line, then the management URL.
    """
    commands = _commands()
    handlers: dict[str, tuple[str, Callable[[argparse.Namespace], int]]] = {
        "start": ("start the cluster in the background (unless the recorded one runs); print its URLs", _cmd_start),
        "urls": (f"print the URLs of the cluster recorded in {STATE_FILE}", _cmd_urls),
        "url": (f"print the failover URL (a;b;c) of the cluster recorded in {STATE_FILE}", commands.url),
        "stop": (f"stop the cluster recorded in {STATE_FILE} and delete its files", commands.stop),
        "install": ("install RabbitMQ (a chroot, or apt for 3.10)", commands.install),
    }
    parser = argparse.ArgumentParser(prog=commands.prog, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    for action, (help_text, _handler) in handlers.items():
        command = sub.add_parser(action, help=help_text)
        command.add_argument("--dir", help=f"directory for the nodes and {STATE_FILE} (default: {_default_base_dir()})")
        if action == "start":
            command.add_argument("--nodes", type=int, default=DEFAULT_NODES, help="how many nodes (default 3)")
        add_release_option(action, command)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    try:
        return handlers[args.action][1](args)
    except BrokerError as exc:
        log.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
