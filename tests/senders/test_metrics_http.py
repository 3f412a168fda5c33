"""Sender metrics are served in the Prometheus text format."""

from __future__ import annotations

import urllib.request

from senders.runtime.metrics import Metrics, serve_metrics


def test_metrics_are_served_over_http() -> None:
    metrics = Metrics()
    metrics.inc("sender_deliveries_total", channel="sms", lane="priority", outcome="sent")
    metrics.set("sender_circuit_state", 2, channel="sms", provider="sms-a")
    server = serve_metrics(metrics, 0)
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert resp.status == 200
        assert 'sender_deliveries_total{channel="sms",lane="priority",outcome="sent"} 1' in text
        assert "sender_circuit_state" in text and " 2" in text
    finally:
        server.shutdown()
