"""``dedupctl api campaigns``: its progress line (pure), and create --watch, pause, watch, resume
through a real API process on the session's broker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from api.scopes import Scope
from dedupctl.campaigns_cmd import progress_line
from operators.records import Category
from tests.api.conftest import REPO_ROOT, RunningApi, api_settings
from tests.senders.conftest import read_records

CAMPAIGN = {"campaign_id": "camp-1", "state": "running", "total": 25_000, "written": 1_200, "rate": 200.0,
            "send_at": 1_767_225_600_000}


def test_the_progress_line_says_written_of_total_the_rate_seen_and_the_time_left() -> None:
    assert progress_line(CAMPAIGN, None) == "camp-1  running    1,200 / 25,000 written (4.8%)"
    assert progress_line(CAMPAIGN, 198.4) == (
        "camp-1  running    1,200 / 25,000 written (4.8%)  198/s (limit 200/s)  eta 2m00s")
    assert progress_line({**CAMPAIGN, "total": 2_000_000}, 198.4).endswith("written (0.1%)  198/s (limit 200/s)  eta 2h47m")
    assert progress_line({**CAMPAIGN, "written": 0}, 0.0) == "camp-1  running    0 / 25,000 written (0.0%)  0/s (limit 200/s)"
    assert progress_line({**CAMPAIGN, "state": "scheduled", "written": 0}, None) == (
        "camp-1  scheduled  0 / 25,000 written (0.0%)  starts at 2026-01-01T00:00:00Z")
    assert progress_line({**CAMPAIGN, "state": "done", "written": 25_000}, 150.0) == (
        "camp-1  done       25,000 / 25,000 written (100.0%)")


def dedupctl(api: RunningApi, token: str | None, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DEDUP_API_TOKEN"}
    if token is not None:
        env["DEDUP_API_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "dedupctl.cli", "--config", str(api.root / "api.toml"), "api", "campaigns", *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)


@pytest.mark.integration
def test_create_watch_pause_and_resume_a_campaign_from_the_command_line(kafka_bootstrap: str, tmp_path: Path) -> None:
    api = RunningApi(api_settings(kafka_bootstrap, tmp_path), tmp_path).start()
    try:
        growth = api.token("growth", categories=(Category.MARKETING,), scopes=(Scope.CAMPAIGNS,), rate=500)
        users = ",".join(f"u{i}" for i in range(60))
        done = dedupctl(api, growth, "create", "--template", "eid_sale", "--segment", users, "--param", "pct=20",
                        "--rate", "40", "--watch", "--interval", "0.3")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        cid = lines[0].split()[1]
        assert lines[0] == f"campaign {cid} created (/v1/campaigns/{cid})"
        assert lines[-1] == f"{cid}  done       60 / 60 written (100.0%)"
        running = [line for line in lines if "  running  " in line]
        assert any(" eta " in line and "(limit 40/s)" in line for line in running), done.stdout
        written = [int(line.split()[2].replace(",", "")) for line in lines[1:]]
        assert written == sorted(written) and len(running) >= 2  # ~1.5 s at 40/s, looked at every 0.3 s

        # a second campaign, paused while it runs: watch says so and exits 3; resume; watch to done
        started = dedupctl(api, growth, "create", "--template", "eid_sale", "--segment", users, "--rate", "20",
                           "--param", "pct=5")
        assert started.returncode == 0, started.stderr
        second = started.stdout.split()[1]
        paused = dedupctl(api, growth, "pause", second)
        assert paused.returncode == 0 and paused.stdout.startswith(f"{second}  paused "), paused.stdout
        watched = dedupctl(api, growth, "watch", second, "--interval", "0.2")
        assert watched.returncode == 3 and watched.stdout.splitlines()[-1].startswith(
            f"paused: dedupctl api campaigns resume {second} goes on from "), watched.stdout
        assert dedupctl(api, growth, "pause", second).returncode == 1  # already paused: the API's 409
        assert dedupctl(api, growth, "resume", second).returncode == 0
        assert dedupctl(api, growth, "watch", second, "--interval", "0.3").stdout.splitlines()[-1] == (
            f"{second}  done       60 / 60 written (100.0%)")

        # bad arguments: said before anything is sent (2)
        bad = dedupctl(api, growth, "create", "--template", "eid_sale", "--segment", "u1", "--param", "pct")
        assert bad.returncode == 2 and "--param is NAME=VALUE" in bad.stderr
        both = dedupctl(api, growth, "create", "--template", "eid_sale", "--segment", "u1", "--segment-file", "f.txt")
        assert both.returncode == 2 and "one of them" in both.stderr
        # refusals: no token (2), a caller without the campaigns scope (1, the API's 403), an unknown id
        assert dedupctl(api, None, "watch", second).returncode == 2
        shop = api.token("shop")
        refused = dedupctl(api, shop, "watch", second)
        assert refused.returncode == 1 and "answered 403" in refused.stderr
        unknown = dedupctl(api, growth, "watch", "camp-nope")
        assert unknown.returncode == 1 and "answered 404" in unknown.stderr
        assert shop not in refused.stderr + refused.stdout and growth not in unknown.stderr + unknown.stdout
    finally:
        api.stop()
    records = read_records(kafka_bootstrap, api.cfg.topics.requests, "notification_request")
    assert len(records) == 120 and {r["params"]["pct"] for r in records} == {"20", "5"}
