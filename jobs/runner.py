"""Run the job on the local mini-cluster, safely: where to start from, and what may not be started.

The rules of ``dedupctl run``:

- A checkpoint directory with retained checkpoints is resumed from its latest snapshot unless
  ``--fresh`` is given: starting with empty state over it would accept again every key still
  inside its window. Savepoints taken with ``dedupctl stop --savepoint DIR`` count too: stop
  records them in the checkpoint directory (``_savepoints``).
- The settings that decide what the state means (:data:`STATE_SETTINGS`) are written next to the
  state (``_state.json`` in the checkpoint directory, copied into every savepoint stop takes); a
  restore with other values is refused, naming the setting.
- One job per checkpoint directory: a second ``dedupctl run`` on it refuses to start while the
  first holds its lock (an advisory lock the kernel drops with the process, SIGKILL included).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from operators.metric_names import JOB_NAME
from ops.flink_rest import JobControlError
from settings import Settings

logger = logging.getLogger(__name__)

#: beside the state: the settings it was written with
STATE_FILE = "_state.json"
#: in the checkpoint directory: savepoints taken by ``dedupctl stop --savepoint``, one per line
SAVEPOINTS_FILE = "_savepoints"
LOCK_FILE = ".lock"


def state_settings(cfg: Settings) -> dict[str, object]:
    """The settings that decide what the job's state means: a restore must not change them.

    dedup.shards maps dedup keys to the shards their state lives in; flink.max_parallelism fixes
    the key groups; a savepoint of one PyFlink execution mode restored in the other came back
    empty (pyflink field notes); the sink's transactions in the state are named by
    flink.transaction_naming (see ALLOWED_CHANGES).
    """
    return {
        "dedup.shards": cfg.dedup.shards,
        "flink.max_parallelism": cfg.flink.max_parallelism,
        "flink.execution_mode": cfg.flink.execution_mode,
        "flink.transaction_naming": cfg.flink.transaction_naming,
    }


#: changes of a state setting a restore may make: (setting, from, to). The Kafka connector takes
#: over transactions named by ``incrementing`` under ``pooling``, not the other way
ALLOWED_CHANGES = {("flink.transaction_naming", "incrementing", "pooling")}


def _snapshots_in(directory: Path) -> list[Path]:
    """``<dir>/<job-id>/chk-<n>`` and ``<dir>/savepoint-*`` with their ``_metadata`` (written last)."""
    found = [*directory.glob("*/chk-*/_metadata"), *directory.glob("savepoint-*/_metadata")]
    return [p.parent for p in found]


def recorded_savepoints(checkpoint_dir: Path) -> list[Path]:
    """The savepoints ``dedupctl stop`` recorded for this checkpoint directory (those still there)."""
    try:
        lines = (checkpoint_dir / SAVEPOINTS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    return [Path(line) for line in lines if line.strip() and (Path(line) / "_metadata").is_file()]


def latest_snapshot(checkpoint_dir: Path) -> Path | None:
    """The newest complete retained checkpoint or savepoint of ``checkpoint_dir``: its own
    checkpoints and savepoints, and the savepoints stop recorded for it elsewhere."""
    if not checkpoint_dir.is_dir():
        return None
    candidates = [*_snapshots_in(checkpoint_dir), *recorded_savepoints(checkpoint_dir)]
    if not candidates:
        return None
    return max(candidates, key=lambda p: (p / "_metadata").stat().st_mtime_ns)


def resolve_start(cfg: Settings, resume: str | None, *, fresh: bool = False) -> str | None:
    """Where ``dedupctl run`` starts: None for empty state.

    ``resume`` is None or ``latest`` (the newest snapshot of the checkpoint directory, if any) or
    a path; ``fresh`` starts empty even over retained checkpoints.
    """
    if fresh and resume:
        raise JobControlError("--fresh starts with empty state: it cannot be combined with --resume")
    if fresh:
        return None
    if resume is None or resume == "latest":
        found = latest_snapshot(cfg.flink.checkpoint_path())
        return str(found) if found else None
    path = Path(resume)
    if path.name == "_metadata":
        path = path.parent
    if not (path / "_metadata").exists():
        raise JobControlError(f"{resume} holds no _metadata: not a checkpoint or savepoint")
    return str(path.resolve())


def _state_file_of(snapshot: Path) -> Path | None:
    """The settings file of a snapshot: in a savepoint itself, else in its checkpoint directory."""
    for candidate in (snapshot / STATE_FILE, snapshot.parent / STATE_FILE, snapshot.parent.parent / STATE_FILE):
        if candidate.is_file():
            return candidate
    return None


def check_restore(cfg: Settings, snapshot: str) -> None:
    """Refuse a restore whose state was written with other :func:`state_settings`."""
    found = _state_file_of(Path(snapshot))
    if found is None:
        logger.warning("no %s beside %s: cannot check the settings its state was written with", STATE_FILE, snapshot)
        return
    try:
        written = json.loads(found.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise JobControlError(f"cannot read {found}: {exc}") from None
    now = state_settings(cfg)
    changed = [k for k in now if k in written and written[k] != now[k]
               and (k, written[k], now[k]) not in ALLOWED_CHANGES]
    if changed:
        what = "; ".join(f"{k} was {written[k]!r}, now {now[k]!r}" for k in changed)
        raise JobControlError(
            f"refusing to restore {snapshot}: its state was written with other settings ({what}). "
            "Keep them as they were, or start with empty state with --fresh"
        )


def record_state_settings(cfg: Settings) -> None:
    """Write :func:`state_settings` beside the job's checkpoints."""
    directory = cfg.flink.checkpoint_path()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / STATE_FILE).write_text(json.dumps(state_settings(cfg), indent=1) + "\n", encoding="utf-8")


def record_savepoint(cfg: Settings, location: str) -> None:
    """After ``dedupctl stop --savepoint``: the savepoint carries the state's settings, and
    ``--resume latest`` on this checkpoint directory finds it."""
    path = Path(location.removeprefix("file:").removeprefix("//"))
    if not path.is_dir():
        return  # not on this machine's file system: nothing to write beside it
    directory = cfg.flink.checkpoint_path()
    state = directory / STATE_FILE
    if state.is_file():
        shutil.copyfile(state, path / STATE_FILE)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / SAVEPOINTS_FILE, "a", encoding="utf-8") as out:
        out.write(f"{path.resolve()}\n")


@dataclass
class CheckpointLock:
    """Held by the one job that runs on a checkpoint directory."""

    path: Path
    _file: TextIO | None = None

    def __enter__(self) -> CheckpointLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held for the job's life
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise JobControlError(
                f"checkpoint directory {self.path.parent} is in use by another job ({holder}): "
                "one job per checkpoint directory; stop it first, or give this one another --checkpoint-dir"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}\n")
        f.flush()
        self._file = f
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def run_job(cfg: Settings, resume_from: str | None = None, detached: bool = False) -> Any:
    """Check, build and execute the job; blocks until it ends unless ``detached`` (then: JobClient)."""
    from jobs.dedup_job import build_pipeline, create_environment
    from jobs.preflight import preflight

    if resume_from:
        check_restore(cfg, resume_from)
    preflight(cfg)
    env = create_environment(cfg, resume_from)
    build_pipeline(env, cfg)
    record_state_settings(cfg)
    if detached:
        return env.execute_async(JOB_NAME)
    return env.execute(JOB_NAME)


def run_locked(cfg: Settings, resume: str | None, *, fresh: bool = False) -> Any:
    """``dedupctl run``: the one job of its checkpoint directory, started where the rules say."""
    with CheckpointLock(cfg.flink.checkpoint_path() / LOCK_FILE):
        start = resolve_start(cfg, resume, fresh=fresh)
        if start:
            logger.info("resuming from %s", start)
        else:
            logger.info("starting with empty state (checkpoints go to %s)", cfg.flink.checkpoint_uri())
        return run_job(cfg, start)
