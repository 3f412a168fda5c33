"""``dedupctl senders run`` with no provider set, as a new user runs it: every channel writes to
the outbox under the data directory, says so once per channel (and where), and records each
message as sent with the outbox's id as the provider's reference (until issue 23 it exited with
"no provider for push"). It runs as a service would, in a session of its own, with
``senders.nice`` set: its workers run below the other services on the CPU (ops/priority.py), and
in the CPU-idle group where the host allows it (``senders.cpu_idle``, ops/cpu_idle.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from harness.ports import free_port
from operators.records import Channel
from senders.runtime.pool import open_status_store
from senders.statuses import DeliveryStatus
from settings import REPO_ROOT
from tests.ops.helpers import cpu_group_of, idle_group_path, writable_cpu_hierarchy
from tests.senders.conftest import SettingsFactory, address_of, channel_message, produce_messages, wait_until
from tests.senders.processes import sender_env

pytestmark = pytest.mark.integration


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return str(answer.read().decode("utf-8"))


def test_senders_run_without_a_provider_writes_each_message_to_the_outbox_and_records_it_sent(
    senders_settings: SettingsFactory, kafka_bootstrap: str, tmp_path: Path
) -> None:
    cfg = senders_settings(partitions=1, users=3)
    env = sender_env(cfg)
    for channel in Channel:  # the test settings name the fake: a new user's settings name nothing
        env.pop(f"DEDUP_SENDERS_{channel.value.upper()}_PRIMARY")
    data = tmp_path / "data"
    env["DEDUP_DATA_DIR"] = str(data)
    env["DEDUP_TOPICS_SMS"], env["DEDUP_TOPICS_SMS_PRIORITY"] = cfg.topics.sms, cfg.topics.sms_priority
    env["DEDUP_SENDERS_NICE"] = "5"
    hierarchy = writable_cpu_hierarchy()  # and, where this host allows, in the CPU-idle group
    if hierarchy is not None:
        env["DEDUP_SENDERS_CPU_IDLE"] = "true"
        env["DEDUP_SENDERS_METRICS_PORT"] = str(metrics_port := free_port())
    log = tmp_path / "senders.log"
    produce_messages(kafka_bootstrap, cfg.topics.sms, [channel_message(n) for n in range(3)])
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dedupctl.cli", "senders", "run", "--channel", "sms", "--max-seconds", "120"],
            cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    nice_before = os.getpriority(os.PRIO_PROCESS, 0)
    store = open_status_store(cfg)
    try:
        def all_sent() -> bool:
            rows = [store.get(f"k{n}:sms") for n in range(3)]
            return all(r is not None and r.status is DeliveryStatus.SENT for r in rows)

        wait_until(lambda: all_sent() or proc.poll() is not None, 90, lambda: log.read_text()[-3000:], 0.2)
        assert proc.poll() is None, log.read_text()[-3000:]
        rows = {n: store.get(f"k{n}:sms") for n in range(3)}
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == max(5, nice_before)
        if hierarchy is not None:
            assert cpu_group_of(proc.pid) == idle_group_path(hierarchy)
            wait_until(lambda: "sender_cpu_idle_group_idle" in scrape(metrics_port), 30, lambda: "no guard metric")
            text = scrape(metrics_port)  # the guard's windows: the group idle, never relieved here
            assert "sender_cpu_idle_group_idle 1" in text and "sender_cpu_idle_group_reliefs_total 0" in text
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        store.close()
    assert code == 0, log.read_text()[-3000:]

    folder = data / "outbox" / "sms"
    records = {r["message_key"]: r for r in (json.loads(p.read_text(encoding="utf-8")) for p in folder.glob("*.json"))}
    assert sorted(records) == ["k0:sms", "k1:sms", "k2:sms"]
    for n, row in rows.items():
        record = records[f"k{n}:sms"]
        assert row is not None and (row.provider, row.provider_ref) == ("outbox", record["id"])
        assert (record["to"], record["template"], record["parts"]["text"]) == (
            address_of(f"user-{n}", Channel.SMS), "tmpl", "A test notification.")
    text = log.read_text(encoding="utf-8")
    said = [line for line in text.splitlines() if "writes its messages to the outbox" in line]
    assert len(said) == 1 and "WARNING" in said[0], said  # once, for the one channel it serves
    assert f"sms: primary outbox (outbox): writes its messages to the outbox in {folder.resolve()}," in said[0]
    for n in range(3):
        assert address_of(f"user-{n}", Channel.SMS) not in text  # addresses stay in the outbox's files
