"""The profiles of the rules issue over HTTP: preferences, contacts, devices, erasure. Contacts
are encrypted at rest (senders.store.profiles); no answer and no log line carries an address."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Path, Request

from api.docs import V1, errors
from api.erase import erase_user
from api.errors import bad_request, not_found
from api.models import ContactsIn, DeviceIn, Erased, ProfileOut
from api.services import Services, services
from operators.records import Channel
from senders.profiles.model import Profile, ProfileError
from senders.profiles.updates import PreferencesUpdate
from senders.profiles.user_id import user_id_problem
from senders.store.profiles import ProfileStore

logger = logging.getLogger(__name__)
router = APIRouter()

UserId = Annotated[str, Path(min_length=1, max_length=512, description="1 to dedup.max_field_bytes UTF-8 bytes,"
                             " printable, no surrounding spaces, no /")]


def check_user(s: Services, user_id: str, where: str = "user_id") -> str:
    """The one user-id rule (senders.profiles.user_id) with the job's field limit; 400 otherwise."""
    problem = user_id_problem(user_id, s.limits.max_field_bytes)
    if problem:
        raise bad_request(f"{where}: {problem}", code="invalid_user_id")
    return user_id


def profile_out(user_id: str, profile: Profile) -> ProfileOut:
    qh = profile.quiet_hours
    return ProfileOut(
        user_id=user_id,
        locale=profile.locale,
        tz=profile.tz,
        quiet_hours={"from": qh.start, "to": qh.end} if qh else None,
        marketing=profile.marketing.model_dump(),
        contacts={c.value: len(profile.contacts.of(c)) for c in Channel},
    )


def _problems(exc: ProfileError) -> Exception:
    return bad_request("the profile update is not valid", code="invalid_profile", problems=list(exc.problems))


@router.put("/v1/users/{user_id}/preferences", response_model=ProfileOut, responses=errors(*V1, 403, 429),
            summary="Change a user's preferences (the fields given; a user without a profile gets one)")
async def put_preferences(user_id: UserId, body: PreferencesUpdate, request: Request) -> ProfileOut:
    s = services(request)
    check_user(s, user_id)
    update = body.model_dump(mode="json", by_alias=True, exclude_unset=True)
    s.profiles.drop(user_id)
    try:
        profile = await s.pool.run(lambda db: ProfileStore(db, s.cipher).apply_preferences(user_id, update))
    except ProfileError as exc:
        raise _problems(exc) from None
    return profile_out(user_id, profile)


@router.put("/v1/users/{user_id}/contacts", response_model=ProfileOut, responses=errors(*V1, 403, 429),
            summary="Replace a user's addresses on the channels given")
async def put_contacts(user_id: UserId, body: ContactsIn, request: Request) -> ProfileOut:
    s = services(request)
    check_user(s, user_id)
    update = body.model_dump(mode="json", exclude_unset=True)
    s.profiles.drop(user_id)
    try:
        profile = await s.pool.run(lambda db: ProfileStore(db, s.cipher).apply_contacts(user_id, update))
    except ProfileError as exc:
        raise _problems(exc) from None
    return profile_out(user_id, profile)


@router.post("/v1/devices", response_model=ProfileOut, responses=errors(*V1, 403, 429),
             summary="Register a push token (again: an earlier deactivation no longer holds)")
async def post_device(body: DeviceIn, request: Request) -> ProfileOut:
    s = services(request)
    check_user(s, body.user_id)
    s.profiles.drop(body.user_id)
    try:
        profile = await s.pool.run(
            lambda db: ProfileStore(db, s.cipher).add_device(body.user_id, body.token, body.platform)
        )
    except ProfileError as exc:
        raise _problems(exc) from None
    return profile_out(body.user_id, profile)


@router.get("/v1/users/{user_id}", response_model=ProfileOut, responses=errors(*V1, 403, 404, 429),
            summary="A user's preferences and how many addresses per channel")
async def get_user(user_id: UserId, request: Request) -> ProfileOut:
    s = services(request)
    check_user(s, user_id)
    try:
        profile = await s.pool.run(lambda db: ProfileStore(db, s.cipher).get(user_id))
    except ProfileError:
        raise bad_request("the stored profile cannot be read (check senders.contact_encryption_keys)",
                          code="unreadable_profile") from None
    if profile is None:
        raise not_found("no profile for this user", code="unknown_user")
    return profile_out(user_id, profile)


@router.delete("/v1/users/{user_id}", response_model=Erased, responses=errors(*V1, 403, 404, 429),
               summary="Erase a user: everything stored of them (docs/api.md lists it)")
async def delete_user(user_id: UserId, request: Request) -> Erased:
    s = services(request)
    check_user(s, user_id)
    done = await s.pool.run(lambda db: erase_user(db, s.cipher, user_id))
    s.profiles.drop(user_id)
    if not done.anything:
        raise not_found("nothing is stored for this user", code="unknown_user")
    logger.info("erased a user: profile %s, %d contacts, %d statuses, %d requests, %d campaign entries",
                done.profile, done.contacts, done.statuses, done.requests, done.campaign_entries)
    return Erased(user_id=user_id, profile=done.profile, contacts=done.contacts, statuses=done.statuses,
                  requests=done.requests, idempotency_keys=done.idempotency_keys, verdicts=done.verdicts,
                  receipts=done.receipts, limit_counters=done.limit_counters, campaign_entries=done.campaign_entries)
