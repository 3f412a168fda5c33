"""``senders.push_primary = "fcm"`` (or ``apns``) with its table: the sender workers send push
through the real protocol to a local server (HTTP/2 over TLS), and its answers become statuses,
dead letters, deactivated addresses and the credentials alert."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.provider_servers.apns import ApnsServer
from harness.provider_servers.fcm import FcmServer
from harness.provider_servers.h2 import H2Server
from harness.provider_servers.tls import Pki
from operators.records import Channel
from senders.profiles.model import parse_profile
from senders.runtime.pool import build_pool, open_profile_store, open_status_store
from senders.statuses import FINAL_STATUSES, DeliveryStatus, Lane
from tests.senders.conftest import SettingsFactory, channel_message, produce_messages, read_records, wait_until

pytestmark = pytest.mark.integration
PUSH = Channel.PUSH
#: a device token of each user (hex: APNs checks their shape, FCM takes any)
OK, GONE, REFUSED = ("a" * 64, "b" * 64, "c" * 64)
#: each server's answer that deactivates the address, and the one that refuses our credentials
ANSWERS = {"fcm": ("UNREGISTERED", "SENDER_ID_MISMATCH"), "apns": ("Unregistered", "InvalidProviderToken")}


@pytest.fixture(params=["fcm", "apns"])
def spec(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def server(spec: str, pki: Pki) -> Iterator[H2Server]:
    started: H2Server = (FcmServer(pki=pki) if spec == "fcm" else ApnsServer(pki=pki)).start()
    yield started
    started.stop()


def _table(spec: str, server: H2Server, tmp_path: Path) -> dict[str, object]:
    if isinstance(server, FcmServer):
        return {"service_account_json": server.service_account_json(), "base_url": server.origin}
    assert isinstance(server, ApnsServer)
    key = tmp_path / "AuthKey.p8"
    key.write_text(server.p8(), encoding="utf-8")
    return {"key_file": str(key), "team_id": server.team_id, "key_id": server.key_id, "topic": server.topic,
            "base_url": server.origin}


def _devices(server: H2Server) -> list[str]:
    """The device token of every request the server answered, in order."""
    if isinstance(server, FcmServer):
        return [s.json()["message"]["token"] for s in server.sends()]
    return [s.path.removeprefix("/3/device/") for s in server.seen]


def test_push_goes_through_the_providers_protocol_and_its_answers_become_statuses(
    spec: str, server: H2Server, pki: Pki, senders_settings: SettingsFactory, kafka_bootstrap: str, tmp_path: Path
) -> None:
    gone, refused = ANSWERS[spec]
    server.script.update({GONE: [gone], REFUSED: [refused, "ok"]})  # type: ignore[attr-defined]
    cfg = senders_settings(partitions=1, users=0, push_primary=spec, http_ca_file=str(pki.ca_file),
                           **{spec: _table(spec, server, tmp_path)})
    profiles = open_profile_store(cfg)
    for user, device in (("u-ok", OK), ("u-gone", GONE), ("u-refused", REFUSED)):
        profiles.put(user, parse_profile({"contacts": {"push": [device]}}))
    pool = build_pool(cfg, channels=[PUSH], lanes=[Lane.NORMAL])
    store = open_status_store(cfg)

    def settled(n: int) -> bool:
        rows = store.rows()
        return len(rows) == n and all(r.status in FINAL_STATUSES for r in rows)

    with pool:
        produce_messages(kafka_bootstrap, cfg.topics.push, [
            channel_message(i, channel=PUSH, user=u) for i, u in enumerate(("u-ok", "u-gone", "u-refused"))])
        wait_until(lambda: settled(3), 30, lambda: f"three settled: {[(r.message_key, r.status) for r in store.rows()]}")
        # the deactivated address is not tried again; the refused one was never the address's fault
        produce_messages(kafka_bootstrap, cfg.topics.push, [
            channel_message(i, channel=PUSH, user=u) for i, u in ((3, "u-gone"), (4, "u-refused"))])
        wait_until(lambda: settled(5), 30, "five settled")
    assert not pool.errors
    rows = {r.message_key: r for r in store.rows()}
    status = {key: (r.status, r.provider) for key, r in rows.items()}
    assert status == {
        "k0:push": (DeliveryStatus.SENT, spec),
        "k1:push": (DeliveryStatus.FAILED, spec),
        "k2:push": (DeliveryStatus.FAILED, spec),
        "k3:push": (DeliveryStatus.SKIPPED, None),
        "k4:push": (DeliveryStatus.SENT, spec),
    }
    assert rows["k3:push"].reason == "no_address"
    # the provider's message id: FCM's name, APNs' apns-id (derived from the message key)
    reference = rows["k0:push"].provider_ref
    assert reference is not None and (reference.startswith("projects/proj-1/messages/") if spec == "fcm"
                                      else reference == server.seen[0].headers["apns-id"])
    assert sorted(_devices(server)) == [OK, GONE, REFUSED, REFUSED]  # nothing more to the one deactivated
    letters = {d["message_key"]: d["reason_kind"] for d in read_records(kafka_bootstrap, cfg.senders.dlq_topic,
                                                                          "dead_letter")}
    assert letters == {"k1:push": "permanent_failure", "k2:push": "permanent_failure"}
    assert pool.metrics.value("provider_auth_failures_total", provider=spec, channel="push") == 1
