"""Several API processes of one store: ``dedupctl api run --processes 2`` on one port, with one of
them (the lease's holder) running the campaigns, the verdicts' reader and pruning, and another
taking over when it is killed; a caller's rate held across two processes; ``/metrics`` summed
over the processes."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from api import leader, lease
from api.scopes import Scope
from harness.ports import free_port
from operators import codec
from operators.records import Category
from ops import kafka_io
from ops.stacks import STACKS_SIGNAL
from senders.runtime.pool import open_status_store
from settings import Settings
from tests.api.conftest import RunningApi, api_settings
from tests.senders.conftest import read_records, register_users, wait_until

pytestmark = pytest.mark.integration

SHOP_BODY = {"user_id": "nusrat", "template": "order_shipped", "params": {"order": "P-1"}, "channels": ["sms"]}


def holder(cfg: Settings) -> lease.Holder | None:
    store = open_status_store(cfg)
    try:
        return lease.holder(store.db, leader.LEASE, int(time.time() * 1000))
    finally:
        store.close()


def duplicate_notice(cfg: Settings, notification_id: str, dedup_key: str, original: str) -> None:
    """What the job writes when it suppresses a request (its duplicates topic)."""
    now = int(time.time() * 1000)
    producer = kafka_io.producer(cfg.kafka.client_config())
    producer.produce(cfg.topics.duplicates, key=b"nusrat", value=codec.encode("duplicate_notice", {
        "notification_id": notification_id, "dedup_key": dedup_key, "original_notification_id": original,
        "first_seen_event_time": now, "event_time": now, "occurrence": 2}))
    assert producer.flush(10) == 0


def serving(supervisor: psutil.Process) -> list[int]:
    """The API's processes under ``api run --processes`` (not multiprocessing's resource tracker,
    nor one killed that its supervisor has not reaped yet)."""
    found = []
    for p in supervisor.children():
        try:
            if "spawn_main" in " ".join(p.cmdline()):
                found.append(p.pid)
        except psutil.Error:  # a zombie, or gone: not serving
            continue
    return found


def requests_served(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('api_requests_total{method="POST",route="/v1/notifications",status="202"}'))


@pytest.fixture
def two_processes(kafka_bootstrap: str, tmp_path: Path) -> Iterator[RunningApi]:
    cfg = api_settings(kafka_bootstrap, tmp_path, api={"processes": 2, "lease_ttl_ms": 3000, "campaign_poll_ms": 300})
    register_users(cfg, ["nusrat"])
    api = RunningApi(cfg, tmp_path).start()
    try:
        yield api
    finally:
        if api.proc is not None:
            api.stop()


def test_two_processes_on_one_port_one_runs_campaigns_and_verdicts_and_another_takes_over_when_it_dies(
    two_processes: RunningApi,
) -> None:
    api, cfg = two_processes, two_processes.cfg
    assert api.proc is not None
    supervisor = psutil.Process(api.proc.pid)
    wait_until(lambda: len(serving(supervisor)) == 2, 30, lambda: str(supervisor.children()))
    first = holder(cfg)
    assert first is not None and first.pid in serving(supervisor)
    # a spawned process writes its threads' stacks on the signal (ops.stacks), and goes on serving
    os.kill(first.pid, STACKS_SIGNAL)
    wait_until(lambda: "api/writer.py" in api.log.read_text(errors="replace"), 10, lambda: api.log.read_text()[-3000:])

    shop = api.token("shop", rate=1000)
    growth = api.token("growth", categories=(Category.MARKETING,), scopes=(Scope.CAMPAIGNS,), rate=500)
    answers = []
    for n in range(30):  # new connections: the processes take them from the one listening socket
        with api.client(shop) as c:
            reply = c.post("/v1/notifications", json={**SHOP_BODY, "params": {"order": f"P-{n}"}},
                           headers={"Idempotency-Key": f"p-{n}"})
            assert reply.status_code == 202, reply.text
            answers.append(reply.json())
    assert requests_served(api.url) == 30  # whichever process answers, the sum over both

    users = [f"camp-{i}" for i in range(1500)]
    with api.client(growth) as c:
        created = c.post("/v1/campaigns", json={"template": "eid_sale", "segment": users, "params": {"pct": "10"},
                                                "rate": 300})
        assert created.status_code == 202, created.text
        cid = created.json()["campaign_id"]

        def written() -> int:
            return int(c.get(f"/v1/campaigns/{cid}").json()["written"])

        wait_until(lambda: written() >= 300, 60, lambda: f"written {written()}")

    with api.client(shop) as c:
        def verdict(nid: str) -> str:
            return str(c.get(f"/v1/notifications/{nid}").json()["verdict"])

        a = answers[0]
        duplicate_notice(cfg, a["id"], a["dedup_key"], answers[1]["id"])
        wait_until(lambda: verdict(a["id"]) == "duplicate", 30, lambda: verdict(a["id"]))

        os.kill(first.pid, signal.SIGKILL)
        wait_until(lambda: (h := holder(cfg)) is not None and h.pid != first.pid, 30, lambda: str(holder(cfg)))
        taken = holder(cfg)
        assert taken is not None and taken.pid != first.pid and taken.pid in serving(supervisor)

        b = answers[2]
        duplicate_notice(cfg, b["id"], b["dedup_key"], answers[3]["id"])
        wait_until(lambda: verdict(b["id"]) == "duplicate", 60, lambda: verdict(b["id"]))

    with api.client(growth) as c:
        wait_until(lambda: c.get(f"/v1/campaigns/{cid}").json()["state"] == "done", 90,
                   lambda: c.get(f"/v1/campaigns/{cid}").text)
    assert requests_served(api.url) >= 30  # the dead process's counts stay in the sum
    assert api.stop() == 0
    assert holder(cfg) is None  # given up on the way out, not left to expire
    records = read_records(cfg.kafka.bootstrap_servers, cfg.topics.requests, "notification_request")
    campaign = sorted(r["dedup_key"] for r in records if r["template_id"] == "eid_sale")
    assert campaign == sorted(f"growth/{cid}:{u}" for u in users)  # each user once, across the takeover
    assert len(records) == 30 + len(users)


@pytest.fixture
def two_apis(kafka_bootstrap: str, tmp_path: Path) -> Iterator[tuple[RunningApi, RunningApi]]:
    """Two ``api run`` processes on one store, each on its own port: which process answers is known."""
    cfg = api_settings(kafka_bootstrap, tmp_path)
    register_users(cfg, ["nusrat"])
    first = RunningApi(cfg, tmp_path).start()
    (tmp_path / "second").mkdir()
    second = RunningApi(cfg.with_overrides(api={"port": free_port()}), tmp_path / "second").start()
    try:
        yield first, second
    finally:
        for api in (first, second):
            if api.proc is not None:
                api.stop()


def test_a_callers_rate_holds_across_two_processes(two_apis: tuple[RunningApi, RunningApi]) -> None:
    """A caller at 10/s sends about 50/s for 3 s, alternately to two processes: it is admitted at
    most 10 a second in all (each process's own bucket would admit 10 a second each)."""
    a, b = two_apis
    rate = 10
    token = a.token("metered", rate=rate)
    lock = threading.Lock()
    codes: list[int] = []
    retry_after: set[str] = set()
    clients = [httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
               for api in (a, b)]

    def send(n: int, due: float) -> None:
        time.sleep(max(0.0, due - time.monotonic()))
        reply = clients[n % 2].post("/v1/notifications", json={**SHOP_BODY, "params": {"order": f"M-{n}"}},
                                    headers={"Idempotency-Key": f"m-{n}"})
        with lock:
            codes.append(reply.status_code)
            if reply.status_code == 429:
                retry_after.add(reply.headers["Retry-After"])

    started_wall, start = time.time(), time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        for f in [pool.submit(send, n, start + n / 50) for n in range(150)]:
            f.result()
    ended_wall = time.time()
    for c in clients:
        c.close()
    windows = int(ended_wall) - int(started_wall) + 1
    admitted = codes.count(202)
    assert set(codes) == {202, 429}, codes
    assert rate <= admitted <= rate * windows, (admitted, windows, ended_wall - started_wall)
    assert retry_after == {"1"}
