"""The user profile document: preferences (locale, time zone, quiet hours, marketing opt-in per
channel) and contacts per channel.

One JSON document per user, the shape ``dedupctl users put`` and the HTTP API take::

    {"locale": "bn", "tz": "Asia/Dhaka", "quiet_hours": {"from": "22:00", "to": "08:00"},
     "marketing": {"push": true, "sms": true, "email": false},
     "contacts": {"push": ["tok-1"], "sms": ["+8801711000001"], "email": ["a@example.com"]}}

A contact is either just its address (the short form: verified and active) or
``{"address": ..., "verified": bool, "active": bool}``; a push contact may also carry its
``platform`` (``ios``, ``android`` or ``web``). Every field is optional: no locale means the
templates' default locale, the time zone defaults to UTC, no quiet hours means none, a channel
missing from ``marketing`` is opted in, and no contacts means nothing can be sent.

Validation is strict: unknown fields, a time zone that is not ``UTC`` or an IANA ``Area/Location``
name (``Asia/Dhaka``, ``America/Argentina/Salta``; not ``localtime``, ``Factory``, ``posixrules``,
the POSIX-style ``EST5EDT``, nor ``Etc/GMT+6``: a fixed offset follows no place's clock, and its
sign is the reverse of what it reads; say ``UTC`` or a city), times that are not
``HH:MM``, phone numbers not in E.164, implausible email addresses, duplicate addresses and
oversized documents are all rejected. ``ProfileError`` lists the problems by field; it never
quotes an address (contacts are personal data), nor does the repr of a contact.

A stored document is read with ``STORED`` as the validation context: a zone stored before the
rule was strict (any name ``zoneinfo`` knows) still reads, and stays until the time zone is
changed; only what comes in is held to the rule.
"""

from __future__ import annotations

import json
import re
import zoneinfo
from datetime import time
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from operators.records import Channel
from senders.errors import SenderError

MAX_DOCUMENT_BYTES = 64 * 1024
MAX_CONTACTS_PER_CHANNEL = 10
MAX_TOKEN_CHARS = 4096
MAX_EMAIL_CHARS = 254
#: the channels, as a tuple (iterating the enum itself costs microseconds every time, per contact read)
CHANNELS = tuple(Channel)

_HHMM = re.compile(r"([01]\d|2[0-3]):([0-5]\d)")
_LOCALE = re.compile(r"([A-Za-z]{2,3})((?:-[A-Za-z]{4})?)((?:-(?:[A-Za-z]{2}|\d{3}))?)")
_E164 = re.compile(r"\+[1-9]\d{6,14}")
_EMAIL_LOCAL = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*")
_DNS_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


class ProfileError(SenderError):
    """A profile document or update is not valid; ``problems`` says where and why, one line each."""

    def __init__(self, problems: list[str] | tuple[str, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("invalid profile: " + "; ".join(self.problems))


# -- field types -----------------------------------------------------------------------------------


@cache
def _zone_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


#: the areas of IANA's Area/Location names
ZONE_AREAS = frozenset({"Africa", "America", "Antarctica", "Arctic", "Asia", "Atlantic", "Australia", "Europe",
                        "Indian", "Pacific"})
#: the validation context of a stored document (``parse_profile(..., stored=True)``)
STORED = {"stored": True}


def zone_problem(name: str) -> str | None:
    """Why ``name`` is not a time zone a profile may be given, or None."""
    if name == "UTC":
        return None
    if name.partition("/")[0] not in ZONE_AREAS or name not in _zone_names():
        return "a time zone is UTC or an IANA Area/Location name such as Asia/Dhaka"
    return None


def _check_zone(name: str, info: ValidationInfo) -> str:
    stored = bool(info.context and info.context.get("stored"))
    if stored and name in _zone_names():
        return name
    problem = zone_problem(name)
    if problem:
        raise ValueError(problem)
    return name


def _check_hhmm(value: str) -> str:
    if not _HHMM.fullmatch(value):
        raise ValueError("a time must be HH:MM, 00:00 to 23:59")
    return value


def canonical_locale(value: str) -> str:
    """A language tag in its canonical case (``EN-us`` -> ``en-US``); raises ValueError."""
    match = _LOCALE.fullmatch(value)
    if match is None:
        raise ValueError("a locale must be a language tag such as bn, en or en-US")
    language, script, region = match.groups()
    return language.lower() + script.title() + region.upper()


TimeZoneName = Annotated[StrictStr, AfterValidator(_check_zone)]
LocalTime = Annotated[StrictStr, AfterValidator(_check_hhmm)]
Locale = Annotated[StrictStr, AfterValidator(canonical_locale)]
Platform = Literal["ios", "android", "web"]


def normalize_address(channel: Channel, address: str) -> str:
    """The form an address is stored and compared in: surrounding space dropped, and the domain
    of an email address in lower case. It does not validate."""
    address = address.strip()
    if channel is Channel.EMAIL and "@" in address:
        local, _, domain = address.rpartition("@")
        return f"{local}@{domain.lower()}"
    return address


def _check_phone(value: str) -> str:
    value = normalize_address(Channel.SMS, value)
    if not _E164.fullmatch(value):
        raise ValueError("a phone number must be in E.164 form: + and 7 to 15 digits, no spaces")
    return value


def _check_email(value: str) -> str:
    value = normalize_address(Channel.EMAIL, value)
    if len(value) > MAX_EMAIL_CHARS:
        raise ValueError(f"an email address has at most {MAX_EMAIL_CHARS} characters")
    local, at, domain = value.rpartition("@")
    if not at or not local or len(local) > 64 or not _EMAIL_LOCAL.fullmatch(local):
        raise ValueError("not a plausible email address (local part)")
    try:
        ascii_domain = domain.encode("idna").decode("ascii")
    except UnicodeError:
        raise ValueError("not a plausible email address (domain)") from None
    labels = ascii_domain.split(".")
    if len(labels) < 2 or not all(_DNS_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
        raise ValueError("not a plausible email address (domain)")
    return value


def _check_token(value: str) -> str:
    value = normalize_address(Channel.PUSH, value)
    if not value or len(value) > MAX_TOKEN_CHARS:
        raise ValueError(f"a device token has 1 to {MAX_TOKEN_CHARS} characters")
    if not value.isascii() or not value.isprintable() or any(c.isspace() for c in value):
        raise ValueError("a device token is printable ASCII without spaces")
    return value


# -- the models ------------------------------------------------------------------------------------


class StrictModel(BaseModel):
    """Unknown fields rejected, instances immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class _Contact(StrictModel):
    address: str = Field(repr=False)
    verified: StrictBool = True
    active: StrictBool = True

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        return {"address": data} if isinstance(data, str) else data


class PushContact(_Contact):
    address: Annotated[StrictStr, AfterValidator(_check_token)] = Field(repr=False)
    platform: Platform | None = None


class SmsContact(_Contact):
    address: Annotated[StrictStr, AfterValidator(_check_phone)] = Field(repr=False)


class EmailContact(_Contact):
    address: Annotated[StrictStr, AfterValidator(_check_email)] = Field(repr=False)


Contact = PushContact | SmsContact | EmailContact


class Contacts(StrictModel):
    """Addresses per channel, in the order given."""

    push: tuple[PushContact, ...] = Field(default=(), max_length=MAX_CONTACTS_PER_CHANNEL)
    sms: tuple[SmsContact, ...] = Field(default=(), max_length=MAX_CONTACTS_PER_CHANNEL)
    email: tuple[EmailContact, ...] = Field(default=(), max_length=MAX_CONTACTS_PER_CHANNEL)

    @model_validator(mode="after")
    def _distinct(self) -> Contacts:
        for channel in CHANNELS:
            addresses = [c.address for c in self.of(channel)]
            if len(set(addresses)) != len(addresses):
                raise ValueError(f"{channel.value}: the same address is given twice")
        return self

    def of(self, channel: Channel) -> tuple[Contact, ...]:
        """The channel's contacts, active or not."""
        contacts: tuple[Contact, ...] = getattr(self, channel.value)
        return contacts

    def active(self, channel: Channel) -> tuple[Contact, ...]:
        """The channel's contacts a message goes to."""
        return tuple(c for c in self.of(channel) if c.active)


class QuietHours(StrictModel):
    """Local times ``from`` (inclusive) to ``to`` (exclusive); ``from`` after ``to`` spans midnight,
    ``from`` equal to ``to`` is no window at all."""

    start: LocalTime = Field(alias="from")
    end: LocalTime = Field(alias="to")

    def start_time(self) -> time:
        return time.fromisoformat(self.start)

    def end_time(self) -> time:
        return time.fromisoformat(self.end)


class Marketing(StrictModel):
    """Marketing opt-in per channel; a channel not given is opted in."""

    push: StrictBool = True
    sms: StrictBool = True
    email: StrictBool = True

    def allows(self, channel: Channel) -> bool:
        return bool(getattr(self, channel.value))


class Preferences(StrictModel):
    """What the rules read: locale, time zone, quiet hours, marketing opt-in."""

    locale: Locale | None = None
    tz: TimeZoneName = "UTC"
    quiet_hours: QuietHours | None = None
    marketing: Marketing = Marketing()

    def zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.tz)


class Profile(Preferences):
    """The whole document: the preferences and the contacts."""

    contacts: Contacts = Contacts()


# -- parsing and writing ---------------------------------------------------------------------------


def problems_of(exc: ValidationError) -> list[str]:
    """One line per problem, ``field.path: message``, without the rejected input."""
    lines = []
    for err in exc.errors(include_url=False, include_input=False, include_context=False):
        where = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in err["loc"]).replace(".[", "[")
        message = err["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {message}" if where else message)
    return lines


def parse_profile(data: object, *, stored: bool = False) -> Profile:
    """A profile from a parsed JSON document; raises ProfileError. ``stored``: a document the
    store holds (or made from one), whose time zone may predate the strict rule."""
    try:
        return Profile.model_validate(data, context=STORED if stored else None)
    except ValidationError as exc:
        raise ProfileError(problems_of(exc)) from None


def profile_from_json(text: str | bytes) -> Profile:
    """A profile from JSON text of at most MAX_DOCUMENT_BYTES; raises ProfileError."""
    size = len(text.encode("utf-8") if isinstance(text, str) else text)
    if size > MAX_DOCUMENT_BYTES:
        raise ProfileError([f"the document has {size} bytes, more than {MAX_DOCUMENT_BYTES}"])
    try:
        data = json.loads(text)
    except ValueError as exc:
        message = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        raise ProfileError([f"not JSON: {message}"]) from None
    return parse_profile(data)


def profile_document(profile: Preferences) -> dict[str, Any]:
    """The canonical JSON document (every field, contacts in the long form)."""
    return profile.model_dump(mode="json", by_alias=True)
