"""``POST /v1/notifications`` and ``GET /v1/notifications/{id}``, ``GET /v1/users/{id}/notifications``."""

from __future__ import annotations

import logging
import os
import time
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import JSONResponse

from api.accept import accept, channels_now, check_key, fingerprint, unknown_user
from api.docs import V1, errors
from api.errors import ApiError, not_found
from api.models import NotificationAccepted, NotificationIn, NotificationStatus, UserNotifications
from api.producer import NotAcknowledged
from api.services import services
from api.store import (
    RequestRecord,
    Reservation,
    Reserved,
    outcomes_by_key,
    outcomes_of,
    receipts_of,
    release_key,
    request_by_id,
    requests_by_key,
    requests_of_user,
    reserve_key,
)
from api.tokens import Caller
from api.view import notification_status, user_summaries
from senders.store.db import Database
from senders.store.profiles import ProfileRead, ProfileStore
from senders.store.status import StatusStore

logger = logging.getLogger(__name__)
router = APIRouter()

Id = Annotated[str, Path(min_length=1, max_length=1024)]


def _now_ms() -> int:
    return int(time.time() * 1000)


@router.post(
    "/v1/notifications",
    status_code=202,
    response_model=NotificationAccepted,
    responses={200: {"model": NotificationAccepted, "description": "the same request again: the first answer"},
               **errors(*V1, 403, 404, 409, 422, 429)},
    summary="Queue a notification",
)
async def post_notification(
    body: NotificationIn,
    request: Request,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> Any:
    s = services(request)
    caller: Caller = request.state.caller
    key = check_key(idempotency_key, s.limits)
    now = _now_ms()
    notification_id = f"n_{os.urandom(16).hex()}"
    accepted = accept(body, caller=caller, catalog=s.catalog, limits=s.limits, dedup_key=key,
                      notification_id=notification_id, now_ms=now)
    api = s.cfg.api
    fp = fingerprint(caller, body)

    def prepare(db: Database) -> tuple[Reserved, ProfileRead | None]:
        reserved = reserve_key(db, key, fp, notification_id, body.user_id, now, api.idempotency_ttl_s * 1000,
                               2 * api.ack_timeout_ms + 5_000)
        if reserved.outcome is not Reservation.NEW:
            return reserved, None
        profile = s.profiles.get(body.user_id)
        if profile is None:
            profile = ProfileStore(db, s.cipher).read(body.user_id)
            if profile.exists:
                s.profiles.put(body.user_id, profile)
        if not profile.exists:
            release_key(db, key, notification_id)
        return reserved, profile

    reserved, profile = await s.pool.run(prepare)
    if reserved.outcome is Reservation.IN_PROGRESS:  # written by this process, its record not stored yet
        held = s.completions.answer_of(key)
        if held is not None:
            return JSONResponse(held, status_code=200)
    if reserved.outcome is Reservation.REPLAY:
        return JSONResponse(reserved.answer, status_code=200)
    if reserved.outcome is Reservation.OTHER_BODY:
        raise ApiError(422, "idempotency_key_reused", "this Idempotency-Key was used with another request")
    if reserved.outcome is Reservation.IN_PROGRESS:
        raise ApiError(409, "in_progress", "a request with this Idempotency-Key is being written; retry",
                       headers={"Retry-After": "1"})
    assert profile is not None
    if not profile.exists:
        raise unknown_user(body.user_id)
    req = accepted.request
    try:
        written = await s.producer.write(s.cfg.topics.requests, req.user_id.encode("utf-8"), accepted.encoded)
    except NotAcknowledged as exc:
        logger.warning("a notification was not written: %s", exc.reason)
        await s.pool.run(lambda db: release_key(db, key, notification_id))
        raise ApiError(503, "kafka_unavailable", "Kafka did not acknowledge the request in time; retry with the"
                       " same Idempotency-Key", headers={"Retry-After": "1"}) from None
    queued, skipped = channels_now(profile, req.channels, accepted.kind)
    answer = NotificationAccepted(
        id=notification_id, dedup_key=key, queued=queued, skipped=skipped,
        status_url=f"/v1/notifications/{notification_id}",
    ).model_dump()
    record = RequestRecord(notification_id, key, req.user_id, req.template_id, tuple(c.value for c in req.channels),
                           req.priority.value, caller.name, req.event_time, now, written.partition, written.offset)
    s.completions.put(key, answer, record)  # stored in the next batch (api.completions)
    return JSONResponse(answer, status_code=202)


@router.get(
    "/v1/notifications/{notification_id}",
    response_model=NotificationStatus,
    responses=errors(*V1, 404),
    summary="What became of a notification (by its id or dedup key)",
)
async def get_notification(notification_id: Id, request: Request) -> NotificationStatus:
    s = services(request)

    def look(db: Database) -> NotificationStatus | None:
        statuses = StatusStore(db)
        wanted = notification_id
        record = request_by_id(db, wanted)
        if record is None:
            by_key = requests_by_key(db, wanted)
            if by_key:
                record = by_key[0]
        nid = record.notification_id if record else wanted
        outcomes = outcomes_of(db, nid)
        if record is None and not outcomes:
            by_key_outcomes = outcomes_by_key(db, wanted)
            if by_key_outcomes:
                nid = by_key_outcomes[0].notification_id
                outcomes = outcomes_of(db, nid)
        rows = statuses.rows_of_notification(nid)
        if record is None and not outcomes and not rows:
            rows = statuses.rows_of_dedup_key(wanted)
            if rows:
                nid = rows[0].notification_id
                rows = [r for r in rows if r.notification_id == nid]
        if record is None and not outcomes and not rows:
            return None
        receipts = receipts_of(db, [r.message_key for r in rows])
        return notification_status(nid, record, outcomes, rows, receipts)

    found = await s.pool.run(look)
    if found is None:
        raise not_found("no notification has this id or dedup key")
    return found


@router.get(
    "/v1/users/{user_id}/notifications",
    response_model=UserNotifications,
    responses=errors(*V1),
    summary="A user's recent notifications, newest first",
)
async def user_notifications(
    user_id: Id, request: Request, limit: Annotated[int, Query(ge=1, le=200)] = 50
) -> UserNotifications:
    s = services(request)

    def look(db: Database) -> UserNotifications:
        requests = requests_of_user(db, user_id, limit)
        rows = StatusStore(db).rows_of_user(user_id, limit * 3)
        return UserNotifications(user_id=user_id, notifications=user_summaries(requests, rows, limit))

    return await s.pool.run(look)
