"""The API's ``GET /metrics``: open on its own listener, answers counted by route template and
status, the accept and Kafka acknowledgement latencies, repeats, 429s by caller, and nothing a
caller wrote (a user id, a key, a token, a path, a method) in it. (Summed over several processes:
tests/api/test_processes.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.metrics import LATENCY_BUCKETS
from api.scopes import Scope
from operators import metric_names as names
from tests.api.conftest import RunningApi, api_settings
from tests.senders.conftest import register_users

pytestmark = pytest.mark.integration

USER = "u-7f3c-private"
BODY = {"user_id": USER, "template": "order_shipped", "params": {"order": "secret-order-99"}, "channels": ["sms"]}


@pytest.fixture(scope="module")
def api(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    root: Path = tmp_path_factory.mktemp("metrics")
    cfg = api_settings(kafka_bootstrap, root)
    register_users(cfg, [USER])
    running = RunningApi(cfg, root).start()
    yield running
    running.stop()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_the_answers_by_route_template_and_never_show_what_a_caller_sent(api: RunningApi) -> None:
    token = api.token("metered", rate=4, scopes=(Scope.SEND, Scope.STATUS_READ))
    with api.client(token) as c:
        first = c.post("/v1/notifications", json=BODY, headers={"Idempotency-Key": "key/with/secret-1"})
        assert first.status_code == 202, first.text
        assert c.post("/v1/notifications", json=BODY, headers={"Idempotency-Key": "key/with/secret-1"}).status_code == 200
        other = {**BODY, "params": {"order": "another"}}
        assert c.post("/v1/notifications", json=other, headers={"Idempotency-Key": "key/with/secret-1"}).status_code == 422
        codes = [c.post("/v1/notifications", json=BODY, headers={"Idempotency-Key": f"burst-{n}"}).status_code
                 for n in range(12)]
        assert 429 in codes
        assert c.get(f"/v1/users/{USER}/notifications").status_code == 200
        assert c.get("/v1/notifications/key/with/secret-1").status_code == 200
        assert c.request("PROPFIND", "/v1/notifications").status_code == 405  # a method of no route
        assert c.get("/v1/no-such-route-secret-path").status_code == 404
    assert httpx.get(api.url + "/v1/users/x", headers={"Authorization": "Bearer ndk_" + "A" * 43}).status_code == 401

    reply = httpx.get(api.url + "/metrics", timeout=10)  # no token: the API's own listener
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    text = reply.text
    found = samples(text)
    post = {"method": "POST", "route": "/v1/notifications"}
    accepted = 1 + codes.count(202)  # the burst's first ones are within the rate
    assert value(found, names.API_REQUESTS, **post, status="202") == accepted
    assert value(found, names.API_REQUESTS, **post, status="200") == 1
    assert value(found, names.API_REQUESTS, **post, status="422") == 1
    assert value(found, names.API_REQUESTS, **post, status="429") == codes.count(429)
    assert value(found, names.API_REQUESTS, method="GET", route="/v1/users/{user_id}/notifications", status="200") == 1
    assert value(found, names.API_REQUESTS, method="GET", route="/v1/notifications/{notification_id}",
                 status="200") == 1
    assert value(found, names.API_REQUESTS, method="GET", route="unmatched", status="404") == 1
    assert value(found, names.API_REQUESTS, method="GET", route="/v1/users/{user_id}", status="401") == 1
    assert any(dict(labels).get("method") == "other" for (name, labels) in found if name == names.API_REQUESTS)
    assert value(found, names.API_IDEMPOTENT_REPEATS, outcome="replay") == 1
    assert value(found, names.API_IDEMPOTENT_REPEATS, outcome="other_body") == 1
    assert value(found, names.API_RATE_LIMITED, caller="metered", bucket="send") == codes.count(429)
    assert value(found, names.API_ACCEPT_SECONDS + "_count", status="202") == accepted
    bounds = {float(dict(labels)["le"]) for (name, labels) in found if name == names.API_ACCEPT_SECONDS + "_bucket"}
    assert set(LATENCY_BUCKETS) <= bounds and {0.005, 0.01, 0.025, 0.05, 0.1} <= bounds
    assert value(found, names.API_KAFKA_ACK_SECONDS + "_count") == accepted
    assert value(found, names.API_LOOP_LAG_SECONDS + "_count") > 0
    assert value(found, names.API_RESERVATION_BATCH + "_count") >= 1
    assert value(found, names.API_LEADER) == 1
    assert {name.removesuffix("_total") for name in names.API_METRICS} <= {f.name for f in
                                                                          text_string_to_metric_families(text)}
    for secret in (USER, "secret", "key/with", token, "ndk_", "PROPFIND", "another"):
        assert secret not in text, secret
