"""``dedupctl status`` against a fake REST API: the figures, the rates, the screen and --json.

No JVM and no broker: tests/ops/test_ops_job.py runs the same command on the real job.
"""

from __future__ import annotations

import json

import pytest

from dedupctl import cli
from ops.flink_rest import JobControlError, RestClient
from ops.status import RateTracker, build_report, collect, counter_totals, emitted_per_topic, watch
from ops.status_probe import Agg, Probe, Sample, Vertex, operator_names, pick_job
from ops.status_view import fmt_bytes, fmt_duration, fmt_time, render, short_topic_names
from settings import Settings
from tests.ops.fake_flink import BASE, JOB, NOW, FakeFlink, serve

WATERMARK = BASE + 9 * 60_000 - 1


@pytest.fixture
def fake() -> FakeFlink:
    return FakeFlink()


@pytest.fixture
def url(fake):
    with serve(fake) as base:
        yield base


def report_of(url: str, fake: FakeFlink, tracker: RateTracker | None = None):
    reading = Probe(RestClient(url)).read()
    return build_report(reading, Settings(), url, tracker), reading


def test_operator_names_of_a_chained_vertex():
    assert operator_names("dedup -> outputs: Writer -> outputs: Committer") == [
        "dedup", "outputs: Writer", "outputs: Committer",
    ]
    assert operator_names("Source: requests -> prepare -> (_stream_key_by_map_operator, Map)") == [
        "Source: requests", "prepare", "_stream_key_by_map_operator", "Map",
    ]
    assert operator_names("dedup") == ["dedup"]


def test_watermark_rows(url, fake):
    report, _ = report_of(url, fake)
    rows = {r.operator: r for r in report.operators}
    # the source shows the watermark it emits, every other operator the one it receives
    assert list(rows) == ["Source: requests", "carry-watermark", "dedup", "outputs: Writer", "outputs: Committer"]
    dedup = rows["dedup"]
    assert dedup.watermark == WATERMARK
    assert dedup.lag_event_ms == BASE + 10 * 60_000 - WATERMARK  # newest event time (max) - watermark
    assert dedup.lag_wall_ms == NOW - WATERMARK
    assert dedup.parallelism == 2
    assert rows["carry-watermark"].backpressured_ms_per_s == 12  # the worst subtask of its vertex
    # a subtask without a watermark yet holds the operator back: none to show
    assert rows["outputs: Writer"].watermark is None and rows["outputs: Writer"].lag_wall_ms is None


def test_checkpoint_state_and_bloom_figures(url, fake):
    report, _ = report_of(url, fake)
    c = report.checkpoint
    assert (c.last_id, c.size_bytes, c.full_size_bytes, c.duration_ms) == (118, 55_388, 63_524, 13)
    assert (c.completed, c.failed, c.in_progress, c.age_ms) == (118, 2, 0, 2_500)
    assert c.last_failure == "Checkpoint expired"
    s = report.state_size
    assert (s.keys_held, s.rocksdb_estimated_keys, s.bloom_keys_estimate) == (80, 79, 81)
    assert s.rocksdb_live_data_bytes == 3300  # every column family of the dedup operator
    assert s.rocksdb_sst_bytes == 4096
    assert report.totals == {
        "accepted": 80, "duplicates": 20, "late": 2, "state_reads": 25, "state_reads_skipped": 75,
        "bloom_false_positives": 1, "evicted": 0, "invalid": 3,
    }
    assert report.bloom.skip_rate == pytest.approx(75 / 100)
    assert report.bloom.fp_rate == pytest.approx(1 / 76)  # false positives / lookups of absent keys
    assert report.bloom.fp_rate_configured == Settings().dedup.bloom_fp_rate
    # counters per topic, under the configured names
    assert report.emitted == {
        "notifications.push": 30, "notifications.sms.priority": 2, "notifications.duplicates": 20,
        "notifications.invalid": 3,
    }
    assert (report.state, report.job_id, report.uptime_ms, report.restarts) == ("RUNNING", JOB, 600_000, 0)


def test_rates_are_counter_deltas_over_the_uptime_between_two_store_refreshes(url, fake):
    probe = Probe(RestClient(url))
    reading = probe.read()
    tracker = RateTracker(reading.vertices)
    assert tracker.update(reading.sample) is False
    assert tracker.update(probe.sample(reading.vertices)) is False  # the same refresh again
    fake.bump("dedup.accepted", 120, uptime_ms=10_000)
    fake.bump("route.invalid", 5, uptime_ms=0)
    assert tracker.update(probe.sample(reading.vertices)) is True
    assert tracker.rates == {"accepted": 12.0, "duplicates": 0.0, "late": 0.0, "invalid": 0.5}
    assert tracker.window_s == 10.0
    # a restart sets the counters back to zero: no rate across it
    fake.restarts = 1
    fake.values = {k: (0, 0, 0) for k in fake.values}
    fake.uptime = 1_000
    assert tracker.update(probe.sample(reading.vertices)) is False
    assert tracker.rates is None


def test_a_reading_never_mixes_two_refreshes(url, fake):
    """Counters and uptime come from one refresh: a refresh during the read is read again."""
    refreshes = iter([True, False, False, False])

    def refresh(f: FakeFlink) -> None:
        if next(refreshes, False):
            f.bump("dedup.accepted", 50, uptime_ms=5_000)

    probe = Probe(RestClient(url))
    vertices = probe.read().vertices
    fake.on_job_metrics = refresh
    sample = probe.sample(vertices)
    assert sample.uptime_ms == 605_000
    assert sample.find(vertices, "dedup.accepted").sum == 130


def test_collect_waits_for_the_next_refresh(url, fake):
    probe = Probe(RestClient(url))
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        if len(slept) == 3:  # the store refreshes while we wait
            fake.bump("dedup.duplicates", 30, uptime_ms=10_000)

    report = collect(probe, Settings(), sample_s=30, poll_s=0.01, sleep=sleep)
    assert len(slept) == 3
    assert report.rates_per_s == {"accepted": 0.0, "duplicates": 3.0, "late": 0.0, "invalid": 0.0}
    assert report.rate_window_s == 10.0
    assert collect(probe, Settings(), sample_s=0).rates_per_s is None


def test_watch_gives_rates_from_the_second_screen_on(url, fake):
    reports = []

    def sleep(_s: float) -> None:
        fake.bump("dedup.late", 20, uptime_ms=4_000)

    watch(Probe(RestClient(url)), Settings(), 1.0, 3, reports.append, sleep=sleep)
    assert [r.rates_per_s for r in reports] == [
        None,
        {"accepted": 0.0, "duplicates": 0.0, "late": 5.0, "invalid": 0.0},
        {"accepted": 0.0, "duplicates": 0.0, "late": 5.0, "invalid": 0.0},
    ]
    assert [r.totals["late"] for r in reports] == [2, 22, 42]


def test_pick_job():
    run = {"jid": "a", "name": "notify-dedup", "state": "RUNNING", "start-time": 5}
    assert pick_job([run]) == "a"
    # nothing running: the newest job, so that status shows how it ended
    old = {"jid": "b", "name": "notify-dedup", "state": "FAILED", "start-time": 1}
    new = {"jid": "c", "name": "notify-dedup", "state": "CANCELED", "start-time": 9}
    assert pick_job([old, new]) == "c"
    other = {"jid": "d", "name": "another-job", "state": "RUNNING", "start-time": 7}
    assert pick_job([run, other]) == "a"
    with pytest.raises(JobControlError, match="name one with --job"):
        pick_job([run, {**other, "name": "notify-dedup"}])
    with pytest.raises(JobControlError, match="no job"):
        pick_job([])


def test_formatting():
    assert fmt_time(BASE) == "2026-12-01T09:00:00.000Z"
    assert fmt_time(None) == "-"
    assert [fmt_duration(x) for x in (850, 12_340, 245_000, 8_040_000, 3 * 86_400_000 + 4 * 3_600_000)] == [
        "850ms", "12.3s", "4m05s", "2h14m", "3d04h",
    ]
    assert fmt_duration(-61_000) == "-1m01s"
    assert [fmt_bytes(x) for x in (512, 55_388, 3 * 1024**3)] == ["512 B", "54.1 KiB", "3.0 GiB"]
    assert short_topic_names(["notifications.push", "notifications.sms.priority"]) == {
        "notifications.push": "push", "notifications.sms.priority": "sms.priority",
    }


def test_screen(url, fake):
    probe = Probe(RestClient(url))
    reading = probe.read()
    tracker = RateTracker(reading.vertices)
    tracker.update(reading.sample)
    fake.bump("dedup.accepted", 25, uptime_ms=10_000)
    tracker.update(probe.sample(reading.vertices))
    text = render(build_report(reading, Settings(), url, tracker))
    lines = text.splitlines()
    assert lines[0].startswith(f"notify-dedup  RUNNING  up 10m00s  restarts 0  job {JOB}")
    dedup = next(line for line in lines if line.startswith("dedup "))
    assert dedup.split() == ["dedup", "x2", "2026-12-01T09:08:59.999Z", "1m00s", "6m00s", "0", "ms/s"]
    assert "outputs: Writer x2" in text
    checkpoint = "checkpoint  #118 2.5s ago, 54.1 KiB written (full 62.0 KiB), took 13ms;"
    assert f"{checkpoint} 118 completed, 2 failed" in lines
    assert "state       80 keys held (RocksDB estimate 79); live data 3.2 KiB, SST files 4.0 KiB" in lines
    assert "rates       accepted 2.5/s  duplicates 0.0/s  late 0.0/s  invalid 0.0/s  (over 10.0 s)" in lines
    assert "totals      accepted 80  duplicates 20  late 2  invalid 3  evicted 0" in lines
    assert "bloom       skip rate 75.0%, false positives 1.32% (configured 1.00%), fill 3%" in lines
    assert "emitted     push 30  sms.priority 2  duplicates 20  invalid 3" in lines


def test_cli_json_and_watch(url, fake, capsys):
    assert cli.main(["status", "--rest", url, "--json", "--sample", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["job_id"] == JOB and out["state"] == "RUNNING"
    assert out["totals"]["accepted"] == 80 and out["rates_per_s"] is None
    assert [o["operator"] for o in out["operators"]][2] == "dedup"
    assert out["operators"][2]["watermark"] == WATERMARK

    assert cli.main(["status", "--rest", url, "--watch", "0.01", "--count", "2", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(json.loads(line)["job_id"] == JOB for line in lines)

    assert cli.main(["status", "--rest", url, "--watch", "0.01", "--count", "2"]) == 0
    assert capsys.readouterr().out.count("totals      accepted 80") == 2


def test_cli_without_a_cluster(capsys):
    from harness.ports import free_port

    assert cli.main(["status", "--rest", f"http://127.0.0.1:{free_port()}", "--sample", "0"]) == 2
    assert "cannot reach Flink" in capsys.readouterr().err



def test_invalid_input_is_counted_by_the_route_operator_and_other_topics_keep_their_metric_name():
    sample = Sample(1.0, 0, {
        ("v", "route.invalid"): Agg(1, 1, 2),
        ("v", "route.topic.t1_notifications_push.emitted"): Agg(4, 4, 4),
        ("v", "route.topic.notifications_sms.emitted"): Agg(1, 1, 1),
    }, 0.0)
    vertex = Vertex("v", "x", 1, {}, ())
    assert counter_totals(sample, [vertex])["invalid"] == 2
    assert emitted_per_topic(sample, Settings()) == {"notifications.sms": 1, "t1_notifications_push": 4}
