"""The push providers' pure rules: priority by kind and lane, expiry from the event time, the
collapse id and message id of a key, the APNs token's renewal, the FCM token's single fetch."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from operators.records import Category
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.providers.access_token import AccessToken, AccessTokens
from senders.providers.credentials import MIN_RENEW_S, RENEW_AFTER_S, ApnsSigningKey, ProviderTokens
from senders.providers.fcm import FcmError
from senders.providers.push import PushOptions, android_priority, apns_priority, collapse_id, message_id
from senders.statuses import Lane
from senders.templates.render import MessageContext

T, M = Category.TRANSACTIONAL, Category.MARKETING


@pytest.mark.parametrize(
    ("context", "android", "apns"),
    [
        (MessageContext(T, True, Lane.PRIORITY), "high", 10),  # a one-time code
        (MessageContext(T, True, Lane.NORMAL), "high", 10),  # a code sent without high priority: still a code
        (MessageContext(T, False, Lane.PRIORITY), "high", 10),  # the caller said it is urgent
        (MessageContext(T, False, Lane.NORMAL), "normal", 10),  # an order update
        (MessageContext(M, False, Lane.NORMAL), "normal", 5),  # a campaign
        (MessageContext(M, False, Lane.PRIORITY), "high", 10),
    ],
)
def test_priority_by_kind_and_lane(context: MessageContext, android: str, apns: int) -> None:
    assert (android_priority(context), apns_priority(context)) == (android, apns)


def test_expiry_counts_from_the_event_time_and_a_lapsed_message_is_refused() -> None:
    options = PushOptions(ttl_s=3600, code_ttl_s=300)
    code = MessageContext(T, True, Lane.PRIORITY, event_time_ms=1_000_000)
    assert options.expires_at_s(code, now_s=2_000.0) == 1_300.0
    assert options.time_to_live_s("p", code, now_s=1_000.0) == 300
    assert options.time_to_live_s("p", code, now_s=1_250.5) == 50  # whole seconds, rounded up
    for late in (1_299.5, 1_300.0, 5_000.0):
        with pytest.raises(ProviderPermanentError, match="expired before it was sent") as err:
            options.time_to_live_s("p", code, now_s=late)
        assert not err.value.deactivate_address
    unknown = MessageContext(M, False, Lane.NORMAL, event_time_ms=None)  # no event time: from now
    assert options.time_to_live_s("p", unknown, now_s=42.0) == 3600


@given(st.text(max_size=200))
def test_collapse_and_message_ids_are_header_safe_and_stable(key: str) -> None:
    collapse = collapse_id(key)
    assert len(collapse.encode()) <= 64 and collapse.isascii() and collapse.isprintable()
    assert collapse == collapse_id(key)
    if len(key) <= 64 and key.isascii() and key.isprintable():
        assert collapse == key
    assert uuid.UUID(message_id(key)) == uuid.UUID(message_id(key))


def test_different_keys_get_different_ids() -> None:
    keys = [f"dk-{i}:push" for i in range(1000)] + ["x" * 65, "x" * 66]
    assert len({message_id(k) for k in keys}) == len({collapse_id(k) for k in keys}) == len(keys)


def _key() -> ApnsSigningKey:
    return ApnsSigningKey("TEAM", "KID", ec.generate_private_key(ec.SECP256R1()))


def test_the_apns_token_is_renewed_after_50_minutes_and_never_within_20() -> None:
    tokens = ProviderTokens(_key())
    first = tokens.current(0.0)
    assert tokens.current(RENEW_AFTER_S - 1) is first
    second = tokens.current(RENEW_AFTER_S)
    assert second is not first and second.issued_at_s == RENEW_AFTER_S
    # APNs says the new one expired: too young to renew (the clocks disagree)
    assert tokens.renew(second, RENEW_AFTER_S + MIN_RENEW_S - 1) is None
    # calls that failed with the token before share the one renewal
    third = tokens.renew(second, RENEW_AFTER_S + MIN_RENEW_S)
    assert third is not None and third is not second
    assert tokens.renew(second, RENEW_AFTER_S + MIN_RENEW_S + 5) is third
    assert tokens.current(RENEW_AFTER_S + MIN_RENEW_S + 5) is third


def test_one_fetch_serves_every_waiter_even_when_the_first_gives_up() -> None:
    now = [0.0]
    fetches: list[int] = []

    async def fetch() -> AccessToken:
        fetches.append(1)
        await asyncio.sleep(0.2)
        return AccessToken.lasting(f"tok-{len(fetches)}", 3600, now[0])

    async def go() -> None:
        tokens = AccessTokens(fetch, lambda: now[0])
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):  # the first call's deadline passes while it waits
                await tokens.get()
        got = await asyncio.gather(*(tokens.get() for _ in range(50)))
        assert {t.value.get_secret_value() for t in got} == {"tok-1"}
        assert len(fetches) == 1
        now[0] = 3600 - 300  # five minutes before it expires: fetched again
        assert (await tokens.get()).value.get_secret_value() == "tok-2"
        # a 401 on tok-2 fetches once more; one on a token already replaced does not
        stale = await tokens.get()
        fresh = await tokens.refresh(stale)
        assert fresh.value.get_secret_value() == "tok-3" and await tokens.refresh(stale) is fresh

    asyncio.run(go())


def test_a_failed_fetch_is_not_cached() -> None:
    answers: list[BaseException | str] = [ProviderRetryableError("fcm", "token endpoint: HTTP 503"), "tok"]

    async def fetch() -> AccessToken:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return AccessToken(SecretStr(answer), 10_000.0, 9_000.0)

    async def go() -> None:
        tokens = AccessTokens(fetch, lambda: 0.0)
        with pytest.raises(ProviderRetryableError):
            await tokens.get()
        assert (await tokens.get()).value.get_secret_value() == "tok"

    asyncio.run(go())


@pytest.mark.parametrize(
    ("body", "code", "on_token"),
    [
        (b'{"error": {"status": "INVALID_ARGUMENT", "message": "The registration token is not a valid FCM registration'
         b' token", "details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode":'
         b' "INVALID_ARGUMENT"}]}}', "INVALID_ARGUMENT", True),
        (b'{"error": {"status": "INVALID_ARGUMENT", "message": "registration token in message.data", "details":'
         b' [{"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": [{"field": "message.data"}]}]}}',
         "INVALID_ARGUMENT", False),  # a violation of another field: not the token, whatever the text says
        (b'{"error": {"status": "NOT_FOUND", "details": [{"@type":'
         b' "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": "UNREGISTERED"}]}}', "UNREGISTERED",
         False),
        (b'{"error": {"status": "NOT_FOUND", "message": "Requested entity was not found."}}', "NOT_FOUND", False),
        (b"<html>502</html>", "", False),
        (b'{"error": "x"}', "", False),
        (b"", "", False),
    ],
)
def test_fcm_errors_are_read_from_their_details(body: bytes, code: str, on_token: bool) -> None:
    assert FcmError.of(body) == FcmError(code, on_token)
