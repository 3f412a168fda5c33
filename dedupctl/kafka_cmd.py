"""``dedupctl kafka``: the local KRaft cluster under ``<data_dir>/kafka``, one node or N.

``start`` runs the layout the settings (or ``--brokers``) ask for; ``stop``, ``status``, ``kill``
and ``start --node`` act on the cluster whose files are there, whatever size it was started with.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from harness.local_kafka import BrokerError, LocalCluster
from settings import Settings


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def configured(cfg: Settings, brokers: int | None = None) -> LocalCluster:
    """The layout of ``kafka.local_brokers`` (or ``brokers``) nodes from ``kafka.local_port``."""
    n = brokers or cfg.kafka.local_brokers
    if n < 1:
        raise BrokerError("--brokers must be at least 1")
    return LocalCluster.layout(cfg.data_path() / "kafka", cfg.kafka.local_nodes(n))


def current(cfg: Settings, nodes: bool = False) -> LocalCluster:
    """The cluster under ``<data_dir>/kafka`` that runs; else the one of the configured size whose
    files are there; else the configured layout. ``nodes``: one of N nodes is wanted (``--node``)."""
    written = LocalCluster.written(cfg.data_path() / "kafka")
    for cluster in written:
        if cluster.running():
            return cluster
    for cluster in written:
        if cluster.size == cfg.kafka.local_brokers or (nodes and cluster.size > 1):
            return cluster
    return written[0] if written else configured(cfg)


def _show(cluster: LocalCluster) -> None:
    if cluster.size == 1:
        _out(f"kafka {cluster.nodes[0].status()}")
        return
    for node in cluster.nodes:
        _out(f"kafka node {node.node_id} {node.status()}")
    controller = cluster.active_controller()
    _out(f"kafka cluster: {len(cluster.running())} of {cluster.size} nodes running; bootstrap {cluster.bootstrap}"
         + (f"; active controller: node {controller}" if controller is not None else ""))


def _start(cfg: Settings, args: argparse.Namespace) -> int:
    if args.node is not None:
        cluster = current(cfg, nodes=True)
        cluster.start_node(args.node)
        _out(f"kafka node {args.node} {cluster.node(args.node).status()}")
        return 0
    want = configured(cfg, args.brokers)
    for other in LocalCluster.written(want.home):
        if other.size != want.size and other.running():
            raise BrokerError(f"a cluster of {other.size} node(s) runs from {want.home}: `dedupctl kafka stop` first")
        if other.size != want.size and want.size > 1 and other.size > 1:
            raise BrokerError(
                f"{want.home} holds a cluster of {other.size} nodes (node-*/), and a KRaft quorum keeps its size:"
                f" start it with --brokers {other.size}, or remove {want.home}/node-* for a new one"
            )
    want.start()
    _show(want)
    if want.size > 1 and cfg.kafka.bootstrap_servers != want.bootstrap:
        _out(f"clients bootstrap from {cfg.kafka.bootstrap_servers}: set DEDUP_KAFKA_LOCAL_BROKERS={want.size} "
             "(or kafka.bootstrap_servers) so that they reach every node")
    return 0


def cmd_kafka(cfg: Settings, args: argparse.Namespace) -> int:
    if args.action == "start":
        return _start(cfg, args)
    if args.action == "kill":
        if args.node is None:
            raise BrokerError("kill needs --node K")
        cluster = current(cfg, nodes=True)
        _out(f"kafka node {args.node} killed" if cluster.kill(args.node) else f"kafka node {args.node} was not running")
        return 0
    if args.action == "stop" and args.node is not None:
        cluster = current(cfg, nodes=True)
        was_running = cluster.stop_node(args.node)
        _out(f"kafka node {args.node} stopped" if was_running else f"kafka node {args.node} was not running")
        return 0
    if args.action == "stop":
        said = False
        for cluster in LocalCluster.written(cfg.data_path() / "kafka"):
            stopped = cluster.stop()
            if stopped:
                said = True
                nodes = ", ".join(map(str, sorted(stopped)))
                _out("kafka stopped" if cluster.size == 1 else f"kafka stopped: nodes {nodes}")
        if not said:
            _out("kafka was not running")
        return 0
    cluster = current(cfg)
    _show(cluster)
    return 0 if len(cluster.running()) == cluster.size else 3


def add_parser(sub: Any) -> None:
    p = sub.add_parser("kafka", help="the local KRaft broker, or a cluster of N on loopback")
    p.add_argument("action", choices=["start", "stop", "status", "kill"])
    p.add_argument("--brokers", type=int, metavar="N",
                   help="start: nodes of the cluster (default: kafka.local_brokers, 1); 3 gives RF 3, min ISR 2")
    p.add_argument("--node", type=int, metavar="K",
                   help="start, stop or kill (SIGKILL) only node K of the cluster (from 1)")
    p.set_defaults(func=cmd_kafka)
