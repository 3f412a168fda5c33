"""What became of a notification, from its records (pure): the request the API wrote, the job's
verdict when it was not accepted (duplicate, late, invalid), and per channel the senders' row
and the receipts of its message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from api.models import ChannelStatus, NotificationStatus, NotificationSummary, Receipt
from api.store import Outcome, RequestRecord
from senders.statuses import DeliveryStatus
from senders.store.status import StatusRow

PENDING = "pending"


def channel_status(row: StatusRow, receipts: Sequence[tuple[str, str | None, int]] = ()) -> ChannelStatus:
    return ChannelStatus(
        status=row.status.value,
        reason=row.reason or (row.last_error if row.status in (DeliveryStatus.FAILED, DeliveryStatus.QUEUED) else None),
        attempts=row.attempts,
        provider=row.provider,
        not_before=row.not_before_ms if row.status is DeliveryStatus.DEFERRED else None,
        template_version=row.template.version if row.template else None,
        locale=row.template.locale if row.template else None,
        message_key=row.message_key,
        updated_at=row.updated_ms,
        receipts=[Receipt(status=s, reason=r, received_at=at) for s, r, at in receipts],
    )


def notification_status(
    notification_id: str,
    request: RequestRecord | None,
    outcomes: Sequence[Outcome],
    rows: Sequence[StatusRow],
    receipts: Mapping[str, Sequence[tuple[str, str | None, int]]],
) -> NotificationStatus:
    """The answer of ``GET /v1/notifications/{id}``."""
    by_verdict = {o.verdict: o for o in outcomes}
    latest: dict[str, StatusRow] = {}
    for row in sorted(rows, key=lambda r: (r.message_key.rsplit(":", 1)[-1].rjust(20, "0"), r.updated_ms)):
        latest[row.channel.value] = row
    channels = {c: channel_status(r, receipts.get(r.message_key, ())) for c, r in sorted(latest.items())}
    invalid, late, duplicate = (by_verdict.get(v) for v in ("invalid", "late", "duplicate"))
    if invalid is not None:
        verdict = "invalid"
    elif late is not None and not channels:
        verdict = "late"
    elif duplicate is not None and not channels:
        verdict = "duplicate"
    elif channels:
        verdict = "accepted"
    else:
        verdict = PENDING
    if verdict in ("accepted", PENDING) and request is not None:
        for channel in request.channels:
            channels.setdefault(channel, ChannelStatus(status=PENDING))
    dedup_key = request.dedup_key if request else next((o.dedup_key for o in outcomes if o.dedup_key), None)
    if dedup_key is None and rows:
        dedup_key = rows[0].message_key.rsplit(":", 2)[0]
    return NotificationStatus(
        id=notification_id,
        dedup_key=dedup_key,
        user_id=request.user_id if request else next((r.user_id for r in rows if r.user_id), None),
        template=request.template if request else next((r.template.name for r in rows if r.template), None),
        accepted_at=request.accepted_ms if request else None,
        event_time=request.event_time_ms if request else None,
        verdict=verdict,  # type: ignore[arg-type]
        duplicate_of=duplicate.original_id if duplicate else None,
        occurrence=duplicate.occurrence if duplicate else None,
        watermark=late.watermark_ms if late else None,
        reason=(invalid or late).reason if (invalid or late) else None,  # type: ignore[union-attr]
        channels=channels,
    )


def user_summaries(
    requests: Sequence[RequestRecord], rows: Sequence[StatusRow], limit: int
) -> list[NotificationSummary]:
    """A user's notifications, newest first: those the API wrote and those the senders have."""
    out: dict[str, NotificationSummary] = {}
    for r in requests:
        out[r.notification_id] = NotificationSummary(
            id=r.notification_id, dedup_key=r.dedup_key, template=r.template, accepted_at=r.accepted_ms,
            channels={c: PENDING for c in r.channels},
        )
    order = {r.notification_id: r.accepted_ms for r in requests}
    for row in rows:
        summary = out.get(row.notification_id)
        if summary is None:
            summary = out[row.notification_id] = NotificationSummary(
                id=row.notification_id, dedup_key=row.message_key.rsplit(":", 2)[0],
                template=row.template.name if row.template else None,
            )
            order[row.notification_id] = row.updated_ms
        summary.channels[row.channel.value] = row.status.value
    ranked = sorted(out.values(), key=lambda s: order.get(s.id, 0), reverse=True)
    return ranked[:limit]
