"""Helpers of the operations tests: per-test topic names and a config file for the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from operators.contract import Topics
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
