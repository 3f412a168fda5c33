"""The senders' metric names are the ones operators/metric_names.py lists (SENDER_METRICS), so the
alert rules and the dashboard can be checked against one list (tests/deploy/test_monitoring.py)."""

from __future__ import annotations

import re
from pathlib import Path

from operators.metric_names import SENDER_METRICS
from settings import REPO_ROOT

#: a metric the senders count, set or observe: ``metrics.inc("name", ...)``, ``metrics.set(...)``,
#: ``metrics.observe(...)``, ``metrics.observe_many(...)``, ``metrics.counter_key(...)``
RECORDED = re.compile(r"metrics\.(?:inc|set|observe|observe_many|counter_key)\(\s*\"([A-Za-z0-9_:]+)\"")


def recorded_names(root: Path = REPO_ROOT / "senders") -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for name in RECORDED.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, []).append(str(path.relative_to(REPO_ROOT)))
    return found


def test_every_metric_the_senders_record_is_listed() -> None:
    recorded = recorded_names()
    assert "sender_deliveries_total" in recorded and "provider_calls_total" in recorded  # the scan finds them
    unlisted = {name: where for name, where in recorded.items() if name not in SENDER_METRICS}
    assert not unlisted, f"add these to operators/metric_names.py SENDER_METRICS: {unlisted}"


def test_every_listed_sender_metric_is_recorded() -> None:
    stale = sorted(set(SENDER_METRICS) - set(recorded_names()))
    assert not stale, f"listed in SENDER_METRICS, recorded nowhere in senders/: {stale}"
    assert len(SENDER_METRICS) == len(set(SENDER_METRICS))


def test_the_scan_reads_calls_over_several_lines(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        'self.metrics.inc(\n    "sender_x_total", outcome=o)\nm.set("nope", 1)\nmetrics.observe(\n "sender_h", 1.0, B)\n'
    )
    assert RECORDED.findall((tmp_path / "m.py").read_text()) == ["sender_x_total", "sender_h"]
