"""What became of notifications: a caller's own (``status:read``), and everyone's for the support
page (``support:read``).

``GET /v1/notifications/{id}`` takes the notification id or the caller's own Idempotency-Key
(``evt-2``: looked up as ``<caller>/evt-2``, in the caller's namespaces, or as the full dedup key
the answer gave); a notification of another caller is not found (404, as one that does not
exist). ``GET /v1/support/notifications/{id}`` takes any notification id or full dedup key
(``shop/evt-2``), including those of requests written to Kafka by other producers, which only
the senders' records know. Keys may hold ``/``: the route takes the rest of the path.

A read first waits for the requests this process answered to be stored (``StoreWriter.caught_up``);
one read by another API process may not find a request answered in the last round (milliseconds).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from api.callers import Caller, shared_key
from api.docs import V1, errors
from api.errors import not_found
from api.models import NotificationStatus, UserNotifications
from api.services import services
from api.store import (
    RequestRecord,
    outcomes_by_key,
    outcomes_of,
    receipts_of,
    request_by_id,
    requests_by_key,
    requests_of_user,
)
from api.users import UserId, check_user
from api.view import notification_status, user_summaries
from senders.store.db import Database
from senders.store.status import StatusStore

router = APIRouter()

Id = Annotated[str, Path(min_length=1, max_length=1024)]
Limit = Annotated[int, Query(ge=1, le=200)]
NOT_FOUND = "no notification has this id or dedup key"
#: the longest a read waits for this process's store writer to store the answers it gave before
#: (api.writer): a status read right after a 202 finds the request
CATCH_UP_S = 1.0


def own_keys(caller: Caller, ident: str) -> list[str]:
    """The dedup keys a caller may mean by ``ident``: in its own space, in its namespaces, and as
    given (the full key an answer showed; a key written before key spaces existed)."""
    keys = [caller.key_space(ident), *(shared_key(ns, ident) for ns in sorted(caller.namespaces)), ident]
    return list(dict.fromkeys(keys))


def status_of(db: Database, record: RequestRecord | None, nid: str) -> NotificationStatus | None:
    outcomes = outcomes_of(db, nid)
    rows = StatusStore(db).rows_of_notification(nid)
    if record is None and not outcomes and not rows:
        return None
    receipts = receipts_of(db, [r.message_key for r in rows])
    return notification_status(nid, record, outcomes, rows, receipts)


def find_own(db: Database, caller: Caller, ident: str) -> NotificationStatus | None:
    record = request_by_id(db, ident)
    if record is not None and record.caller != caller.name:
        record = None
    if record is None:
        for key in own_keys(caller, ident):
            found = requests_by_key(db, key, limit=1, caller=caller.name)
            if found:
                record = found[0]
                break
    return None if record is None else status_of(db, record, record.notification_id)


def find_any(db: Database, ident: str) -> NotificationStatus | None:
    """By notification id or full dedup key: the API's request, else the job's verdict, else the
    senders' rows (a request another producer wrote)."""
    record = request_by_id(db, ident)
    if record is None:
        by_key = requests_by_key(db, ident, limit=1)
        record = by_key[0] if by_key else None
    if record is not None:
        return status_of(db, record, record.notification_id)
    if outcomes_of(db, ident) or StatusStore(db).rows_of_notification(ident):
        return status_of(db, None, ident)
    by_key_outcomes = outcomes_by_key(db, ident, limit=1)
    if by_key_outcomes:
        return status_of(db, None, by_key_outcomes[0].notification_id)
    rows = StatusStore(db).rows_of_dedup_key(ident, limit=1)
    return status_of(db, None, rows[0].notification_id) if rows else None


@router.get(
    "/v1/notifications/{notification_id:path}",
    response_model=NotificationStatus,
    responses=errors(*V1, 403, 404, 429),
    summary="What became of one of the caller's notifications (by its id or the caller's Idempotency-Key)",
)
async def get_notification(notification_id: Id, request: Request) -> NotificationStatus:
    s = services(request)
    caller: Caller = request.state.caller
    await s.writer.caught_up(CATCH_UP_S)
    found = await s.pool.run(lambda db: find_own(db, caller, notification_id))
    if found is None:
        raise not_found(NOT_FOUND)
    return found


@router.get(
    "/v1/support/notifications/{notification_id:path}",
    response_model=NotificationStatus,
    responses=errors(*V1, 403, 404, 429),
    summary="Support: what became of any notification (by its id or full dedup key)",
)
async def support_notification(notification_id: Id, request: Request) -> NotificationStatus:
    s = services(request)
    await s.writer.caught_up(CATCH_UP_S)
    found = await s.pool.run(lambda db: find_any(db, notification_id))
    if found is None:
        raise not_found(NOT_FOUND)
    return found


def _user_notifications(db: Database, user_id: str, limit: int, caller: str | None) -> UserNotifications:
    requests = requests_of_user(db, user_id, limit, caller)
    rows = StatusStore(db).rows_of_user(user_id, limit * 3)
    if caller is not None:  # only the senders' rows of the caller's own requests
        mine = {r.notification_id for r in requests}
        rows = [r for r in rows if r.notification_id in mine]
    return UserNotifications(user_id=user_id, notifications=user_summaries(requests, rows, limit))


@router.get(
    "/v1/users/{user_id}/notifications",
    response_model=UserNotifications,
    responses=errors(*V1, 403, 429),
    summary="The caller's recent notifications to a user, newest first",
)
async def user_notifications(user_id: UserId, request: Request, limit: Limit = 50) -> UserNotifications:
    s = services(request)
    check_user(s, user_id)
    caller: Caller = request.state.caller
    await s.writer.caught_up(CATCH_UP_S)
    return await s.pool.run(lambda db: _user_notifications(db, user_id, limit, caller.name))


@router.get(
    "/v1/support/users/{user_id}/notifications",
    response_model=UserNotifications,
    responses=errors(*V1, 403, 429),
    summary="Support: a user's recent notifications of every caller, newest first",
)
async def support_user_notifications(user_id: UserId, request: Request, limit: Limit = 50) -> UserNotifications:
    s = services(request)
    check_user(s, user_id)
    await s.writer.caught_up(CATCH_UP_S)
    return await s.pool.run(lambda db: _user_notifications(db, user_id, limit, None))
