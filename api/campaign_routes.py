"""Campaigns over HTTP: ``POST /v1/campaigns``, and a campaign's progress, pause and resume, by
its owner (``campaigns``: its own campaigns only; another's is not found) or by support
(``/v1/support/campaigns/...``, ``support:read``: any campaign).

A campaign sends a marketing template (the caller must be allowed it: its categories and
templates), at most at its caller's rate (a higher ``rate`` is 400 ``rate_over_caller_limit``),
and a caller has at most ``api.max_active_campaigns`` scheduled, running or paused (409
``too_many_campaigns``). The body (up to ``api.max_campaign_body_bytes``: 100,000 user ids) is
parsed and its segment read and checked in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path as FilePath
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from api import campaigns
from api.accept import build_request, check_message, event_time_ms, template_for
from api.callers import Caller
from api.docs import V1, errors
from api.errors import ApiError, bad_request, not_found
from api.models import CampaignCreated, CampaignIn, CampaignOut
from api.services import Services, services
from operators.limits import field_problem
from operators.records import Category, Priority
from senders.profiles.user_id import user_id_problem
from senders.store.db import Database

router = APIRouter()
CampaignId = Annotated[str, Path(min_length=1, max_length=64)]
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: the body's schema, in components (api.app adds it): the route reads the body itself, off the loop
BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/CampaignIn"}}}}}


def campaign_out(c: campaigns.Campaign) -> CampaignOut:
    return CampaignOut(
        campaign_id=c.campaign_id, state=c.state, template=c.template, total=c.total,  # type: ignore[arg-type]
        written=c.written, rate=c.rate_per_sec, send_at=c.send_at_ms, created_at=c.created_ms,
        updated_at=c.updated_ms,
    )


def _invalid(errors: list[dict[str, Any]]) -> RequestValidationError:
    return RequestValidationError(errors)


def parse_body(raw: bytes) -> CampaignIn:
    """The body, validated. The segment (up to 100,000 ids) is checked by a Python loop, which
    lets the event loop's thread in between; pydantic would check it in one call that holds the
    GIL (70 ms for 100,000 ids on a loaded 2-core machine), stalling every request meanwhile."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise _invalid([{"loc": (), "msg": "the body is not JSON", "type": "json_invalid"}]) from None
    if not isinstance(doc, dict):
        raise _invalid([{"loc": (), "msg": "the body must be a JSON object", "type": "model_type"}])
    segment = doc.pop("segment", None)
    try:
        body = CampaignIn.model_validate(doc)
    except ValidationError as exc:
        raise _invalid([dict(e) for e in exc.errors(include_url=False, include_input=False)]) from None
    if segment is None:
        return body
    if not isinstance(segment, list):
        raise _invalid([{"loc": ("segment",), "msg": "Input should be a valid list", "type": "list_type"}])
    if not segment:
        raise _invalid([{"loc": ("segment",), "msg": "List should have at least 1 item after validation",
                         "type": "too_short"}])
    wrong = [{"loc": ("segment", n), "msg": "Input should be a valid string", "type": "string_type"}
             for n, user in enumerate(segment) if not isinstance(user, str)]
    if wrong:
        raise _invalid(wrong[:10])
    return body.model_copy(update={"segment": segment})


def segment_of(body: CampaignIn, s: Services) -> list[str]:
    """The users, in order, each once."""
    if (body.segment is None) == (body.segment_file is None):
        raise bad_request("give segment (user ids) or segment_file, one of them", code="invalid_segment")
    if body.segment is not None:
        users = body.segment
    else:
        root = s.cfg.api.segments_dir
        name = body.segment_file or ""
        if not root:
            raise bad_request("segment files are not enabled here (api.segments_dir)", code="invalid_segment")
        if not _FILE_NAME.fullmatch(name):
            raise bad_request("segment_file is a file name in api.segments_dir, not a path", code="invalid_segment")
        path = FilePath(root) / name
        try:
            with path.open(encoding="utf-8") as f:
                users = [line.strip() for line in f if line.strip()]
        except (OSError, UnicodeDecodeError):
            raise bad_request(f"segment file {name} cannot be read", code="invalid_segment") from None
    seen: set[str] = set()
    unique = []
    for user in users:  # a loop, which lets the event loop in (dict.fromkeys would hold it 20 ms)
        if user not in seen:
            seen.add(user)
            unique.append(user)
    if not unique:
        raise bad_request("the segment is empty", code="invalid_segment")
    if len(unique) > s.cfg.api.max_campaign_users:
        raise bad_request(f"the segment has {len(unique)} users, more than {s.cfg.api.max_campaign_users}"
                          " (api.max_campaign_users)", code="invalid_segment")
    return unique


def check_users(users: list[str], prefix: str, s: Services) -> None:
    """Each user id by the one rule, and its dedup key (``prefix`` + user) within the job's limit."""
    problems = []
    for n, user in enumerate(users):
        problem = user_id_problem(user, s.limits.max_field_bytes) or field_problem(
            "dedup_key", prefix + user, s.limits)
        if problem:
            problems.append(f"segment[{n}]: {problem}")
            if len(problems) >= 10:
                break
    if problems:
        raise bad_request("some user ids cannot be sent to", code="invalid_segment", problems=problems)


def prepare(raw: bytes, caller: Caller, s: Services, now: int) -> tuple[campaigns.Campaign, list[str]]:
    """The campaign a body asks for, and its users: everything checked (in a worker thread)."""
    body = parse_body(raw)
    template = template_for(s.catalog, body.template, caller)
    if template.kind is not Category.MARKETING:
        raise bad_request(f"template {template.name} is {template.kind.value}: a campaign sends marketing templates"
                          " only", code="not_marketing")
    limit = caller.rate(s.cfg.api.default_rate_per_sec)
    if body.rate > limit:
        raise bad_request(f"rate {body.rate:g}/s is over caller {caller.name}'s rate of {limit:g}/s",
                          code="rate_over_caller_limit")
    send_at = max(now, event_time_ms(body.send_at, now, "send_at"))
    channels = check_message(template, body.channels, body.params, send_at, Priority.NORMAL)
    users = segment_of(body, s)
    c = campaigns.Campaign(
        campaigns.new_campaign_id(), caller.name, template.name, dict(body.params),
        tuple(ch.value for ch in channels), template.kind, body.rate, send_at, "scheduled", len(users), 0, now, now,
    )
    check_users(users, campaigns.dedup_key(c, ""), s)
    build_request(  # the params and the rest, as the job will judge them (the first user stands for all)
        {"notification_id": f"{c.campaign_id}-0", "user_id": users[0], "template_id": template.name,
         "params": body.params, "channels": list(c.channels), "priority": Priority.NORMAL.value,
         "category": template.kind.value, "event_time": now, "dedup_key": campaigns.dedup_key(c, users[0])},
        s.limits, now,
    )
    return c, users


@router.post("/v1/campaigns", status_code=202, response_model=CampaignCreated, responses=errors(*V1, 409),
             openapi_extra=BODY, summary="Start a campaign of a marketing template: one request per user, paced")
async def create_campaign(request: Request) -> JSONResponse:
    s = services(request)
    caller: Caller = request.state.caller
    raw = await request.body()
    c, users = await asyncio.to_thread(prepare, raw, caller, s, int(time.time() * 1000))
    limit = s.cfg.api.max_active_campaigns
    try:
        await s.pool.run(lambda db: campaigns.create(db, c, users, limit))
    except campaigns.TooManyCampaigns as exc:
        raise ApiError(409, "too_many_campaigns", f"caller {caller.name} has {exc.active} campaigns scheduled, running"
                       f" or paused: at most {limit} (api.max_active_campaigns)") from None
    s.singletons.kick(c.campaign_id)  # at once when this process runs them; else the holder finds it
    created = CampaignCreated(campaign_id=c.campaign_id, status_url=f"/v1/campaigns/{c.campaign_id}")
    return JSONResponse(created.model_dump(), status_code=202)


async def _get(s: Services, campaign_id: str, owner: str | None) -> campaigns.Campaign:
    """The campaign; not found unless ``owner`` made it (None: support, any campaign)."""
    c = await s.pool.run(lambda db: campaigns.get(db, campaign_id))
    if c is None or (owner is not None and c.caller != owner):
        raise not_found("no such campaign", code="unknown_campaign")
    return c


async def _change(s: Services, campaign_id: str, action: str, owner: str | None) -> CampaignOut:
    c = await _get(s, campaign_id, owner)
    now = int(time.time() * 1000)

    def change(db: Database) -> bool:
        if action == "pause":
            return campaigns.set_state(db, campaign_id, "paused", ("scheduled", "running"), now)
        state = "scheduled" if c.send_at_ms > now and c.written == 0 else "running"
        return campaigns.set_state(db, campaign_id, state, ("paused",), now)

    if not await s.pool.run(change):
        raise ApiError(409, "conflict", f"the campaign is {c.state}: it cannot {action}")
    if action == "resume":
        s.singletons.kick(campaign_id)
    return campaign_out(await _get(s, campaign_id, owner))


def _owner(request: Request) -> str:
    caller: Caller = request.state.caller
    return caller.name


@router.get("/v1/campaigns/{campaign_id}", response_model=CampaignOut, responses=errors(*V1, 404),
            summary="One of the caller's campaigns: its progress")
async def get_campaign(campaign_id: CampaignId, request: Request) -> CampaignOut:
    return campaign_out(await _get(services(request), campaign_id, _owner(request)))


@router.post("/v1/campaigns/{campaign_id}/pause", response_model=CampaignOut, responses=errors(*V1, 404, 409),
             summary="Pause one of the caller's campaigns after its current batch")
async def pause_campaign(campaign_id: CampaignId, request: Request) -> CampaignOut:
    return await _change(services(request), campaign_id, "pause", _owner(request))


@router.post("/v1/campaigns/{campaign_id}/resume", response_model=CampaignOut, responses=errors(*V1, 404, 409),
             summary="Resume one of the caller's paused campaigns where it stopped")
async def resume_campaign(campaign_id: CampaignId, request: Request) -> CampaignOut:
    return await _change(services(request), campaign_id, "resume", _owner(request))


@router.get("/v1/support/campaigns/{campaign_id}", response_model=CampaignOut, responses=errors(*V1, 404),
            summary="Support: any campaign's progress")
async def support_campaign(campaign_id: CampaignId, request: Request) -> CampaignOut:
    return campaign_out(await _get(services(request), campaign_id, None))


@router.post("/v1/support/campaigns/{campaign_id}/pause", response_model=CampaignOut,
             responses=errors(*V1, 404, 409), summary="Support: pause any campaign after its current batch")
async def support_pause(campaign_id: CampaignId, request: Request) -> CampaignOut:
    return await _change(services(request), campaign_id, "pause", None)


@router.post("/v1/support/campaigns/{campaign_id}/resume", response_model=CampaignOut,
             responses=errors(*V1, 404, 409), summary="Support: resume any paused campaign")
async def support_resume(campaign_id: CampaignId, request: Request) -> CampaignOut:
    return await _change(services(request), campaign_id, "resume", None)
