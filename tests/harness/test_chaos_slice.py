"""The CI slice of `make chaos`: a few kills, a broker restart and two savepoint rescales."""

from __future__ import annotations

import pytest

from harness.chaos import ChaosPlan, run_chaos

pytestmark = pytest.mark.integration


def test_exactly_once_under_kills_broker_restart_and_rescales(tmp_path):
    plan = ChaosPlan(requests=3000, rate=100, kills=2, broker_restarts=1, rescales=2, seed=11,
                     uptime_s=(3.0, 8.0), settle_timeout_s=240)
    # progress goes to stdout as it happens: pytest shows it if anything fails or hangs
    report = run_chaos(plan, lambda line: print(line, flush=True), work=tmp_path)
    assert sum("SIGKILL" in a for a in report.actions) == 2
    assert sum("resumed from it at parallelism" in a for a in report.actions) == 2
    assert sum("broker restarted" in a for a in report.actions) == 1
    assert report.expected["notifications.late"] > 0
    assert report.expected["notifications.invalid"] > 0
    assert report.problems == []
    assert report.actual == report.expected
