"""Campaigns through the API's own process on the real broker: 1,000 users at 200/s, paused and
resumed, the API killed (SIGKILL) mid-way and started again: exactly 1,000 requests, one per user."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from api.scopes import Scope
from operators.records import Category
from tests.api.conftest import RunningApi, api_settings
from tests.senders.conftest import read_records, wait_until

pytestmark = pytest.mark.integration


def test_a_campaign_paused_resumed_and_killed_once_writes_each_user_exactly_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    cfg = api_settings(kafka_bootstrap, tmp_path)
    api = RunningApi(cfg, tmp_path).start()
    try:
        marketing = api.token("growth", categories=(Category.MARKETING,), scopes=(Scope.CAMPAIGNS,), rate=500)
        shop = api.token("shop")  # send, status:read: no campaigns
        users = [f"user-{i}" for i in range(1000)]
        body = {"template": "eid_sale", "segment": users + users[:5], "params": {"pct": "20"}, "rate": 200}
        with api.client(shop) as c:
            assert c.post("/v1/campaigns", json=body).status_code == 403
        with api.client(marketing) as c:
            created = c.post("/v1/campaigns", json=body)
            assert created.status_code == 202, created.text
            cid = created.json()["campaign_id"]
            assert created.json()["status_url"] == f"/v1/campaigns/{cid}"

            def progress() -> dict:  # type: ignore[type-arg]
                return c.get(f"/v1/campaigns/{cid}").json()  # type: ignore[no-any-return]

            wait_until(lambda: progress()["written"] >= 200, 30, lambda: str(progress()))
            paused = c.post(f"/v1/campaigns/{cid}/pause")
            assert paused.status_code == 200 and paused.json()["state"] == "paused"
            assert c.post(f"/v1/campaigns/{cid}/pause").status_code == 409
            time.sleep(1.0)  # the batch in flight lands
            held = progress()["written"]
            time.sleep(1.5)
            assert progress()["written"] == held < 1000 and progress()["total"] == 1000
            assert len(read_records(kafka_bootstrap, cfg.topics.requests, "notification_request")) == held
            assert c.post(f"/v1/campaigns/{cid}/resume").json()["state"] == "running"
            wait_until(lambda: progress()["written"] >= held + 200, 30, lambda: str(progress()))
        api.stop(signal.SIGKILL)
        api.start()
        with api.client(marketing) as c:
            wait_until(lambda: c.get(f"/v1/campaigns/{cid}").json()["state"] == "done", 60,
                       lambda: c.get(f"/v1/campaigns/{cid}").text)
            done = c.get(f"/v1/campaigns/{cid}").json()
            assert (done["written"], done["total"], done["rate"]) == (1000, 1000, 200.0)
            assert c.post(f"/v1/campaigns/{cid}/resume").status_code == 409
            assert c.get("/v1/campaigns/camp-nope").status_code == 404
    finally:
        if api.proc is not None:
            api.stop()
    records = read_records(kafka_bootstrap, cfg.topics.requests, "notification_request")
    assert len(records) == 1000
    assert sorted(r["dedup_key"] for r in records) == sorted(f"growth/{cid}:{u}" for u in users)
    assert {(r["template_id"], r["priority"], r["category"], tuple(r["channels"])) for r in records} == {
        ("eid_sale", "normal", "marketing", ("push", "sms", "email"))}
    assert {r["params"]["pct"] for r in records} == {"20"}


def test_a_campaign_waits_while_the_senders_are_behind_on_its_channels(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Back-pressure (api.backlog): the SMS lane's sender group has consumed nothing of the 10
    messages on its lane (offsets 0 committed), more than the bound of 5, so the campaign writes
    nothing; once the group has consumed them (its offsets committed at the end) the campaign
    writes all of its users, each once. The 10 messages on the email lane, which no sender group
    has consumed from, never hold it."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from operators.records import Channel, Priority
    from senders.runtime.pool import group_id
    from senders.statuses import Lane

    cfg = api_settings(kafka_bootstrap, tmp_path, api={"campaign_max_backlog": 5})
    lane = cfg.topics.channel_topic(Channel.SMS, Priority.NORMAL)
    group = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group_id(cfg, Channel.SMS, Lane.NORMAL),
                      "enable.auto.commit": False})
    group.commit(offsets=[TopicPartition(lane, p, 0) for p in (0, 1)], asynchronous=False)  # it consumed nothing
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    unserved = cfg.topics.channel_topic(Channel.EMAIL, Priority.NORMAL)  # no sender group: not counted
    for i in range(10):
        producer.produce(lane, key=f"waiting-{i}".encode(), value=b"x", partition=i % 2)
        producer.produce(unserved, key=f"waiting-{i}".encode(), value=b"x", partition=i % 2)
    assert producer.flush(30) == 0
    api = RunningApi(cfg, tmp_path).start()
    try:
        marketing = api.token("growth", categories=(Category.MARKETING,), scopes=(Scope.CAMPAIGNS,), rate=500)
        users = [f"user-{i}" for i in range(50)]
        with api.client(marketing) as c:
            created = c.post("/v1/campaigns", json={"template": "eid_sale", "segment": users,
                                                     "params": {"pct": "20"}, "rate": 200})
            assert created.status_code == 202, created.text
            cid = created.json()["campaign_id"]
            wait_until(lambda: c.get(f"/v1/campaigns/{cid}").json()["state"] == "running", 30,
                       lambda: c.get(f"/v1/campaigns/{cid}").text)
            time.sleep(3.0)  # 200/s would have written every user 2.75 s ago
            assert c.get(f"/v1/campaigns/{cid}").json()["written"] == 0
            assert read_records(kafka_bootstrap, cfg.topics.requests, "notification_request") == []
            assert _metric(api.url, "api_campaigns_held") == 1.0  # what an operator sees of it

            ends = [TopicPartition(lane, p, group.get_watermark_offsets(TopicPartition(lane, p), timeout=10)[1])
                    for p in (0, 1)]
            assert sum(tp.offset for tp in ends) == 10
            group.commit(offsets=ends, asynchronous=False)
            group.close()
            wait_until(lambda: c.get(f"/v1/campaigns/{cid}").json()["state"] == "done", 30,
                       lambda: c.get(f"/v1/campaigns/{cid}").text)
            assert _metric(api.url, "api_campaigns_held") == 0.0
            assert _metric(api.url, "api_campaign_held_seconds_total") >= 3.0
    finally:
        api.stop()
    records = read_records(kafka_bootstrap, cfg.topics.requests, "notification_request")
    assert sorted(r["dedup_key"] for r in records) == sorted(f"growth/{cid}:{u}" for u in users)


def _metric(url: str, name: str) -> float:
    """One unlabelled series of the API's /metrics."""
    import httpx

    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")
