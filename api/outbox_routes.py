"""The outbox in the API: what the ``outbox`` provider wrote (``senders.providers.outbox``), from
the same files, newest first. ``GET /v1/outbox`` (JSON) needs ``support:read``: the messages
hold addresses and rendered bodies, one-time codes among them, of every caller's notifications.
``GET /outbox`` is the page, open like ``/support``: its data comes from ``/v1/outbox`` with the
token typed into it. Both answer only where the outbox is in use (a channel's primary or
secondary is ``outbox``: a local or test setup); otherwise 404.
"""

from __future__ import annotations

import asyncio
from importlib import resources
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field, ValidationError

from api.docs import V1, errors
from api.errors import not_found
from api.services import services
from operators.records import Channel
from senders.providers.outbox_files import outbox_root, read_newest
from settings import Settings

router = APIRouter()

NOT_IN_USE = "the outbox is not in use: no senders.<channel>_primary or _secondary is 'outbox'"


class OutboxMessage(BaseModel):
    id: str = Field(description="the outbox's id of the message: its provider reference in the status store")
    message_key: str
    channel: Channel
    to: str = Field(description="the address it was sent to")
    template: str
    version: int
    locale: str
    parts: dict[str, str | int] = Field(
        description="the rendered parts: push title, body; SMS text, encoding, segments; email subject, text, html")
    at: int = Field(description="when it was written (epoch ms)")


class Outbox(BaseModel):
    directory: str = Field(description="where the files are (one folder per channel)")
    messages: list[OutboxMessage] = Field(description="newest first")


def _in_use(cfg: Settings) -> None:
    if not cfg.senders.uses_outbox():
        raise not_found(NOT_IN_USE, code="outbox_not_in_use")


def _valid(records: list[dict[str, object]]) -> list[OutboxMessage]:
    out = []
    for record in records:
        try:
            out.append(OutboxMessage.model_validate(record))
        except ValidationError:  # a file that is not one of ours: passed over
            continue
    return out


@router.get(
    "/v1/outbox",
    response_model=Outbox,
    responses=errors(*V1, 403, 404, 429),
    summary="The messages the outbox provider kept (every caller's), newest first; 404 where it is not in use",
)
async def outbox(
    request: Request,
    channel: Channel | None = None,
    to: Annotated[str | None, Query(min_length=1, max_length=512, description="only this address's")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> Outbox:
    cfg = services(request).cfg
    _in_use(cfg)
    root = outbox_root(cfg.data_path())
    chosen = (channel,) if channel is not None else tuple(Channel)
    records = await asyncio.to_thread(read_newest, root, channels=chosen, to=to, limit=limit)
    return Outbox(directory=str(root), messages=_valid(records))


@router.get("/outbox", response_class=HTMLResponse, include_in_schema=False)
async def outbox_page(request: Request) -> HTMLResponse:
    from api.app import SUPPORT_HEADERS  # the support page's headers (api.app includes this router)

    _in_use(services(request).cfg)
    page = resources.files("api").joinpath("outbox.html").read_text(encoding="utf-8")
    return HTMLResponse(page, headers=SUPPORT_HEADERS)
