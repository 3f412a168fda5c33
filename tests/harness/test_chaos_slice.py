"""The CI slice of `make chaos`: a few kills, a broker restart and two savepoint rescales."""

from __future__ import annotations

import pytest

from harness.chaos import ChaosPlan, run_chaos

pytestmark = pytest.mark.integration


def test_exactly_once_under_kills_broker_restart_and_rescales(tmp_path):
    plan = ChaosPlan(requests=3000, rate=100, kills=2, broker_restarts=1, rescales=2, seed=11,
                     uptime_s=(3.0, 8.0), settle_timeout_s=240, progress_s=5.0)
    lines: list[str] = []

    def say(line: str) -> None:  # progress goes to stdout as it happens: pytest shows it if anything fails or hangs
        lines.append(line)
        print(line, flush=True)

    report = run_chaos(plan, say, work=tmp_path)
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
    assert report.problems == []
    assert report.actual == report.expected
