"""A notification request checked before it is written (pure): the Idempotency-Key, the template
(known, allowed for the caller, its kind), the channels, every parameter the template's version
at the event time needs, and the job's own field rules and input limits (operators.codec,
operators.limits), so nothing the API accepts is invalid downstream. Then what the user's profile
says now: the channels that have an address, and why the others do not."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from api import jsontext
from api.callers import Caller
from api.errors import ApiError, bad_request, forbidden
from api.models import NotificationIn
from operators import codec
from operators.errors import InvalidRecordError
from operators.limits import RequestLimits, field_problem, request_problem
from operators.records import Category, Channel, NotificationRequest, Priority
from senders.profiles.model import Preferences
from senders.rules.decision import ActiveContacts, Flagged, deliverable_among
from senders.templates.catalog import Catalog, Template
from senders.templates.errors import NoVersion


@dataclass(frozen=True, slots=True)
class Accepted:
    """A request to write: the record, its bytes, and what the answer will say of the channels."""

    request: NotificationRequest
    encoded: bytes
    kind: Category
    allow_unverified: bool = False


def event_time_ms(value: datetime | int | None, now_ms: int, field: str = "event_time") -> int:
    if value is None:
        return now_ms
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise bad_request(f"{field}: an ISO-8601 time needs an offset (Z or +06:00)")
        return int(value.timestamp() * 1000)
    if not -(2**62) < value < 2**62:
        raise bad_request(f"{field}: out of range")
    return value


def header_text(value: str | None, header: str, code: str) -> str | None:
    """A header's value as the client sent it, in UTF-8 (the server hands it over decoded as
    latin-1, byte for byte); 400 when it is not UTF-8."""
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:  # a character past latin-1 cannot have come from the wire; bytes not UTF-8
        raise bad_request(f"the {header} header must be UTF-8 text", code=code) from None


def check_key(key: str | None, limits: RequestLimits, prefix: str = "", header: str = "Idempotency-Key") -> str:
    """The Idempotency-Key (decoded text): present, printable, and within the job's field limit
    once in the caller's key space (``prefix``: ``<caller>/`` or ``ns:<namespace>/``)."""
    if key is None or not key.strip():
        raise bad_request(f"the {header} header is required: with the caller's name it makes the request's"
                          " dedup_key", code="missing_idempotency_key")
    if not key.isprintable():
        raise bad_request(f"the {header} header must be printable text", code="invalid_idempotency_key")
    problem = field_problem("dedup_key", prefix + key, limits)
    if problem:
        where = f" (with the prefix {prefix})" if prefix else ""
        raise bad_request(f"{header}{where}: {problem}", code="invalid_idempotency_key")
    return key


def template_for(catalog: Catalog, name: str, caller: Caller) -> Template:
    """The template, if it exists and the caller may send it and its kind."""
    template = catalog.templates.get(name)
    if template is None:
        raise bad_request(f"unknown template {name!r}", code="unknown_template")
    if not caller.may_send_template(template.name):
        raise forbidden(f"caller {caller.name} may not send template {template.name}")
    if not caller.may_send_kind(template.kind):
        raise forbidden(
            f"template {template.name} is {template.kind.value}; caller {caller.name} may send"
            f" {', '.join(sorted(c.value for c in caller.categories))} only"
        )
    return template


def required_parameters(template: Template, channels: tuple[Channel, ...], at_ms: int) -> frozenset[str]:
    """What the version of ``at_ms`` needs for these channels, in any locale it may be rendered in."""
    try:
        version = template.version_at(at_ms)
    except NoVersion as exc:
        raise bad_request(str(exc), code="no_version") from None
    needed: set[str] = set()
    for bodies in version.bodies.values():
        for channel in channels:
            if channel in bodies:
                needed |= bodies[channel].parameters
    return frozenset(needed)


def check_message(
    template: Template,
    channels_asked: list[Channel] | None,
    params: dict[str, str],
    at_ms: int,
    priority: Priority,
) -> tuple[Channel, ...]:
    """The channels to send on; every parameter present; a marketing message on the normal lane."""
    channels = tuple(dict.fromkeys(channels_asked)) if channels_asked else template.channels
    unsupported = [c.value for c in channels if c not in template.channels]
    if unsupported:
        raise bad_request(
            f"template {template.name} has no {', '.join(unsupported)} body (it has"
            f" {', '.join(c.value for c in template.channels)})",
            code="unsupported_channel",
        )
    if template.kind is Category.MARKETING and priority is Priority.HIGH:
        raise bad_request("a marketing notification goes on the normal lane: priority high is for"
                          " transactional ones", code="invalid_priority")
    missing = sorted(required_parameters(template, channels, at_ms) - params.keys())
    if missing:
        raise bad_request(
            f"template {template.name} needs parameter(s) {', '.join(missing)}", code="missing_parameter",
            problems=[f"params.{name}: missing" for name in missing],
        )
    return channels


def build_request(fields: dict[str, object], limits: RequestLimits, now_ms: int) -> tuple[NotificationRequest, bytes]:
    """The record, by the data contract's rules and the job's limits; ApiError 400 otherwise."""
    try:
        request = codec.request_from_fields(fields)
    except InvalidRecordError as exc:
        raise bad_request(exc.reason, code="invalid_field") from None
    encoded = codec.encode_request(request)
    problem = request_problem(request, encoded, limits, now_ms)
    if problem:
        raise bad_request(problem, code="over_limit")
    return request, encoded


def accept(
    body: NotificationIn,
    *,
    caller: Caller,
    catalog: Catalog,
    limits: RequestLimits,
    dedup_key: str,
    notification_id: str,
    now_ms: int,
    traceparent: str | None = None,
) -> Accepted:
    """The request to write for ``body``, or ApiError (400, 403)."""
    template = template_for(catalog, body.template, caller)
    at = event_time_ms(body.event_time, now_ms)
    channels = check_message(template, body.channels, body.params, at, body.priority)
    request, encoded = build_request(
        {
            "notification_id": notification_id,
            "user_id": body.user_id,
            "template_id": template.name,
            "params": body.params,
            "channels": [c.value for c in channels],
            "priority": body.priority.value,
            "category": template.kind.value,
            "event_time": at,
            "dedup_key": dedup_key,
            "dedup_ttl_sec": body.dedup_ttl_sec,
            "traceparent": traceparent,
        },
        limits,
        now_ms,
    )
    return Accepted(request, encoded, template.kind, template.allow_unverified)


class ProfileView(Protocol):
    """What the accept path reads of a user: ``senders.store.profiles.ProfileFlags`` (the API's
    read, no address opened), or a whole ``ProfileRead``."""

    @property
    def exists(self) -> bool: ...

    @property
    def preferences(self) -> Preferences | None: ...

    @property
    def contacts(self) -> ActiveContacts[Flagged]: ...


def _skip(active: tuple[Flagged, ...], preferences: Preferences | None, channel: Channel, kind: Category,
          allow_unverified: bool) -> str:
    """Why a message of this kind would not go to this channel (whose ``active`` addresses these
    are) now, by the senders' rules ("" when it would): a channel without an active address is
    skipped, so is one without a verified address (unless the template allows unverified ones),
    and one the user opted out of for marketing."""
    if not active:
        return "no address"
    if not deliverable_among(active, kind, allow_unverified):
        return "no verified address"
    if kind is Category.MARKETING and preferences is not None and not preferences.marketing.allows(channel):
        return "opted out"
    return ""


#: every question the accept path asks of a profile, in ``Reach.skips``'s order
_ASKED = [(kind, unverified, channel) for kind in Category for unverified in (False, True) for channel in Channel]
_PLACE = {asked: i for i, asked in enumerate(_ASKED)}


@dataclass(frozen=True, slots=True)
class Reach:
    """What the accept path says of a user's channels, worked out once per profile read: for each
    (kind, unverified allowed, channel) why a message would be skipped, "" when it is queued.

    The API keeps one for every user it has served lately (``api.profile_cache``): one object
    holding a tuple of strings, which the garbage collector stops tracking, where the profile's
    models were about two dozen tracked objects a user. With 29,000 users cached those were
    670,000 objects that every full collection walked, each a pause of the event loop."""

    exists: bool
    skips: tuple[str, ...] = ()

    @staticmethod
    def of(profile: ProfileView) -> Reach:
        if not profile.exists:
            return NO_REACH
        active = {channel: profile.contacts.active(channel) for channel in Channel}
        return Reach(True, tuple(_skip(active[channel], profile.preferences, channel, kind, unverified)
                                 for kind, unverified, channel in _ASKED))


NO_REACH = Reach(False)


def channels_now(
    reach: Reach, channels: tuple[Channel, ...], kind: Category, allow_unverified: bool = False
) -> tuple[list[str], list[str]]:
    """(queued, skipped) as the profile says now, by the senders' rules (``_skip``)."""
    queued: list[str] = []
    skipped: list[str] = []
    for channel in channels:
        why = reach.skips[_PLACE[kind, allow_unverified, channel]]
        if why:
            skipped.append(f"{channel.value}: {why}")
        else:
            queued.append(channel.value)
    return queued, skipped


def fingerprint(caller: Caller, body: NotificationIn, namespace: str | None = None) -> str:
    """What makes two requests with one Idempotency-Key the same request."""
    document: dict[str, object] = {"caller": caller.name, "body": body.model_dump(mode="json")}
    if namespace is not None:
        document["namespace"] = namespace
    return hashlib.sha256(jsontext.dumps(document, sort_keys=True)).hexdigest()


def unknown_user(user_id: str) -> ApiError:
    return ApiError(404, "unknown_user", "no profile for this user: PUT /v1/users/{id}/preferences or contacts first")
