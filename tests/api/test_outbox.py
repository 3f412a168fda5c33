"""The outbox in the API: ``GET /v1/outbox`` (``support:read``) and the ``/outbox`` page read the
files the ``outbox`` provider wrote under the data directory, newest first; where no channel
uses the outbox both are 404."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from api.errors import ApiError
from api.outbox_routes import outbox_page
from api.scopes import Scope
from operators.records import Channel
from senders.providers import OutboxProvider
from senders.providers.outbox_files import outbox_root
from settings import Settings
from tests.api.conftest import RunningApi, api_settings
from tests.senders.conftest import sample_message, send_now


def _write(data: Path, sent: list[tuple[str, Channel, str]]) -> list[str]:
    """Each (message key, channel, address) through the outbox provider, in order; their ids."""
    provider = OutboxProvider(root=outbox_root(data))
    ids = []
    for key, channel, to in sent:
        receipt = send_now(provider, to=to, message_key=key, message=sample_message(channel))
        assert receipt.reference is not None
        ids.append(receipt.reference)
    return ids


@pytest.mark.integration
def test_the_outbox_is_served_newest_first_to_support_read_only(kafka_bootstrap: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    cfg = api_settings(kafka_bootstrap, tmp_path, senders={"sms_primary": "outbox"}).model_copy(
        update={"data_dir": str(data)})
    ids = _write(data, [("k0:sms", Channel.SMS, "+8801711000001"), ("k1:email", Channel.EMAIL, "n@example.com"),
                        ("k2:sms", Channel.SMS, "+8801711000002")])
    api = RunningApi(cfg, tmp_path).start(ready_path="/healthz")
    try:
        support = api.token("dev", scopes=(Scope.SUPPORT_READ,))
        sender = api.token("shop", scopes=(Scope.SEND, Scope.STATUS_READ))
        with api.client(support) as c:
            everything = c.get("/v1/outbox").json()
            assert everything["directory"] == str(outbox_root(data))
            assert [(m["id"], m["message_key"]) for m in everything["messages"]] == [
                (ids[2], "k2:sms"), (ids[1], "k1:email"), (ids[0], "k0:sms")]
            first = everything["messages"][2]
            assert (first["channel"], first["to"], first["template"], first["version"], first["locale"]) == (
                "sms", "+8801711000001", "otp", 1, "en")
            assert first["parts"] == {"text": "Your code is 123456.", "encoding": "gsm7", "segments": 1}
            assert [m["message_key"] for m in c.get("/v1/outbox", params={"channel": "sms"}).json()["messages"]] == [
                "k2:sms", "k0:sms"]
            assert [m["message_key"] for m in c.get(
                "/v1/outbox", params={"to": "+8801711000001"}).json()["messages"]] == ["k0:sms"]
            assert [m["message_key"] for m in c.get("/v1/outbox", params={"limit": 1}).json()["messages"]] == [
                "k2:sms"]
            assert c.get("/v1/outbox", params={"channel": "fax"}).status_code in (400, 422)
        with api.client(sender) as c:
            refused = c.get("/v1/outbox")
            assert (refused.status_code, refused.json()["scope"]) == (403, "support:read")
        with api.client(None) as c:
            assert c.get("/v1/outbox").status_code == 401
            page = c.get("/outbox")  # open, like /support: its data needs the token typed into it
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert "/v1/outbox" in page.text and "+8801711000001" not in page.text
    finally:
        api.stop()


def test_where_no_channel_uses_the_outbox_its_routes_are_not_found() -> None:
    real = Settings().with_overrides(senders={
        "push_primary": "fake", "sms_primary": "http://sms.example/send", "email_primary": "smtp"})
    request = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(services=SimpleNamespace(cfg=real))))
    with pytest.raises(ApiError) as refused:
        asyncio.run(outbox_page(request))  # type: ignore[arg-type]
    assert (refused.value.status, refused.value.code) == (404, "outbox_not_in_use")
