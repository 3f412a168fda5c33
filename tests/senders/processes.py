"""``dedupctl senders run`` as a separate process (to SIGKILL), configured through DEDUP_* only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pydantic import SecretStr

from settings import REPO_ROOT, Settings


def sender_env(cfg: Settings, **senders: str) -> dict[str, str]:
    """The configuration as DEDUP_* variables, for a worker process; ``senders`` overrides."""
    env = dict(os.environ)
    env["DEDUP_KAFKA_BOOTSTRAP_SERVERS"] = cfg.kafka.bootstrap_servers
    env["DEDUP_KAFKA_PARTITIONS"] = str(cfg.kafka.partitions)
    env["DEDUP_TOPICS_EMAIL"] = cfg.topics.email
    env["DEDUP_TOPICS_EMAIL_PRIORITY"] = cfg.topics.email_priority
    for name, value in vars(cfg.senders).items():
        if value is not None:
            text = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
            env[f"DEDUP_SENDERS_{name.upper()}"] = text
    env.update({f"DEDUP_SENDERS_{k.upper()}": v for k, v in senders.items()})
    return env


def start_sender(cfg: Settings, log: Path, *args: str, **senders: str) -> subprocess.Popen[bytes]:
    """``senders run --channel email --lane normal`` (or ``args``), output appended to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dedupctl.cli",
                "senders",
                "run",
                *(args or ("--channel", "email", "--lane", "normal")),
                "--max-seconds",
                "120",
            ],
            cwd=REPO_ROOT,
            env=sender_env(cfg, **senders),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
