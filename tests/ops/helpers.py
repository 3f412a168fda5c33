"""Helpers of the operations tests: per-test topic names and a config file for the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

from operators.contract import Topics
from ops.cpu_idle import IDLE_GROUP, CpuHierarchy, current_hierarchy
from settings import Settings


def prefixed_topics(prefix: str) -> Topics:
    base = Topics()
    return base.with_prefix(prefix)


def write_config(cfg: Settings, path: Path, *, status_topic: str | None = None) -> Path:
    """A TOML file the ``dedupctl --config`` loader reads back as ``cfg`` (the parts the
    operations commands use)."""
    lines = ["[kafka]", f"bootstrap_servers = {json.dumps(cfg.kafka.bootstrap_servers)}", "[topics]"]
    lines += [f"{role} = {json.dumps(name)}" for role, name in cfg.topics.by_role().items()]
    lines += ["[flink]", f"rest_port = {cfg.flink.rest_port}"]
    lines += ["[dedup]", f"bloom_fp_rate = {cfg.dedup.bloom_fp_rate}"]
    if status_topic is not None and hasattr(cfg, "senders"):
        lines += ["[senders]", f"status_topic = {json.dumps(status_topic)}"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def writable_cpu_hierarchy() -> CpuHierarchy | None:
    """This process's place in the cpu controller's cgroup hierarchy when it may make groups
    there (root on this machine), else None: what the CPU-idle tests need."""
    found = current_hierarchy()
    if found is None or not os.access(found.own_dir(), os.W_OK) or not (found.own_dir() / "cpu.stat").exists():
        return None
    return found


def cpu_group_of(pid: int) -> str | None:
    """The cpu controller's group of process ``pid``, relative to its hierarchy (``""``: the
    root); None when it is gone."""
    found = current_hierarchy(pid)
    return None if found is None else found.own


def idle_group_path(hierarchy: CpuHierarchy) -> str:
    """Where ``ops.cpu_idle.join_idle_group`` puts a process, as ``cpu_group_of`` says it."""
    return str(hierarchy.group(IDLE_GROUP).relative_to(hierarchy.mount))
