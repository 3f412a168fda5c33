"""The senders' demo on the scenario's accepted requests (as the dedup job writes them)."""

from __future__ import annotations

import pytest

from harness import scenario
from harness.senders_demo import run_senders_demo
from operators.dedup_key import resolve_dedup_key
from ops import kafka_io
from tests.encoders import channel_messages
from tests.senders.conftest import SettingsFactory

pytestmark = pytest.mark.integration

#: the scenario's requests the dedup job accepts (neither duplicates, late nor invalid)
ACCEPTED = {"n-001", "n-002", "n-004", "n-006", "n-008", "n-011", "n-012"}


def test_the_demo_prints_each_attempt_and_settles(
    senders_settings: SettingsFactory, kafka_bootstrap: str
) -> None:
    cfg = senders_settings()
    prod = kafka_io.producer(cfg.kafka.client_config())
    for step in scenario.steps():
        if step.request is not None and step.request.notification_id in ACCEPTED:
            for routed in channel_messages(step.request, resolve_dedup_key(step.request), cfg.topics):
                kafka_io.produce_all(prod, routed.topic, [(routed.key, routed.value)])
    lines: list[str] = []
    run_senders_demo(cfg, lines.append)
    text = "\n".join(lines)
    bob = [line for line in lines if " sms " in line and "normal" in line]
    assert [
        ("attempt 1: transient" in b, "attempt 2: transient" in b, "attempt 3: sent" in b) for b in bob
    ] == [(True, False, False), (False, True, False), (False, False, True)]
    carol = [line for line in lines if "email" in line and "permanent" in line]
    assert len(carol) == 1 and "-> dead letter (permanent_failure)" in carol[0]
    assert any(" sms   priority" in line and "attempt 1: sent" in line for line in lines)  # the one-time code
    assert "Settled: {'failed': 1, 'sent': 7}" in text
    for secret in ("493817", "+1555", "@example.com", "mailbox.invalid", "1001", "12.50"):
        assert secret not in text  # no params, no addresses
