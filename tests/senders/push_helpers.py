"""What the FCM and APNs tests share: push messages of each kind, and sends on one event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from operators.records import Category, Channel
from senders.providers import Provider, Receipt
from senders.statuses import Lane
from senders.templates.render import MessageContext, PushContent, Rendered

CODE_BODY = "Your code is 482913"


def push(kind: str = "transactional", *, code: bool = False, lane: Lane = Lane.NORMAL,
         event_time_ms: int | None = None, title: str = "Hi", body: str = "Your order has shipped.") -> Rendered:
    """A rendered push message; its event time now unless given."""
    when = int(time.time() * 1000) if event_time_ms is None else event_time_ms
    context = MessageContext(Category(kind), code, lane, when)
    return Rendered("otp" if code else "order_shipped", 1, "en", Channel.PUSH, PushContent(title, body), context)


def code_message(**kwargs: object) -> Rendered:
    return push(code=True, lane=Lane.PRIORITY, title="Sign-in code", body=CODE_BODY, **kwargs)  # type: ignore[arg-type]


def send_all(provider: Provider, calls: Sequence[tuple[str, str, Rendered]]) -> list[Receipt | BaseException]:
    """Every (to, message key, message) sent at once on one event loop, the provider closed after;
    each result a Receipt or the error it raised."""

    async def go() -> list[Receipt | BaseException]:
        try:
            return await asyncio.gather(
                *(provider.send(to=to, message_key=key, message=msg) for to, key, msg in calls),
                return_exceptions=True,
            )
        finally:
            await provider.aclose()

    return asyncio.run(go())


def send_one(provider: Provider, to: str, key: str, message: Rendered) -> Receipt | BaseException:
    [result] = send_all(provider, [(to, key, message)])
    return result


def in_order(provider: Provider, calls: Sequence[tuple[str, str, Rendered]], between: object = None
             ) -> list[Receipt | BaseException]:
    """Each call after the one before, on one event loop; ``between(i)`` (if given) runs before call i."""

    async def go() -> list[Receipt | BaseException]:
        out: list[Receipt | BaseException] = []
        try:
            for i, (to, key, msg) in enumerate(calls):
                if callable(between):
                    between(i)
                try:
                    out.append(await provider.send(to=to, message_key=key, message=msg))
                except Exception as exc:  # noqa: BLE001 - the test looks at it
                    out.append(exc)
            return out
        finally:
            await provider.aclose()

    return asyncio.run(go())
