"""``LocalCluster.active_controller``: the node that took the quorum's lead at the latest epoch,
read from the nodes' logs, and only while it runs; logs that are missing, garbled or binary
name no one."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from harness.local_kafka import LocalCluster

LEADER = ("[2026-12-07 02:21:45,469] INFO [RaftManager id={n}] Completed transition to Leader(localVoterNode="
          "VoterNode(voterKey=ReplicaKey(id={n}, directoryId=x), listeners=Endpoints(endpoints={{}})), epoch={e},"
          " epochStartOffset=0) (org.apache.kafka.raft.QuorumState)\n")


def cluster_with_logs(tmp_path: Path, logs: Mapping[int, str | bytes | None], running: set[int]) -> LocalCluster:
    cluster = LocalCluster.layout(tmp_path, [(9100 + 2 * k, 9101 + 2 * k) for k in range(3)])
    for node in cluster.nodes:
        node.home.mkdir(parents=True, exist_ok=True)
        log = logs.get(node.node_id)
        if isinstance(log, bytes):
            node.log_file.write_bytes(log)
        elif log is not None:
            node.log_file.write_text(log)
        if node.node_id in running:
            node.pid_file.write_text(str(os.getpid()))  # a live process stands for the node's JVM
    return cluster


def test_the_node_that_won_the_latest_epoch_is_the_controller(tmp_path: Path) -> None:
    logs = {1: LEADER.format(n=1, e=2) + "noise\n", 2: LEADER.format(n=2, e=5), 3: LEADER.format(n=3, e=4)}
    assert cluster_with_logs(tmp_path, logs, running={1, 2, 3}).active_controller() == 2


def test_a_controller_that_no_longer_runs_is_none(tmp_path: Path) -> None:
    logs = {1: LEADER.format(n=1, e=2), 2: LEADER.format(n=2, e=5)}
    assert cluster_with_logs(tmp_path, logs, running={1, 3}).active_controller() is None


def test_missing_garbled_and_binary_logs_name_no_one(tmp_path: Path) -> None:
    logs: dict[int, str | bytes | None] = {
        1: None,
        2: "Completed transition to Leader(epoch=\nCompleted transition to Leader(no epoch here)\n" * 1000,
        3: b"\x00\xff\xfe Completed transition to Leader(\xff epoch=\x00" + os.urandom(4096),
    }
    assert cluster_with_logs(tmp_path, logs, running={1, 2, 3}).active_controller() is None
