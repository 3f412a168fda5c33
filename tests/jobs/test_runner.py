"""The restart rules of ``dedupctl run`` (jobs/runner.py), on real files and processes, no Flink."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dedupctl import cli
from jobs.preflight import check_sizes, largest_output_bytes
from jobs.runner import (
    LOCK_FILE,
    STATE_FILE,
    CheckpointLock,
    check_restore,
    latest_snapshot,
    record_savepoint,
    record_state_settings,
    resolve_start,
)
from operators.errors import ConfigError
from ops.flink_rest import JobControlError
from settings import Settings


def snapshot(path: Path, age_s: float = 0.0) -> Path:
    """A retained checkpoint or savepoint as Flink lays it out: a directory with ``_metadata``."""
    path.mkdir(parents=True)
    meta = path / "_metadata"
    meta.write_bytes(b"flink")
    t = time.time() - age_s
    import os

    os.utime(meta, (t, t))
    return path


@pytest.fixture
def cfg(tmp_path: Path) -> Settings:
    return Settings().with_overrides(flink={"checkpoint_dir": str(tmp_path / "ck")})


def test_run_resumes_from_retained_checkpoints_unless_fresh(cfg: Settings) -> None:
    ck = cfg.flink.checkpoint_path()
    assert resolve_start(cfg, None) is None  # nothing retained: empty state
    older = snapshot(ck / "a1b2" / "chk-3", age_s=60)
    newer = snapshot(ck / "a1b2" / "chk-4")
    assert older != newer
    assert resolve_start(cfg, None) == str(newer)  # no --resume: the latest, not empty state
    assert resolve_start(cfg, "latest") == str(newer)
    assert resolve_start(cfg, None, fresh=True) is None
    with pytest.raises(JobControlError, match="--fresh"):
        resolve_start(cfg, "latest", fresh=True)


def test_resume_latest_finds_a_savepoint_taken_with_stop(cfg: Settings, tmp_path: Path) -> None:
    ck = cfg.flink.checkpoint_path()
    snapshot(ck / "a1b2" / "chk-9", age_s=120)
    record_state_settings(cfg)
    elsewhere = snapshot(tmp_path / "savepoints" / "savepoint-a1b2c3-0123456789ab")
    record_savepoint(cfg, f"file:{elsewhere}")
    assert latest_snapshot(ck) == elsewhere.resolve()
    assert resolve_start(cfg, "latest") == str(elsewhere.resolve())
    # the savepoint carries the settings its state was written with
    assert json.loads((elsewhere / STATE_FILE).read_text())["dedup.shards"] == 128
    # a recorded savepoint that was deleted since is passed over
    (elsewhere / "_metadata").unlink()
    assert latest_snapshot(ck) == ck / "a1b2" / "chk-9"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"dedup": {"shards": 64}}, "dedup.shards was 128, now 64"),
        ({"flink": {"max_parallelism": 256}}, "flink.max_parallelism was 128, now 256"),
        ({"flink": {"execution_mode": "process"}}, "flink.execution_mode was 'thread', now 'process'"),
        ({"flink": {"transaction_naming": "incrementing"}},
         "flink.transaction_naming was 'pooling', now 'incrementing'"),
    ],
)
def test_a_restore_with_settings_that_change_what_state_means_is_refused(
    cfg: Settings, change: dict[str, dict[str, object]], named: str
) -> None:
    chk = snapshot(cfg.flink.checkpoint_path() / "a1b2" / "chk-1")
    record_state_settings(cfg)
    check_restore(cfg, str(chk))  # the same settings: fine
    with pytest.raises(JobControlError, match=named.replace("(", r"\(")) as exc:
        check_restore(cfg.with_overrides(**change), str(chk))
    assert "--fresh" in str(exc.value)


def test_a_state_of_incrementing_transaction_names_is_restored_under_pooling(cfg: Settings) -> None:
    """How a deployment moves to pooling (the connector takes over the other naming's open
    transactions), and a state recorded before the setting existed is restored as well."""
    chk = snapshot(cfg.flink.checkpoint_path() / "a1b2" / "chk-1")
    record_state_settings(cfg.with_overrides(flink={"transaction_naming": "incrementing"}))
    check_restore(cfg, str(chk))
    state = cfg.flink.checkpoint_path() / STATE_FILE
    written = json.loads(state.read_text())
    del written["flink.transaction_naming"]
    state.write_text(json.dumps(written))
    check_restore(cfg, str(chk))
    check_restore(cfg.with_overrides(flink={"transaction_naming": "incrementing"}), str(chk))


def test_the_cli_refuses_such_a_restore_with_the_setting_named(cfg: Settings, tmp_path: Path, capsys) -> None:
    snapshot(cfg.flink.checkpoint_path() / "a1b2" / "chk-1")
    record_state_settings(cfg)
    config = tmp_path / "dedup.toml"
    config.write_text(f'[flink]\ncheckpoint_dir = "{cfg.flink.checkpoint_path()}"\n[dedup]\nshards = 32\n')
    assert cli.main(["--config", str(config), "run"]) == 2
    assert "dedup.shards was 128, now 32" in capsys.readouterr().err


def test_a_second_job_on_the_same_checkpoint_directory_refuses_to_start(cfg: Settings) -> None:
    lock = cfg.flink.checkpoint_path() / LOCK_FILE
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from jobs.runner import CheckpointLock; from pathlib import Path\n"
         f"with CheckpointLock(Path({str(lock)!r})):\n    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(JobControlError, match=rf"in use by another job \(pid {holder.pid}\)"):
            with CheckpointLock(lock):
                pass
    finally:
        holder.kill()
        holder.wait()
    with CheckpointLock(lock):  # the kernel dropped the dead holder's lock
        pass


def test_sizes_the_sink_and_the_topics_must_agree() -> None:
    cfg = Settings()
    largest = largest_output_bytes(cfg)
    assert cfg.dedup.max_record_bytes < largest < cfg.kafka.sink_max_request_bytes
    check_sizes(cfg, {"notifications.push": 1_048_588})
    with pytest.raises(ConfigError, match=r"notifications.push \(65536\)"):
        check_sizes(cfg, {"notifications.push": 65_536, "notifications.sms": 1_048_588})
    big = cfg.with_overrides(dedup={"max_record_bytes": 2_000_000})
    with pytest.raises(ConfigError, match="kafka.sink_max_request_bytes is 1048576"):
        check_sizes(big, {})
