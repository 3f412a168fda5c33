"""Fixtures of the pure-operator tests (tests/conftest.py belongs to the integration suite)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from operators.records import Channel, NotificationRequest

RequestFactory = Callable[..., NotificationRequest]


def build_request(**overrides: Any) -> NotificationRequest:
    """A valid request; any field can be overridden."""
    fields: dict[str, Any] = {
        "notification_id": "n-1",
        "user_id": "user-1",
        "template_id": "tmpl-1",
        "channels": (Channel.PUSH,),
        "event_time": 1_700_000_000_000,
    }
    fields.update(overrides)
    return NotificationRequest(**fields)


@pytest.fixture(scope="session")
def make_request() -> RequestFactory:
    """``make_request(**fields)``: a valid NotificationRequest with some fields overridden."""
    return build_request
