"""``POST /v1/campaigns``, ``GET /v1/campaigns/{id}``, ``POST /v1/campaigns/{id}/pause|resume``.
Only a marketing caller runs campaigns."""

from __future__ import annotations

import re
import time
from pathlib import Path as FilePath
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse

from api import campaigns
from api.accept import build_request, check_message, event_time_ms, template_for
from api.docs import V1, errors
from api.errors import ApiError, bad_request, forbidden, not_found
from api.models import CampaignCreated, CampaignIn, CampaignOut
from api.services import Services, services
from api.tokens import Caller
from operators.limits import field_problem
from operators.records import Priority
from senders.store.db import Database

router = APIRouter()
CampaignId = Annotated[str, Path(min_length=1, max_length=64)]
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def campaign_out(c: campaigns.Campaign) -> CampaignOut:
    return CampaignOut(
        campaign_id=c.campaign_id, state=c.state, template=c.template, total=c.total,  # type: ignore[arg-type]
        written=c.written, rate=c.rate_per_sec, send_at=c.send_at_ms, created_at=c.created_ms,
        updated_at=c.updated_ms,
    )


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
    unique = list(dict.fromkeys(users))
    if not unique:
        raise bad_request("the segment is empty", code="invalid_segment")
    if len(unique) > s.cfg.api.max_campaign_users:
        raise bad_request(f"the segment has {len(unique)} users, more than {s.cfg.api.max_campaign_users}"
                          " (api.max_campaign_users)", code="invalid_segment")
    return unique


def _check_users(users: list[str], campaign_id: str, s: Services) -> None:
    problems = []
    for n, user in enumerate(users):
        problem = None
        if not user or not user.isprintable() or user != user.strip():
            problem = "a user id is printable text without surrounding spaces"
        else:
            problem = field_problem("user_id", user, s.limits) or field_problem(
                "dedup_key", f"{campaign_id}:{user}", s.limits)
        if problem:
            problems.append(f"segment[{n}]: {problem}")
        if len(problems) >= 10:
            break
    if problems:
        raise bad_request("some user ids cannot be sent to", code="invalid_segment", problems=problems)


@router.post("/v1/campaigns", status_code=202, response_model=CampaignCreated, responses=errors(*V1, 403),
             summary="Start a campaign: one request per user, paced at its rate")
async def create_campaign(body: CampaignIn, request: Request) -> JSONResponse:
    s = services(request)
    caller: Caller = request.state.caller
    if not caller.marketing:
        raise forbidden(f"caller {caller.name} is not a marketing caller: only those run campaigns")
    template = template_for(s.catalog, body.template, caller)
    now = int(time.time() * 1000)
    send_at = max(now, event_time_ms(body.send_at, now, "send_at"))
    channels = check_message(template, body.channels, body.params, send_at, Priority.NORMAL)
    users = segment_of(body, s)
    campaign_id = campaigns.new_campaign_id()
    _check_users(users, campaign_id, s)
    build_request(  # the params and the rest, as the job will judge them (the first user stands for all)
        {"notification_id": f"{campaign_id}-0", "user_id": users[0], "template_id": template.name,
         "params": body.params, "channels": [c.value for c in channels], "priority": Priority.NORMAL.value,
         "category": template.kind.value, "event_time": now, "dedup_key": f"{campaign_id}:{users[0]}"},
        s.limits, now,
    )
    c = campaigns.Campaign(
        campaign_id, caller.name, template.name, dict(body.params), tuple(ch.value for ch in channels),
        template.kind, body.rate, send_at, "scheduled", len(users), 0, now, now,
    )
    await s.pool.run(lambda db: campaigns.create(db, c, users))
    s.campaigns.ensure_running(campaign_id)
    created = CampaignCreated(campaign_id=campaign_id, status_url=f"/v1/campaigns/{campaign_id}")
    return JSONResponse(created.model_dump(), status_code=202)


async def _get(s: Services, campaign_id: str) -> campaigns.Campaign:
    c = await s.pool.run(lambda db: campaigns.get(db, campaign_id))
    if c is None:
        raise not_found("no such campaign", code="unknown_campaign")
    return c


@router.get("/v1/campaigns/{campaign_id}", response_model=CampaignOut, responses=errors(*V1, 404),
            summary="A campaign's progress")
async def get_campaign(campaign_id: CampaignId, request: Request) -> CampaignOut:
    return campaign_out(await _get(services(request), campaign_id))


@router.post("/v1/campaigns/{campaign_id}/pause", response_model=CampaignOut, responses=errors(*V1, 403, 404, 409),
             summary="Pause a campaign after its current batch")
async def pause_campaign(campaign_id: CampaignId, request: Request) -> CampaignOut:
    return await _change(request, campaign_id, "pause")


@router.post("/v1/campaigns/{campaign_id}/resume", response_model=CampaignOut, responses=errors(*V1, 403, 404, 409),
             summary="Resume a paused campaign where it stopped")
async def resume_campaign(campaign_id: CampaignId, request: Request) -> CampaignOut:
    return await _change(request, campaign_id, "resume")


async def _change(request: Request, campaign_id: str, action: str) -> CampaignOut:
    s = services(request)
    caller: Caller = request.state.caller
    if not caller.marketing:
        raise forbidden(f"caller {caller.name} is not a marketing caller")
    c = await _get(s, campaign_id)
    now = int(time.time() * 1000)

    def change(db: Database) -> bool:
        if action == "pause":
            return campaigns.set_state(db, campaign_id, "paused", ("scheduled", "running"), now)
        state = "scheduled" if c.send_at_ms > now and c.written == 0 else "running"
        return campaigns.set_state(db, campaign_id, state, ("paused",), now)

    if not await s.pool.run(change):
        raise ApiError(409, "conflict", f"the campaign is {c.state}: it cannot {action}")
    if action == "resume":
        s.campaigns.ensure_running(campaign_id)
    return campaign_out(await _get(s, campaign_id))
