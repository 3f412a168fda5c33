"""Smoke test of the benchmark harness (bench/): its parsers, checks and one peer end to end.

The whole `make bench` takes minutes; this checks the pieces it is built from, and runs the
in-memory peer through the real sequence (load, watch, latency phase, exactness) on the test
broker with a tiny dataset.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from bench import report, stats
from bench.dataset import DatasetSpec, build
from bench.measure import (
    ProcSampler,
    compare,
    parse_channel_message,
    parse_duplicate_notice,
    sustained_rate,
)
from bench.peers.common import accepted_outputs, duplicate_output, prefixed_topics
from bench.peers.loop import MemoryStore, RedisStore
from harness.streamgen import StreamSpec, generate
from operators import codec
from operators.dedup_key import resolve_dedup_key
from operators.records import Channel, NotificationRequest, Priority
from settings import REPO_ROOT, Settings

pytestmark = pytest.mark.integration

REQ = NotificationRequest(
    notification_id="n1", user_id="u1", template_id="otp", channels=(Channel.SMS, Channel.EMAIL),
    event_time=1_796_115_600_000, params={"code": "1234", "é": "ü"}, priority=Priority.HIGH,
)


def test_fast_parsers_read_what_the_codec_writes() -> None:
    topics = prefixed_topics("x", "x.requests")
    key = resolve_dedup_key(REQ)
    outs = accepted_outputs(REQ, key, topics)
    assert [t for t, _, _ in outs] == [topics.sms_priority, topics.email_priority]
    for (_, _, value), channel in zip(outs, ("sms", "email"), strict=True):
        assert codec.decode("channel_message", value)["channel"] == channel
        assert parse_channel_message(value, "priority") == ("a", "n1", channel, "priority")
    _, dkey, notice = duplicate_output(REQ, key, "n0", 5, 2, topics)
    assert dkey == key.encode()
    assert codec.decode("duplicate_notice", notice)["occurrence"] == 2
    assert parse_duplicate_notice(notice) == ("d", "n1", "n0")


def test_compare_finds_missing_unexpected_and_twice() -> None:
    want = Counter({("a", "n1", "sms", "normal"): 1, ("d", "n2", "n1"): 1})
    assert compare(want, Counter(want)).exact
    got = Counter({("a", "n1", "sms", "normal"): 2, ("x", "late", "..."): 1})
    ex = compare(want, got)
    assert (ex.exact, ex.missing, ex.unexpected, ex.twice) == (False, 1, 2, 1)


def test_sustained_rate_bursty_and_continuous() -> None:
    # commits every 2 s of 2,000 outputs: 1,000 outputs/s, whatever the first and last bursts hold
    bursts = [(10.0, 500), (12.0, 2000), (14.0, 2000), (16.0, 2000), (18.0, 300)]
    r = sustained_rate(bursts, 6800, 6800, bursty=True)
    assert r["rate"] == pytest.approx(1000.0) and r["bursts"] == 5
    steady = [(10 + i * 0.05, 50) for i in range(200)]  # 1,000 outputs/s, continuously
    r = sustained_rate(steady, 10_000, 5_000, bursty=False)
    assert r["rate"] == pytest.approx(500.0, rel=0.02)
    assert sustained_rate(steady, 20_000, 10_000, bursty=False)["rate"] is None  # never completed


def test_dataset_expected_output_and_json_copy() -> None:
    ds = build(DatasetSpec(backlog=2000, live_pool=500, param_bytes=240))
    assert len(ds) == 2500 and ds.outputs_cum[-1] == sum(map(len, ds.expected))
    summary = ds.summary()
    assert 250 < summary["backlog_duplicates"] < 550
    assert 280 < summary["mean_avro_bytes"] < 330
    for i in range(0, 2500, 97):
        rec = json.loads(ds.json[i])
        req = codec.decode_request(ds.avro[i])
        assert rec["notification_id"] == req.notification_id == ds.nids[i]
        # the Flink SQL peer derives the key as COALESCE(NULLIF(dedup_key, ''), SHA256(...)[1..32])
        derived = rec["dedup_key"] or hashlib.sha256(
            f"{rec['user_id']}|{rec['template_id']}|{rec['params']}".encode()).hexdigest()[:32]
        assert derived == resolve_dedup_key(req)


def test_memory_store_follows_the_reference_with_mixed_windows() -> None:
    stream = generate(StreamSpec(requests=3000, late_share=0.0, invalid_share=0.0, step_ms=200, seed=3))
    cfg = Settings().dedup.window_config()
    store = MemoryStore(cfg, partitions=4)
    # partitions consumed at different paces: partition 0 first, then the others, as a consumer may
    recs = [r for r in stream.records if r.request is not None]
    order = [r for r in recs if r.partition == 0] + [r for r in recs if r.partition != 0]
    got_by_id = {}
    for rec in order:
        assert rec.request is not None
        [verdict] = store.decide([(rec.request, resolve_dedup_key(rec.request), rec.partition)])
        got_by_id[rec.request.notification_id] = verdict
    got = [got_by_id[r.request.notification_id] for r in recs if r.request is not None]
    want = stream.outcomes(cfg)
    assert [v is None for v in got] == [o.verdict == "new" for o in want]
    assert [v[0] for v in got if v] == [o.original_notification_id for o in want if o.verdict == "duplicate"]
    assert store.evicted > 0  # the short windows were evicted on the way


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_redis_store_set_nx_get(tmp_path: Path) -> None:
    pytest.importorskip("redis")
    from harness.ports import free_port

    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                store = RedisStore(Settings().dedup.window_config(), port)
                break
            except Exception:  # noqa: BLE001 - not listening yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        a = NotificationRequest("a", "u", "t", (Channel.PUSH,), 1000, dedup_key="k")
        b = NotificationRequest("b", "u", "t", (Channel.PUSH,), 1500, dedup_key="k")
        c = NotificationRequest("c", "u", "t", (Channel.PUSH,), 2000, dedup_key="k")
        assert store.decide([(a, "k", 0), (b, "k", 0)]) == [None, ("a", 1000, 2)]
        assert store.decide([(c, "k", 0)]) == [("a", 1000, 3)]
        # 2 s windows: d is outside a's window (new), e repeats d within the same batch
        d = NotificationRequest("d", "u", "t", (Channel.PUSH,), 9000, dedup_key="k2", dedup_ttl_sec=2)
        e = NotificationRequest("e", "u", "t", (Channel.PUSH,), 9500, dedup_key="k2", dedup_ttl_sec=2)
        f = NotificationRequest("f", "u", "t", (Channel.PUSH,), 12000, dedup_key="k2", dedup_ttl_sec=2)
        g = NotificationRequest("g", "u", "t", (Channel.PUSH,), 12100, dedup_key="k2", dedup_ttl_sec=2)
        assert store.decide([(d, "k2", 0), (e, "k2", 0), (f, "k2", 0), (g, "k2", 0)]) == [
            None, ("d", 9000, 2), None, ("f", 12000, 2)]
        assert store.stats()["state_bytes"] > 0
    finally:
        server.terminate()
        server.wait(10)


def test_flink_sql_peer_plans_a_deduplication() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.peers.flink_sql", "--bootstrap", "127.0.0.1:1", "--input", "i",
         "--accepted", "a", "--duplicates", "d", "--group", "g", "--txn-prefix", "t",
         "--checkpoint-dir", "/tmp/unused", "--rest-port", "1", "--explain"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    plan = out.stdout.split("== Optimized Execution Plan ==")[-1]
    assert "Deduplicate(keep=[FirstRow], key=[k], order=[PROCTIME]" in plan
    assert "OverAggregate(partitionBy=[k]" in plan


def test_ceiling_plans_a_raw_pass_through(tmp_path: Path) -> None:
    config = tmp_path / "job.toml"
    config.write_text('[kafka]\nbootstrap_servers = "127.0.0.1:1"\n[topics]\nrequests = "in"\n'
                      f'[flink]\ncheckpoint_dir = "{tmp_path / "ck"}"\nrest_port = 1\n')
    out = subprocess.run(
        [sys.executable, "-m", "bench.peers.ceiling", "--config", str(config), "--output", "out", "--explain"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    plan = out.stdout.split("== Optimized Execution Plan ==")[-1]
    assert "TableSourceScan(table=[[default_catalog, default_database, requests]], fields=[data])" in plan
    assert "Calc" not in plan and "Exchange" not in plan  # bytes in, bytes out, one chain


def bench_args(**extra: float) -> argparse.Namespace:
    return argparse.Namespace(backlog_timeout_s=120.0, max_live_rate=500, live_fraction=0.8, live_s=2.0,
                              live_pool=1000, broker_idle_cpu_per_s=0.01, live_rates=None,
                              checkpoint_poll_s=0.2, **extra)


def test_memory_peer_end_to_end(kafka_bootstrap: str, tmp_path: Path) -> None:
    from bench.feeds import DatasetFeed
    from bench.run import latency_floor, run_system
    from bench.systems import Context, make

    ds = build(DatasetSpec(backlog=3000, live_pool=1000, partitions=2, param_bytes=240))
    run_id = f"t{time.monotonic_ns() % 10**6}"
    ctx = Context(bootstrap=kafka_bootstrap, work=tmp_path, run_id=run_id, partitions=2, checkpoint_ms=500,
                  prime_topic=f"bench{run_id}.prime")
    sampler = ProcSampler()
    sampler.start()
    try:
        floor = latency_floor(ctx, ds, sampler, rate=500, seconds=1)
        r = run_system(make("memory"), ctx, DatasetFeed(ds), bench_args(), sampler, 0)
    finally:
        sampler.stop()
    assert floor["seen"] == floor["requests"] == 500 and floor["p99_ms"] < 5000
    assert r["status"] == "ok", r.get("error")
    assert r["exactness"]["exact"], r["exactness"]
    assert r["exactness"]["requests"] == 3000 + r["latency"]["requests"]
    assert r["latency"]["seen"] == r["latency"]["requests"] > 0
    assert r["latency"]["p50_ms"] is not None and r["backlog"]["with_startup_rps"] > 0
    assert r["state"]["keys"] == ds.new_cum[r["exactness"]["requests"]]
    assert r["harness"]["cpu_s"] > 0  # the watcher and the producer (the test broker is not sampled)
    runs = [r, {**r, "round": 1}]
    results = {
        "started_at": "now", "mode": "test", "command": "pytest", "checkpoint_ms": 500, "live_s": 2.0,
        "max_live_rate": 500,
        "machine": {"nproc": 2, "loadavg_at_start": [0, 0, 0], "loadavg_at_end": [0, 0, 0]},
        "dataset": ds.summary(), "latency_floor": floor, "runs": runs, "systems": stats.summarize(runs),
    }
    table = report.markdown(results)
    assert "consumer loop + Python dict" in table and "| yes (2 of 2) |" in table
    if report.chart(results, tmp_path / "chart.png"):
        assert (tmp_path / "chart.png").stat().st_size > 10_000


def test_ceiling_end_to_end(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The pass-through on the mini-cluster: every record exactly once, and a sustained rate."""
    from bench.feeds import IndexFeed
    from bench.run import run_system
    from bench.systems import Context, make

    ds = build(DatasetSpec(backlog=1000, live_pool=0, partitions=2, param_bytes=240))
    run_id = f"t{time.monotonic_ns() % 10**6}"
    ctx = Context(bootstrap=kafka_bootstrap, work=tmp_path, run_id=run_id, partitions=2, checkpoint_ms=500)
    sampler = ProcSampler()
    sampler.start()
    try:
        r = run_system(make("ceiling"), ctx, IndexFeed(ds, backlog=60_000, live_pool=1000), bench_args(), sampler)
    finally:
        sampler.stop()
    assert r["status"] == "ok", r.get("error")
    assert r["exactness"]["exact"], r["exactness"]
    assert r["exactness"]["expected"] == 60_000 + r["latency"]["requests"]
    assert r["backlog"]["with_startup_rps"] > 0 and r["latency"]["seen"] == r["latency"]["requests"]
    # the checkpoints were read from its REST API while it ran, and those of the latency phase counted
    assert r["checkpoints_seen"]["completed"] > 0
    assert r["latency"]["checkpoints"] is not None and r["latency"]["cpu_us_per_request"] is not None
    # 60,000 records pass in well under a second, before the REST API even calls every task
    # RUNNING: the CPU is asserted over the run, not over the (near-empty) backlog window
    assert r["cpu"]["cpu_s"] > r["cpu"]["cpu_s_startup"] > 0 and r["system_metrics"]["checkpoints"]["completed"] > 0


def test_commit_clock_counts_what_read_committed_may_read(kafka_bootstrap: str) -> None:
    """The clock follows the last stable offset: an open transaction's records are not there
    yet, its commit brings them and one marker; a plain producer's records count at once."""
    from confluent_kafka import Producer

    from bench.watch import CommitClock
    from ops import kafka_io

    topic = f"clock{time.monotonic_ns() % 10**9}"
    kafka_io.create_topics({"bootstrap.servers": kafka_bootstrap}, [topic], 1)
    clock = CommitClock(kafka_bootstrap, [topic], interval_s=0.05)
    clock.start()
    try:
        txn = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"t-{topic}"})
        txn.init_transactions(30)
        txn.begin_transaction()
        for i in range(300):
            txn.produce(topic, value=b"%d" % i)
        txn.flush(30)
        time.sleep(0.5)
        assert sum(n for _, n in clock.batches) == 0  # written, not committed: not readable
        txn.commit_transaction(30)
        deadline = time.monotonic() + 10
        while sum(n for _, n in clock.batches) < 301 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sum(n for _, n in clock.batches) == 301  # the records and the commit marker
        plain = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": "true"})
        for i in range(100):
            plain.produce(topic, value=b"%d" % i)
        plain.flush(30)
    finally:
        clock.stop()  # one last answer after the poller stops
    assert clock.error is None
    assert sum(n for _, n in clock.batches) == 401
    times = [t for t, _ in clock.batches]
    assert times == sorted(times)
