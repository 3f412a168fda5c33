"""The ``dedupctl trace`` answer in words (docs/operations.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ops.status_view import fmt_duration, fmt_time
from ops.trace import NotificationTrace, TraceResult, Where

VERDICTS = {
    "accepted": "ACCEPTED",
    "duplicate": "DUPLICATE",
    "late": "LATE",
    "pending": "NO OUTCOME YET (not processed, or its checkpoint not committed)",
    "unknown": "SEEN ONLY IN OTHER RECORDS",
}


def _at(where: Mapping[str, Any]) -> str:
    return str(Where(where["topic"], where["partition"], where["offset"]))


def _request_line(n: NotificationTrace) -> str:
    r = n.request or {}
    channels = ",".join(r.get("channels") or [])
    origin = f"{n.request_at}  " if n.request_at else ""
    return (
        f"    request   {origin}event time {fmt_time(r.get('event_time'))}  user {r.get('user_id')}"
        f"  template {r.get('template_id')}  channels {channels}  priority {r.get('priority')}"
    )


def _notification(n: NotificationTrace, placement: Mapping[str, int] | None, note: str = "") -> list[str]:
    head = f"{n.notification_id}  {VERDICTS[n.verdict]}"
    if n.duplicate is not None:
        d = n.duplicate
        head += (f" of {d['original_notification_id']} (occurrence {d['occurrence']}, original event time"
                 f" {fmt_time(d['first_seen_event_time'])})")
    if n.late is not None and not n.accepted:
        event_time = (n.request or {}).get("event_time")
        behind = n.late["watermark"] - event_time if event_time is not None else None
        head += f": event time behind the watermark {fmt_time(n.late['watermark'])} by {fmt_duration(behind)}"
    state = f"  (state: shard {placement['shard']}, key group {placement['key_group']})" if placement else ""
    lines = [head + note, f"    dedup key {n.dedup_key}{state}"]
    if n.request is not None:
        lines.append(_request_line(n))
    for m in n.accepted:
        key = m["kafka"].get("key")
        lines.append(f"    {m['channel']:<9} {_at(m['kafka'])}  message key {m['message_key']}"
                     + (f"  Kafka key {key}" if key else ""))
    if n.duplicate is not None:
        d = n.duplicate
        lines.append(f"    notice    {_at(d['kafka'])}  event time {fmt_time(d['event_time'])}")
    if n.late is not None:
        lines.append(f"    notice    {_at(n.late['kafka'])}  {n.late['reason']}")
    for s in sorted(n.statuses, key=lambda s: (s.get("at") or 0, s["kafka"]["offset"])):
        extra = "".join(
            f"  {k} {s[k]}" for k in ("attempt", "provider", "reason", "error") if s.get(k) not in (None, "")
        )
        if s.get("status") == "deferred" and isinstance(s.get("not_before"), int):
            extra += f"  until {fmt_time(s['not_before'])}"
        if s.get("template") and s.get("template_version") is not None:
            extra += f"  template {s['template']} v{s['template_version']} {s.get('locale') or ''}".rstrip()
        when = s.get("at") if isinstance(s.get("at"), int) else None
        lines.append(f"    status    {s.get('message_key')}  {s.get('status')}{extra}  at {fmt_time(when)}")
    return lines


def render(result: TraceResult) -> str:
    q = result.query
    if not result.found:
        return f"trace {q}: no record in {', '.join(result.topics_read)} mentions it"
    own = [n for n in result.notifications.values() if n.notification_id == q or n.dedup_key == q]
    related = [n for n in result.notifications.values() if n not in own]
    lines = [f"trace {q}"]
    for n in own:
        lines += _notification(n, result.placement(n.dedup_key))
    for n in related:
        lines += _notification(n, result.placement(n.dedup_key), "  (same dedup key)")
    for inv in result.invalid:
        lines.append(
            f"INVALID  {_at(inv['kafka'])}: {inv['error']} (read from {inv['source']}; raw bytes mention {q})"
        )
    if result.status_topic is None:
        lines.append("(no delivery status: no senders' status topic on this broker)")
    return "\n".join(lines)
