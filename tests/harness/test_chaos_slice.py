"""The CI slice of `make chaos`: a few kills, a broker restart and two savepoint rescales."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.chaos import ChaosPlan, run_chaos

pytestmark = pytest.mark.integration


def _account(lines: list[str], work: Path) -> str:
    """The run's lines and the job process's last log lines (where it resumed from, what it raised)."""
    log = work / "job.log"
    tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-30:] if log.is_file() else []
    return "\n".join([*lines, "job.log:", *tail])


def test_exactly_once_under_kills_broker_restart_and_rescales(tmp_path):
    plan = ChaosPlan(requests=3000, rate=100, kills=2, broker_restarts=1, rescales=2, seed=11,
                     uptime_s=(3.0, 8.0), settle_timeout_s=240, progress_s=5.0, budget_s=780)
    lines: list[str] = []

    def say(line: str) -> None:  # progress goes to stdout as it happens: pytest shows it if anything fails or hangs
        lines.append(line)
        print(line, flush=True)

    try:  # within the suite's 900 s timeout: the run's own account, in the failure's message
        report = run_chaos(plan, say, work=tmp_path)
    except Exception as exc:  # noqa: BLE001 - any failure of the run fails the test with what it did
        pytest.fail(f"{type(exc).__name__}: {exc}\n" + _account(lines, tmp_path))
    account = _account(lines, tmp_path)
    progress = [line.split("progress: ")[1] for line in lines if "] progress: " in line]
    produced = [int(p.split(" of ")[0].replace(",", "")) for p in progress if " requests produced" in p]
    assert len(progress) >= 3 and all(" of 3,000 requests produced" in p for p in progress), progress
    assert produced == sorted(produced) and 0 < produced[-1] <= 3000  # 30 s of production, a line every 5 s
    assert not any("progress" in a for a in report.actions)
    assert sum("SIGKILL" in a for a in report.actions) == 2
    assert sum("resumed from it at parallelism" in a for a in report.actions) == 2
    assert sum("broker restarted" in a for a in report.actions) == 1
    assert report.expected["notifications.late"] > 0
    assert report.expected["notifications.invalid"] > 0
    assert report.problems == [], account
    assert report.actual == report.expected, account
