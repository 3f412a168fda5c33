"""The arithmetic of bench.slo (bench/slo_report.py) and its generator's mix (bench/slo_load.py):
matching provider arrivals to API calls, percentiles, what became of each accepted request."""

from __future__ import annotations

import pytest

from bench import slo_report as report
from bench.slo_load import codes_in, mix_kind


def rec(kind: str, key: str, due: float, ms: float, status: int, dedup_key: str | None,
        late_ms: float = 0.0) -> list[object]:
    return ["mix", kind, key, due, ms, status, dedup_key, late_ms, late_ms / 2]


def test_a_message_key_splits_into_its_dedup_key_and_channel_even_with_colons_in_the_key() -> None:
    assert report.split_message_key("bench/camp-1:u-7:push:1796115600000") == ("bench/camp-1:u-7", "push")
    assert report.split_message_key("bench/r-mix-3:sms:17") == ("bench/r-mix-3", "sms")
    with pytest.raises(ValueError):
        report.split_message_key("no-channel")


def test_by_request_keeps_the_first_of_a_pair_and_drops_keys_it_cannot_read() -> None:
    assert report.by_request({"a:sms:1": 1.0, "a:sms:2": 2.0, "a:push:1": 3.0, "junk": 4.0}) == {
        ("a", "sms"): 1.0, ("a", "push"): 3.0}


def test_accept_summary_nearest_rank_percentiles_and_errors() -> None:
    records = [rec("order", f"k{i}", 0.0, float(i), 202, f"d{i}", late_ms=i / 10) for i in range(1, 99)]
    records += [rec("order", "k99", 0.0, 99.0, 503, None, 9.9), rec("repeat", "k1", 0.0, 100.0, 200, "d1", 10.0)]
    got = report.accept_summary(records)
    assert (got["sent_late_p50_ms"], got["sent_late_p99_ms"]) == (5.0, 9.9)
    assert got["queued_late_p99_ms"] == 4.95
    assert got["requests"] == 100
    assert got["statuses"] == {"200": 1, "202": 98, "503": 1}
    assert got["errors"] == 1 and got["error_rate"] == 0.01
    assert (got["p50_ms"], got["p99_ms"], got["max_ms"]) == (50.0, 99.0, 100.0)


def test_only_a_202_is_expected_on_each_of_its_channels() -> None:
    records = [rec("order", "k1", 10.0, 5.0, 202, "bench/k1"), rec("repeat", "k1", 11.0, 5.0, 200, "bench/k1"),
               rec("code", "k2", 12.0, 5.0, 202, "bench/k2"), rec("order", "k3", 13.0, 5.0, 503, None)]
    got = report.expected_messages(records, {"order": ("push", "sms"), "code": ("sms",), "repeat": ()})
    assert got == {("bench/k1", "push"): report.Expected("order", 10.0),
                   ("bench/k1", "sms"): report.Expected("order", 10.0),
                   ("bench/k2", "sms"): report.Expected("code", 12.0)}


def test_account_delivered_dead_lettered_skipped_and_lost_with_latencies_from_the_due_time() -> None:
    expected = {("c1", "sms"): report.Expected("code", 100.0), ("c2", "sms"): report.Expected("code", 101.0),
                ("c3", "sms"): report.Expected("code", 102.0), ("c4", "sms"): report.Expected("code", 103.0),
                ("c5", "sms"): report.Expected("code", 104.0), ("o1", "push"): report.Expected("order", 100.0)}
    arrivals = {("c1", "sms"): 101.5, ("c2", "sms"): 101.25, ("o1", "push"): 104.0, ("x", "sms"): 1.0}
    final = {("c1", "sms"): "sent", ("c3", "sms"): "failed", ("c4", "sms"): "rejected",
             ("c5", "sms"): "sending"}
    got = report.account(expected, arrivals, final)
    code = got["code"].as_dict()
    assert {k: code[k] for k in ("expected", "delivered", "dead_lettered", "skipped_by_rule", "lost")} == {
        "expected": 5, "delivered": 2, "dead_lettered": 1, "skipped_by_rule": 1, "lost": 1}
    assert code["lost_sample"] == ["c5 on sms: sending"]
    # 1,500 and 250 ms delivered, one lost counted as slower than both: p50 1,500, p99 not reached
    assert code["api_to_provider_ms"] == {"n": 2, "missing": 1, "p50": 1500.0, "p99": None, "max": None}
    order = got["order"].as_dict()
    assert order["lost"] == 0
    assert order["api_to_provider_ms"] == {"n": 1, "missing": 0, "p50": 4000.0, "p99": 4000.0, "max": 4000.0}


def test_a_message_never_seen_anywhere_is_lost() -> None:
    got = report.account({("a", "push"): report.Expected("order", 1.0)}, {}, {})
    assert (got["order"].lost, got["order"].lost_sample) == (1, ["a on push: no status"])


def test_repeated_calls_count_only_the_wanted_messages() -> None:
    repeats = [("a:push:1", 5.0), ("a:push:1", 6.0), ("b:sms:2", 7.0), ("junk", 8.0)]
    assert report.repeated_calls(repeats, [("a", "push")]) == 2
    assert report.repeated_calls(repeats, [("a", "sms")]) == 0


def test_campaign_rate_between_first_and_last_delivery() -> None:
    got = report.campaign_rate([10.0 + i * 0.01 for i in range(101)])
    assert got["delivered"] == 101
    assert got["window_s"] == pytest.approx(1.0)
    assert got["rate"] == pytest.approx(100.0)


def test_the_mix_codes_repeats_and_code_users() -> None:
    kinds = [mix_kind(n) for n in range(1010)]
    assert kinds[:6] == ["code", "order", "order", "order", "order", "order"]  # no repeat before 1004
    assert kinds[1005] == "repeat" and mix_kind(1005 - 1004) == "order"
    assert kinds.count("code") == 101 == codes_in("mix", 1010)
    assert codes_in("code", 7) == 7 and codes_in("order", 7) == 0


def test_a_jvm_s_pauses_are_read_from_its_gc_log_between_two_times() -> None:
    import datetime as dt

    from bench.measure import gc_pauses

    log = (
        "[2026-12-06T11:03:50.000+0000][info][gc] Using G1\n"
        "[2026-12-06T11:03:51.500+0000][info][gc] GC(16) Pause Young (Normal) (G1 Evacuation Pause)"
        " 438M->196M(512M) 43.167ms\n"
        "[2026-12-06T11:03:52.000+0000][info][gc] GC(17) Pause Remark 188M->188M(512M) 7.5ms\n"
        "[2026-12-06T11:03:52.100+0000][info][gc] GC(17) Concurrent Mark Cycle 120.002ms\n"  # not a pause
        "[2026-12-06T11:04:10.000+0000][info][gc] GC(18) Pause Young (Normal) (G1 Evacuation Pause)"
        " 440M->197M(512M) 49.0ms\n"
    )
    at = dt.datetime(2026, 12, 6, 11, 3, 51, tzinfo=dt.UTC).timestamp()
    assert gc_pauses(log, at, at + 5) == [43.167, 7.5]
    assert gc_pauses(log, at + 5, at + 60) == [49.0]
    assert gc_pauses("garbage\n[not a time][info][gc] Pause Young 1.0ms\n", 0, 2e9) == []


def test_the_report_tables_the_job_s_checkpoints_per_phase_and_old_results_still_render() -> None:
    import json

    from bench.checkpoints import CheckpointLog, summarize
    from settings import REPO_ROOT

    result = json.loads((REPO_ROOT / "bench/results/slo-2026-12-07-s42-3b-cp500-0350.json").read_text())
    assert "checkpoints" not in result["phases"][0]
    assert "The job's checkpoints" not in report.markdown(result)  # recorded before the log existed

    log = CheckpointLog(lambda: [])
    # one after another, each triggered 500 ms after the last or at once after a slow one; one
    # failed; the last triggered after the phase's window
    for cid, trigger, took, status in [(1, 10_000, 150, "COMPLETED"), (2, 10_500, 1_200, "COMPLETED"),
                                       (3, 11_950, 90, "FAILED"), (4, 12_200, 160, "COMPLETED"),
                                       (5, 12_700, 140, "COMPLETED"), (6, 13_200, 150, "COMPLETED")]:
        log.entries[cid] = {"id": cid, "status": status, "trigger_timestamp": trigger,
                            "latest_ack_timestamp": trigger + took, "end_to_end_duration": took,
                            "checkpointed_size": 1000}
    flood = next(p for p in result["phases"] if p["name"] == "flood")
    flood["checkpoints"] = summarize(log, 10_000, 13_000)
    c = flood["checkpoints"]
    assert (c["completed"], c["failed"], c["duration_ms_max"]) == (4, 1, 1200.0)
    # completions at 10,150, 11,700, 12,360 and 12,840: the slow one held the next back
    assert (c["between_completions_ms_p50"], c["between_completions_ms_max"]) == (660.0, 1550.0)
    table = report.markdown(result)
    assert "The job's checkpoints triggered" in table
    assert f"| flood | 4 | 1 | 660 / 1,550 | {c['duration_ms_p50']:,.0f} / 1,200 / 1,200 |" in table
    assert "each task's slowest subtask" not in table  # no phases asked for

    task = "Source: requests -> Timestamps/Watermarks -> Map"
    for cid, entry in log.entries.items():
        entry["phases"] = {task: {"start_delay": 2.0 * cid, "sync": 10.0 * cid, "async": 3.0, "alignment": 0.0}}
    flood["checkpoints"] = summarize(log, 10_000, 13_000)
    table = report.markdown(result)
    assert "each task's slowest subtask" in table
    # checkpoints 1, 2, 4 and 5: sync 10, 20, 40, 50 ms
    assert "| flood | Source: requests -> ... -> Map | 4 | 4.0 / 10.0 | 20.0 / 50.0 / 50.0 | 3.0 / 3.0 | 0.0 |" in table


def test_legs_split_each_code_s_way_at_its_marks_and_name_the_slow_ones_leg() -> None:
    due = 100.0
    expected = {(f"k{i}", "sms"): report.Expected("code", due) for i in range(100)}
    expected[("order", "push")] = report.Expected("order", due)  # another kind: not counted
    # visible 0.5 s after it was due, ruled on 0.1 s later, at the stub 0.05 s after that; the
    # last code's transaction committed late (visible after 1.7 s); one was never ruled on
    visible = {pair: due + (1.7 if pair == ("k99", "sms") else 0.5) for pair in expected}
    ruled = {pair: t + 0.1 for pair, t in visible.items() if pair != ("k0", "sms")}
    stub = {pair: t + 0.05 for pair, t in ruled.items()}
    # the job's checkpoints completed 0.3 s before most became visible, 1.4 s before the late one
    got = report.legs(expected, "code", {"visible": visible, "ruled": ruled, "stub": stub},
                      [(due - 5) * 1000, (due + 0.2) * 1000, (due + 0.3) * 1000, (due + 3) * 1000])
    assert (got["messages"], got["unmarked"], got["slowest"]) == (99, 1, 1)
    assert got["legs_ms"]["visible"] == {"p50": 500.0, "p99": 1700.0, "max": 1700.0, "slowest_p50": 1700.0}
    assert got["legs_ms"]["ruled"]["p50"] == pytest.approx(100.0)
    assert got["legs_ms"]["stub"]["slowest_p50"] == pytest.approx(50.0)
    assert got["legs_ms"]["after_checkpoint"] == {"p50": 200.0, "p99": 1400.0, "max": 1400.0, "slowest_p50": 1400.0}
    before = report.legs(expected, "code", {"visible": visible, "ruled": ruled, "stub": stub}, [(due + 3) * 1000])
    assert before["legs_ms"]["after_checkpoint"]["p50"] is None  # none completed before: not counted
    empty = report.legs({}, "code", {"visible": {}, "ruled": {}, "stub": {}})
    assert (empty["messages"], empty["legs_ms"]["visible"]["p99"], empty["legs_ms"]["visible"]["slowest_p50"]) \
        == (0, None, None)
    import json

    from settings import REPO_ROOT

    result = json.loads((REPO_ROOT / "bench/results/slo-2026-12-07-s42-3b-cp500-0350.json").read_text())
    assert "Where the one-time codes' time went" not in report.markdown(result)  # recorded before the legs
    flood = next(p for p in result["phases"] if p["name"] == "flood")
    flood["code_legs"] = got
    assert ("| flood | 99 (1 unmarked) | 500 / 1,700 / 1,700 | 200 / 1,400 / 1,400 | 100 / 100 / 100 | 50.0 / 50.0 / 50.0"
            " | 1: 1,700 (1,400) / 100 / 50.0 |") in report.markdown(result)
