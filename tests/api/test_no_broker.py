"""No broker, still up (issue 20: the API did not start while Kafka was down: its start waited
60 s for the campaigns topic, then exited, and profiles, status reads and the support page went
down with the broker).

The API is started pointed at a port where no broker listens: it starts at once, ``/readyz``
says Kafka is what is missing, profiles, status reads and the support page answer, and a new
notification is 503 with Retry-After at once (not after the whole ack timeout). Then a broker
is started on that port: the API sees it, answers 202, and has made the campaigns topic.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from harness.local_kafka import LocalBroker
from harness.ports import free_port
from ops import kafka_io
from senders.runtime.pool import ensure_topics
from tests.api.conftest import ALL_SCOPES, RunningApi, api_settings
from tests.senders.conftest import register_users, wait_until

pytestmark = pytest.mark.integration

BODY = {"user_id": "offline", "template": "order_shipped", "params": {"order": "K-1"}, "channels": ["sms"]}


def test_without_a_broker_the_api_serves_all_but_new_notifications_and_takes_them_once_one_answers(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    port = free_port()
    ack_timeout_ms = 5000
    cfg = api_settings(kafka_bootstrap, tmp_path).with_overrides(
        kafka={"bootstrap_servers": f"127.0.0.1:{port}"},
        api={"ack_timeout_ms": ack_timeout_ms, "kafka_probe_interval_ms": 500},
    )
    register_users(cfg, ["offline"])
    api = RunningApi(cfg, tmp_path)
    started = time.monotonic()
    api.start(timeout_s=30, ready_path="/healthz")
    broker: LocalBroker | None = None
    try:
        assert time.monotonic() - started < 30
        token = api.token("offline-shop", scopes=ALL_SCOPES)
        with api.client(token) as c:
            wait_until(lambda: "unreachable" in c.get("/readyz").json()["checks"]["kafka"], 20,
                       lambda: c.get("/readyz").text)
            ready = c.get("/readyz")
            assert ready.status_code == 503
            checks = ready.json()["checks"]
            assert (checks["started"], checks["store"]) == ("ok", "ok") and checks["kafka"].startswith("unreachable")
            # profiles, status reads, the support page
            assert c.put("/v1/users/offline/preferences", json={"tz": "Asia/Dhaka"}).status_code == 200
            assert c.get("/v1/users/offline").json()["tz"] == "Asia/Dhaka"
            assert c.get("/v1/notifications/nothing-yet").status_code == 404
            assert c.get("/v1/support/users/offline/notifications").json()["notifications"] == []
            assert c.get("/support").status_code == 200
            # a new notification: 503 at once, with Retry-After, and the key is free for the retry
            for _ in range(3):
                t0 = time.monotonic()
                refused = c.post("/v1/notifications", json=BODY, headers={"Idempotency-Key": "k-offline"})
                took = time.monotonic() - t0
                assert (refused.status_code, refused.json()["error"]) == (503, "kafka_unavailable"), refused.text
                assert refused.headers["Retry-After"] == "1"
                assert took < ack_timeout_ms / 1000 / 2, took
            causes = {line for line in c.get("/metrics").text.splitlines() if line.startswith("api_unavailable_total")}
            assert 'api_unavailable_total{cause="kafka_down"} 3.0' in causes, causes

            broker = LocalBroker(home=tmp_path / "late-broker", port=port, controller_port=free_port())
            broker.start()
            kafka_io.create_topics(cfg.kafka.client_config(), cfg.topics.all(), cfg.kafka.partitions)
            ensure_topics(cfg)
            wait_until(lambda: c.get("/readyz").status_code == 200, 30, lambda: c.get("/readyz").text)
            taken = c.post("/v1/notifications", json=BODY, headers={"Idempotency-Key": "k-offline"})
            assert taken.status_code == 202, taken.text
            assert c.get(f"/v1/notifications/{taken.json()['id']}").status_code == 200

            def campaigns_topic() -> bool:
                topics = AdminClient(cfg.kafka.client_config()).list_topics(timeout=5).topics
                return cfg.api.campaigns_topic in topics

            wait_until(campaigns_topic, 60, "the campaigns topic, made once the broker answered")
    finally:
        if api.proc is not None:
            api.stop()
        if broker is not None:
            broker.stop()
