"""The benchmark's pure parts: run order, medians and spreads, shares of the ceiling, the ceiling's
exactness check, its SQL, the report's tables, the engines' key mix (no broker, no JVM)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import engines, report, stats
from bench.dataset import DatasetSpec, build
from bench.feeds import IndexFeed
from bench.measure import ProcSampler, index_exactness, index_record, read_index, sustained_rate
from bench.peers import ceiling
from bench.watch import IndexTally
from operators import codec
from settings import Settings, flink_conf


def test_runs_are_interleaved_round_by_round() -> None:
    assert stats.schedule(["ceiling", "job-p1", "quix"], 2) == [
        (0, "ceiling"), (0, "job-p1"), (0, "quix"), (1, "ceiling"), (1, "job-p1"), (1, "quix")]
    assert stats.schedule(["a"], 0) == []


def test_summary_is_the_median_and_the_spread_of_what_was_measured() -> None:
    s = stats.summary([3.0, None, 1.0, 10.0])
    assert s is not None
    assert (s["median"], s["min"], s["max"], s["n"]) == (3.0, 1.0, 10.0, 3)
    assert stats.summary([2.0, 4.0])["median"] == 3.0  # type: ignore[index]
    assert stats.summary([None]) is None
    assert stats.rel_spread({"median": 10.0, "min": 9.0, "max": 12.0, "n": 3}) == pytest.approx(0.3)


def run(key: str, rnd: int, rps: float | None, cpu: float = 50.0, exact: bool = True) -> dict[str, Any]:
    return {"key": key, "round": rnd, "title": key, "guarantee": "exactly-once", "exactly_once": True,
            "status": "ok", "backlog": {"sustained_rps": rps}, "cpu": {"cpu_us_per_request": cpu},
            "broker": {"us_per_request": cpu / 10}, "exactness": {"exact": exact}}


def test_ratios_pair_runs_of_the_same_round() -> None:
    base = [run("ceiling", 0, 100.0), run("ceiling", 1, 50.0)]
    runs = [run("job-p1", 1, 25.0), run("job-p1", 0, 20.0), run("job-p1", 2, 30.0)]  # round 2: no base
    assert stats.paired_ratios(runs, base, stats.figure("sustained_rps")) == [0.5, 0.2]


def test_summarize_gives_shares_of_the_ceiling_and_ratios_to_the_job() -> None:
    runs = [run("ceiling", 0, 100.0, 5), run("job-p1", 0, 20.0, 60), run("quix", 0, 10.0, 120),
            run("ceiling", 1, 80.0, 5), run("job-p1", 1, 24.0, 40), run("quix", 1, 12.0, 100, exact=False)]
    by_key = {s["key"]: s for s in stats.summarize(runs)}
    assert list(by_key) == ["ceiling", "job-p1", "quix"]
    job = by_key["job-p1"]
    assert job["runs"] == 2 and job["exact_runs"] == 2
    assert job["figures"]["sustained_rps"]["median"] == 22.0
    share = job["ratios"]["to_ceiling"]["sustained_rps"]
    assert (share["min"], share["max"]) == (pytest.approx(0.2), pytest.approx(0.3))
    assert "to_job" not in job["ratios"]  # not to itself
    quix = by_key["quix"]
    assert quix["exact_runs"] == 1
    assert quix["ratios"]["to_job"]["sustained_rps"]["values"] == [0.5, 0.5]
    assert quix["ratios"]["to_job"]["cpu_us_per_request"]["values"] == [2.0, 2.5]
    assert by_key["ceiling"]["ratios"]["to_job"]["sustained_rps"]["median"] == pytest.approx((5 + 10 / 3) / 2)


def test_index_records_keep_the_datasets_sizes_and_read_back() -> None:
    ds = build(DatasetSpec(backlog=300, live_pool=0))
    feed = IndexFeed(ds, backlog=1000, live_pool=50)  # longer than the dataset: it cycles
    recs = list(feed.records(0, feed.size))
    assert [read_index(v) for v, _, _ in recs] == list(range(1050))
    assert [len(v) for v, _, _ in recs[:300]] == [len(v) for v in ds.avro]
    assert recs[700][1:] == (ds.keys[100], ds.partitions[100])
    assert read_index(b"not a number") is None and read_index(None) is None
    assert index_record(7, b"x" * 20)[:12] == b"000000000007"


def test_the_ceilings_exactness_check() -> None:
    tally = IndexTally(10)
    for i in range(8):
        tally.add("t", index_record(i, b"x" * 30))
    assert feed_exact(tally, 8).exact
    assert not feed_exact(tally, 9).exact and feed_exact(tally, 9).missing == 1  # record 8 never came
    tally.add("t", index_record(3, b"x" * 30))  # a record twice
    ex = feed_exact(tally, 8)
    assert (ex.exact, ex.missing, ex.twice, ex.unexpected) == (False, 0, 1, 1)
    assert "record 3 read 2 times" in ex.examples
    tally.add("t", b"garbage")
    tally.add("t", index_record(99, b"x" * 30))  # out of the stream
    assert tally.unreadable == 2 and feed_exact(tally, 8).unexpected == 3
    # records of the latency phase beyond what was given count as unexpected
    more = IndexTally(10)
    for i in range(10):
        more.add("t", index_record(i, b"x" * 30))
    assert index_exactness(more.counts, 8, 0).unexpected == 2


def feed_exact(tally: IndexTally, processed: int) -> Any:
    return index_exactness(tally.counts, processed, tally.unreadable)


def test_ceiling_runs_with_the_jobs_sink_and_source_settings() -> None:
    cfg = Settings().with_overrides(
        kafka={"bootstrap_servers": "b:1", "group_id": "g", "sink_linger_ms": 7},
        topics={"requests": "in"}, flink={"transactional_id_prefix": "tp", "transaction_timeout_ms": 99_000},
    )
    ddl, insert = ceiling.statements(cfg, "out")
    text = "\n".join(ddl)
    for key, value in flink_conf.kafka_sink(cfg).items():
        assert f"'properties.{key}' = '{value}'" in ddl[1]
    assert "'properties.isolation.level' = 'read_committed'" in ddl[0]
    assert "'sink.delivery-guarantee' = 'exactly-once'" in ddl[1]
    assert "'sink.transactional-id-prefix' = 'tp'" in ddl[1] and "'topic' = 'in'" in ddl[0]
    assert text.count("'format' = 'raw'") == 2 and insert == "INSERT INTO passthrough SELECT data FROM requests"
    conf = ceiling.peer_settings(cfg)
    assert conf["execution.checkpointing.mode"] == "EXACTLY_ONCE"
    assert not any(k.startswith("python.") for k in conf)


def test_cells_show_the_spread_only_over_several_runs() -> None:
    assert report.cell(None) == "–"
    assert report.cell({"median": 1234.4, "min": 1000, "max": 1500, "n": 3}) == "1,234 (1,000–1,500)"
    assert report.cell({"median": 0.25, "min": 0.25, "max": 0.25, "n": 1}, "{:.0f}%", 100) == "25%"


def results_with(runs: list[dict[str, Any]], engines_figures: dict[str, Any] | None = None) -> dict[str, Any]:
    ds = build(DatasetSpec(backlog=200, live_pool=0))
    return {
        "started_at": "now", "mode": "test", "command": "pytest", "checkpoint_ms": 2000, "live_s": 5.0,
        "max_live_rate": 10_000, "repeats": 2, "order": ["ceiling#0", "job-p1#0"], "ceiling_backlog": 1000,
        "machine": {"nproc": 2, "loadavg_at_start": [0, 0, 0], "loadavg_at_end": [0, 0, 0]},
        "dataset": ds.summary(), "latency_floor": {"rate": 10_000, "p50_ms": 4.0, "p99_ms": 12.5},
        "warmup": {"records": 100_000, "transaction": 10_000, "settled": True, "broker_idle_cpu_per_s": 0.02,
                   "rounds": [{"broker_us_per_record": 9.0}, {"broker_us_per_record": 4.0}]},
        "runs": runs, "systems": stats.summarize(runs), "engines": engines_figures,
    }


def test_report_tables() -> None:
    runs = [run("ceiling", 0, 100_000.0, 5), run("job-p1", 0, 20_000.0, 60),
            run("ceiling", 1, 80_000.0, 5), run("job-p1", 1, 24_000.0, 40)]
    figures = {
        "key_mix": {"checks": 1000, "mean_key_chars": 39.0, "new_share": 0.8, "repeats_of": 10_000,
                    "redis_checks": 100},
        "target_checks_per_s": 500_000, "design_bytes_per_key": 100, "redis_error": None,
        "rates": [{"engine": "MemoryDedup", "variant": "strings", "threads": 1, "checks_per_s": 750_000.0,
                   "cpu_us_per_check": 1.3, "exact": True}],
        "memory": [{"engine": "MemoryDedup", "variant": "strings", "keys": 1000,
                    "bytes_per_key_tracemalloc": 330.0, "bytes_per_key_rss": 380.0}],
    }
    table = report.markdown(results_with(runs, figures))
    assert "| exactly-once | 2 | 22,000 (20,000–24,000) | 25% (20%–30%) |" in table
    assert "p99 12.5 ms" in table and "9.0 → 4.0" in table
    assert "| ceiling#1 | ok | 80,000 |" in table
    assert "| MemoryDedup | strings | 1 | 750,000 | 150% |" in table
    assert "| 330 | 380 | – | 3.3× |" in table


def test_key_mix_is_80_percent_new_40_char_keys_repeating_recent_ones() -> None:
    keys = engines.key_mix(20_000, seed=1)
    assert len(keys) == 20_000 and {len(k) for k in keys} == {40}
    first_at = {}
    for i, k in enumerate(keys):
        first_at.setdefault(k, i)
    assert 0.78 < len(first_at) / len(keys) < 0.82
    newest = sorted(first_at.values())
    # a repeat is of one of the 10,000 newest keys at its time
    for i, k in enumerate(keys):
        if first_at[k] != i:
            assert sum(1 for j in newest if first_at[k] < j < i) < 10_000


@pytest.mark.parametrize("hashed", [False, True])
def test_memory_rate_on_threads_is_exact(hashed: bool) -> None:
    keys = engines.key_mix(5000, seed=2)
    for threads in (1, 3):
        r = engines.memory_rate(keys, threads, hashed)
        assert r["new"] == r["held"] == len(set(keys)) and r["checks_per_s"] > 0
    assert [list(r) for r in engines._slices(10, 3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_sustained_rate_over_the_second_half_leaves_the_warm_up_out() -> None:
    # commits every 2 s: 1,000 outputs/s while warming up, then 2,000/s
    bursts = [(10.0, 500), (12.0, 2000), (14.0, 2000), (16.0, 4000), (18.0, 4000), (20.0, 300)]
    total = sum(n for _, n in bursts)
    whole = sustained_rate(bursts, total, total, bursty=True)
    second = sustained_rate(bursts, total, total, bursty=True, window=(0.5, 1.0))
    first = sustained_rate(bursts, total, total, bursty=True, window=(0.0, 0.5))
    assert (whole["rate"], whole["intervals"]) == (1500.0, 4)
    assert (second["rate"], second["intervals"]) == (2000.0, 1)  # from the burst reaching half, to the 2nd-to-last
    assert first["rate"] == pytest.approx(8000 / 6)
    steady = [(10 + i * 0.05, 50) for i in range(200)]  # continuous: within 10% .. 90% of the output
    assert sustained_rate(steady, 10_000, 10_000, bursty=False, window=(0.5, 1.0))["rate"] == pytest.approx(
        1000.0, rel=0.03)


def test_the_whole_stream_is_in_the_past() -> None:
    """The job holds a request more than dedup.max_future_ms ahead of the wall clock invalid."""
    import time

    spec = DatasetSpec(backlog=20_000, live_pool=5000, step_ms=50)
    assert spec.start_ms is not None and spec.start_ms % 3_600_000 == 0
    ds = build(spec)
    newest = max(codec.decode_request(v).event_time for v in ds.avro[-500:])
    assert newest < time.time() * 1000
    assert DatasetSpec(backlog=10, live_pool=0, start_ms=5).stream_spec().start_ms == 5


def test_cpu_between_two_times_is_interpolated_from_the_samples() -> None:
    sampler = ProcSampler()
    sampler.series["g"] = [(10.0, 1.0), (11.0, 1.5), (12.0, 3.5)]
    assert sampler.cpu_in("g", 10.0, 12.0) == pytest.approx(2.5)
    assert sampler.cpu_in("g", 10.5, 11.5) == pytest.approx(2.5 - 1.25)
    assert sampler.cpu_in("g", 9.0, 11.0) is None and sampler.cpu_in("h", 10.0, 11.0) is None
