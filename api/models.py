"""The bodies the API takes and gives (pydantic: they make the OpenAPI document too)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from operators.records import Channel, Priority
from senders.profiles.model import (
    MAX_CONTACTS_PER_CHANNEL,
    MAX_TOKEN_CHARS,
    EmailContact,
    Platform,
    PushContact,
    SmsContact,
)

#: the largest value of an Avro long (what the request record's numbers are)
AVRO_LONG_MAX = 2**63 - 1


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(BaseModel):
    error: str = Field(description="a short machine code: invalid_request, unknown_template, ...")
    message: str
    problems: list[str] | None = Field(default=None, description="one line per problem, by field")
    scope: str | None = Field(default=None, description="403: the scope the route needs")


class NotificationIn(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"user_id": "nusrat", "template": "order_shipped", "params": {"order": "BD-7790"}, "channels": ["sms"]},
    ]})

    user_id: str = Field(min_length=1, examples=["nusrat"])
    template: str = Field(min_length=1, examples=["order_shipped"])
    params: dict[str, str] = Field(default_factory=dict, examples=[{"order": "BD-7790"}])
    priority: Priority = Priority.NORMAL
    channels: list[Channel] | None = Field(
        default=None, min_length=1, description="default: every channel of the template"
    )
    event_time: datetime | int | None = Field(
        default=None, description="ISO-8601 with an offset, or epoch milliseconds; default: now"
    )
    dedup_ttl_sec: int | None = Field(default=None, ge=1, le=AVRO_LONG_MAX,
                                      description="the dedup window of this request (the job clamps it to"
                                      " dedup.max_window_sec)")


class NotificationAccepted(BaseModel):
    id: str
    dedup_key: str
    queued: list[str] = Field(description="the channels the profile has an address for now")
    skipped: list[str] = Field(description="'<channel>: <why>' for the others (the senders decide at send time)")
    status_url: str


class ChannelStatus(BaseModel):
    status: str = Field(description="pending (not yet with the senders), queued, sending, sent, delivered, failed,"
                        " skipped, deferred, rejected")
    reason: str | None = None
    attempts: int = 0
    provider: str | None = None
    not_before: int | None = Field(default=None, description="a deferred message's due time (epoch ms)")
    template_version: int | None = None
    locale: str | None = None
    message_key: str | None = None
    updated_at: int | None = None
    receipts: list[Receipt] = Field(default_factory=list)


class Receipt(BaseModel):
    status: str
    reason: str | None = None
    received_at: int


class NotificationStatus(BaseModel):
    id: str
    dedup_key: str | None = None
    user_id: str | None = None
    template: str | None = None
    accepted_at: int | None = Field(default=None, description="when the API wrote it to Kafka (epoch ms)")
    event_time: int | None = None
    verdict: Literal["accepted", "duplicate", "late", "invalid", "pending"] = Field(
        description="the dedup job's: accepted, duplicate (of duplicate_of), late (behind the watermark), invalid;"
        " pending while it has said nothing yet"
    )
    duplicate_of: str | None = None
    occurrence: int | None = None
    watermark: int | None = None
    reason: str | None = Field(default=None, description="why it was late or invalid")
    channels: dict[str, ChannelStatus] = Field(default_factory=dict)


class NotificationSummary(BaseModel):
    id: str
    dedup_key: str | None = None
    template: str | None = None
    accepted_at: int | None = None
    channels: dict[str, str] = Field(default_factory=dict, description="channel -> status")


class UserNotifications(BaseModel):
    user_id: str
    notifications: list[NotificationSummary]


class ContactsIn(Strict):
    """Each channel given replaces that channel's list; an address the profile holds, given as a
    string, keeps its flags (senders/profiles/updates.py)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"sms": ["+8801711000001"]}]})

    push: list[str | PushContact] | None = Field(default=None, max_length=MAX_CONTACTS_PER_CHANNEL)
    sms: list[str | SmsContact] | None = Field(default=None, max_length=MAX_CONTACTS_PER_CHANNEL)
    email: list[str | EmailContact] | None = Field(default=None, max_length=MAX_CONTACTS_PER_CHANNEL)


class ProfileOut(BaseModel):
    user_id: str
    locale: str | None
    tz: str
    quiet_hours: dict[str, str] | None
    marketing: dict[str, bool]
    contacts: dict[str, int] = Field(description="channel -> how many addresses (never the addresses)")


class DeviceIn(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"user_id": "nusrat", "token": "tok-nusrat-2", "platform": "android"},
    ]})

    user_id: str = Field(min_length=1)
    token: str = Field(min_length=1, max_length=MAX_TOKEN_CHARS)
    platform: Platform


class Erased(BaseModel):
    """What was removed (counts of rows)."""

    user_id: str
    profile: bool
    contacts: int
    statuses: int
    requests: int
    idempotency_keys: int = 0
    verdicts: int = 0
    receipts: int = 0
    limit_counters: int = 0
    campaign_entries: int = 0


class ReceiptIn(Strict):
    message_id: str = Field(min_length=1, max_length=256, description="the provider's id of the message")
    status: Literal["delivered", "failed"]
    reason: str | None = Field(default=None, max_length=200, pattern=r"^[A-Za-z0-9_.:\- ]*$")


class ReceiptOut(BaseModel):
    message_key: str
    status: str
    changed: bool = Field(description="false when this receipt had been applied already")


class CampaignIn(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"template": "eid_sale", "segment": ["nusrat", "bruno"], "params": {"pct": "20"}, "rate": 10},
    ]})

    template: str = Field(min_length=1, examples=["eid_sale"])
    segment: list[str] | None = Field(default=None, min_length=1, description="the user ids")
    segment_file: str | None = Field(default=None, description="a file of user ids, one a line, in api.segments_dir")
    params: dict[str, str] = Field(default_factory=dict)
    channels: list[Channel] | None = Field(default=None, min_length=1)
    send_at: datetime | int | None = Field(default=None, description="ISO-8601 or epoch ms; default: now")
    rate: float = Field(default=100.0, gt=0, le=100_000, description="requests per second")


class CampaignOut(BaseModel):
    campaign_id: str
    state: Literal["scheduled", "running", "paused", "done"]
    template: str
    total: int
    written: int = Field(description="requests Kafka has (committed)")
    rate: float
    send_at: int
    created_at: int
    updated_at: int


class CampaignCreated(BaseModel):
    campaign_id: str
    status_url: str


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = Field(default_factory=dict)


ChannelStatus.model_rebuild()
