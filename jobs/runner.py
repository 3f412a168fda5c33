"""Run the job on the local mini-cluster, find retained state, stop it through the REST API."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from operators.metric_names import JOB_NAME
from ops.flink_rest import JobControlError
from settings import Settings

logger = logging.getLogger(__name__)


def latest_snapshot(checkpoint_dir: Path) -> Path | None:
    """The newest complete retained checkpoint or savepoint under ``checkpoint_dir``.

    Flink writes ``<dir>/<job-id>/chk-<n>/_metadata`` for checkpoints and
    ``<dir>/savepoint-<id>/_metadata`` for savepoints; ``_metadata`` is written last.
    """
    if not checkpoint_dir.is_dir():
        return None
    candidates = [*checkpoint_dir.glob("*/chk-*/_metadata"), *checkpoint_dir.glob("savepoint-*/_metadata")]
    if not candidates:
        return None
    return max(candidates, key=lambda p: p.stat().st_mtime_ns).parent


def resolve_resume(resume: str | None, cfg: Settings) -> str | None:
    """``latest`` -> the newest retained snapshot (None: fresh start); a path -> itself."""
    if resume is None:
        return None
    if resume == "latest":
        found = latest_snapshot(cfg.flink.checkpoint_path())
        return str(found) if found else None
    path = Path(resume)
    if not (path / "_metadata").exists() and not path.name == "_metadata":
        raise JobControlError(f"{resume} holds no _metadata: not a checkpoint or savepoint")
    return str(path.resolve())


def run_job(cfg: Settings, resume_from: str | None = None, detached: bool = False) -> Any:
    """Build the job and execute it; blocks until it ends unless ``detached`` (then: JobClient)."""
    from jobs.dedup_job import build_pipeline, create_environment

    env = create_environment(cfg, resume_from)
    build_pipeline(env, cfg)
    if detached:
        return env.execute_async(JOB_NAME)
    return env.execute(JOB_NAME)
