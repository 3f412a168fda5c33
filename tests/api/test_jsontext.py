"""api.jsontext writes the bytes the standard library's encoder wrote (fingerprints of requests
stored before stay the same), and refuses what it refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api import jsontext

# every character but the surrogates (which no UTF-8 text holds), controls and U+2028 included
TEXT = st.text(st.characters(exclude_categories=("Cs",)))
SCALARS = st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | TEXT
DOCUMENTS = st.recursive(SCALARS, lambda inner: st.lists(inner) | st.dictionaries(TEXT, inner), max_leaves=30)


def stdlib(obj: Any, sort_keys: bool) -> bytes:
    return json.dumps(obj, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@given(DOCUMENTS, st.booleans())
def test_the_bytes_are_the_standard_encoders(obj: Any, sort_keys: bool) -> None:
    assert jsontext.dumps(obj, sort_keys=sort_keys) == stdlib(obj, sort_keys)


def test_a_request_fingerprints_document_is_written_as_before() -> None:
    document = {"caller": "shop", "namespace": "orders", "body": {
        "user_id": "nusrat", "template": "order_shipped", "params": {"order": "BD-7790", "note": 'a "b"\n\u2028'},
        "priority": "normal", "channels": ["sms", "push"], "event_time": "2026-12-06T10:00:00+06:00",
        "dedup_ttl_sec": 2**63 - 1}}
    assert jsontext.dumps(document, sort_keys=True) == stdlib(document, True)


def test_an_integer_past_64_bits_is_written_by_the_standard_encoder() -> None:
    assert jsontext.dumps({"n": 2**70}) == b'{"n":1180591620717411303424}'


def test_a_lone_surrogate_is_refused_as_before() -> None:
    with pytest.raises(UnicodeEncodeError):
        jsontext.dumps({"user_id": "\ud800"})
