"""The senders' part of ``dedupctl demo``: the story's profiles in the store, then every channel
message the dedup job wrote, through the rules and the real provider protocols to local servers
scripted as the story's world (``harness/demo_world.py``: FCM HTTP v1 for push, Twilio's Messages
API for SMS, a flaky gateway; SendGrid's v3 mail send for email, a mailbox that does not exist).
Prints each attempt and rule outcome, what became of each message, and the protocol each channel
used. Never a parameter, a rendered body, an address or a key."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
import zoneinfo
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from harness import scenario
from harness.demo_world import DemoWorld, start_world
from operators import codec
from operators.records import Channel
from ops import kafka_io
from senders.profiles.crypto import generate_key
from senders.profiles.model import parse_profile
from senders.runtime.dispatch import Dispatcher
from senders.runtime.handler import AttemptEvent
from senders.runtime.pool import (
    ALL_CHANNELS,
    ALL_LANES,
    build_pool,
    ensure_topics,
    open_profile_store,
    open_status_store,
    source_topic,
)
from senders.statuses import FINAL_STATUSES, DeliveryStatus
from senders.store.status import StatusRow
from settings import Settings

SETTLED = FINAL_STATUSES | {DeliveryStatus.DEFERRED}


def demo_senders(cfg: Settings, work: Path, world: DemoWorld) -> Settings:
    run = uuid.uuid4().hex[:8]
    return cfg.with_overrides(
        senders={
            "group_prefix": f"demo-senders-{run}",
            "instance_id": run,
            "status_store": str(work / "status.sqlite3"),
            "sqlite_synchronous": "NORMAL",
            "base_backoff_ms": 1000,
            "max_attempts": 4,
            "jitter_ratio": 0.0,
            "poll_timeout_ms": 50,
            "lease_ms": 5000,
            "http_timeout_ms": 2000,  # the local servers answer at once; the lease outlives it
            "session_timeout_ms": 6000,
            "transaction_timeout_ms": 10000,
            **world.senders_settings(),
            "contact_encryption_keys": generate_key(),
            "contact_lookup_keys": generate_key(),
        }
    )


def local_time(ms: int, zone: str) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=zoneinfo.ZoneInfo(zone)).strftime("%H:%M %Z")


@dataclass
class Story:
    """What the demo ran: the night zone, the channel messages by key, the local servers the
    providers sent to and, per channel, the protocols it used (``protocol_lines``)."""

    zone: str
    messages: dict[str, tuple[str, str, str]]  # message key -> (notification id, user id, channel)
    world: DemoWorld
    rows: dict[str, StatusRow]
    protocols: list[str] = field(default_factory=list)


def protocol_lines(dispatchers: Mapping[Channel, Dispatcher]) -> list[str]:
    """Per channel, the protocol and name of each provider its dispatcher was built with, and the
    calls it took (the provider's own ``provider_calls_total``)."""
    lines = []
    for channel, d in dispatchers.items():
        used = []
        for role, provider in (("primary", d.primary), ("secondary", d.secondary)):
            if provider is not None:
                calls = int(provider.metrics.value(
                    "provider_calls_total", provider=provider.name, channel=channel.value))
                used.append(f"{role} {provider.describe()}, {calls} call{'' if calls == 1 else 's'}")
        lines.append(f"  {channel.value:<5} " + "; ".join(used))
    return lines


def _describe(e: AttemptEvent, story: Story) -> str:
    nid, user, _ = story.messages.get(e.message_key, ("?", "?", e.channel.value))
    line = f"  {nid:<4} {user:<8} {e.channel.value:<5} attempt {e.attempt}: {e.outcome}"
    if e.provider:
        line += f" via {e.provider}"
    if e.outcome == "deferred" and e.not_before_ms is not None:
        line += f" ({e.detail}) until {local_time(e.not_before_ms, story.zone)} in {story.zone}"
    elif e.outcome not in ("sent", "ignored") and e.detail:
        line += f" ({e.detail})"
    if e.retry_in_ms is not None:
        line += f", retry in {e.retry_in_ms / 1000:.1f} s"
    if e.dead_letter is not None:
        line += f" -> dead letter ({e.dead_letter})"
    if e.outcome == "sent" and e.template is not None:
        line += f" [{e.template.name} v{e.template.version} {e.template.locale}]"
    return line


def channel_messages(cfg: Settings) -> dict[str, tuple[str, str, str]]:
    topics = [source_topic(cfg, c, lane) for c in ALL_CHANNELS for lane in ALL_LANES]
    out = {}
    for m in kafka_io.read_committed(cfg.kafka.client_config(), topics, idle_timeout_s=1.0):
        if m.value is not None:
            msg = codec.decode("channel_message", m.value)
            out[msg["message_key"]] = (msg["notification_id"], msg["user_id"], msg["channel"])
    return out


def run_story(cfg: Settings, world: DemoWorld, say: Callable[[str], None], timeout_s: float = 60.0) -> Story:
    """Put the profiles, run every channel's workers (their providers as ``cfg`` names them) until
    each channel message is settled (final, or deferred), and return what happened."""
    zone = scenario.night_zone()
    messages = channel_messages(cfg)
    ensure_topics(cfg)
    profiles = open_profile_store(cfg)
    for user, document in scenario.profiles(zone).items():
        profiles.put(user, parse_profile(document))
    say("")
    say(
        f"Senders: {len(messages)} channel messages for three users (u-amina's quiet hours are 22:00-08:00"
        f" in {zone}, where it is {local_time(int(time.time() * 1000), zone)} now); local servers that speak"
        " FCM HTTP v1, Twilio's Messages API and SendGrid's v3 mail send, scripted as the outside world:"
        " a flaky SMS gateway, a mailbox that does not exist; retries after 1, 2, 4 s"
    )
    story = Story(zone, messages, world, {})
    lock = threading.Lock()

    def on_attempt(event: AttemptEvent) -> None:
        with lock:
            say(_describe(event, story))

    store = open_status_store(cfg)
    pool = build_pool(cfg, on_attempt=on_attempt)
    try:
        pool.start()
        deadline = time.monotonic() + timeout_s
        while True:
            rows = {r.message_key: r for r in store.rows()}
            if all(k in rows and rows[k].status in SETTLED for k in messages):
                break
            if pool.fatal is not None or time.monotonic() > deadline:
                raise TimeoutError(f"senders not settled after {timeout_s:.0f} s ({len(rows)} of {len(messages)} seen)")
            time.sleep(0.2)
        time.sleep(0.5)  # the last batch's transaction
    finally:
        pool.stop()
        store.close()
    story.rows = {k: rows[k] for k in messages}
    story.protocols = protocol_lines(pool.dispatchers)
    return story


def _outcome(row: StatusRow, zone: str) -> str:
    text = row.status.value + (f": {row.reason}" if row.reason else "")
    if row.status is DeliveryStatus.DEFERRED and row.not_before_ms:
        text += f" until {local_time(row.not_before_ms, zone)}"
    if row.provider:
        text += f" via {row.provider} after {row.attempts} attempt(s)"
    if row.dead_letter is not None:
        text += f", dead letter ({row.dead_letter.value})"
    t = row.template
    if t is not None and t.version is not None:
        text += f"  [{t.name} v{t.version} {t.locale}]"
    return text


def run_senders_demo(cfg: Settings, say: Callable[[str], None], timeout_s: float = 60.0) -> Story:
    work = Path(tempfile.mkdtemp(prefix="notify-senders-demo-"))
    world = start_world(work)
    try:
        cfg = demo_senders(cfg, work, world)
        story = run_story(cfg, world, say, timeout_s)
        say("")
        say("What became of each channel message (the status store):")
        for key, row in sorted(story.rows.items(), key=lambda kv: (story.messages[kv[0]][0], kv[1].channel)):
            nid, user, channel = story.messages[key]
            say(f"  {nid:<4} {user:<8} {channel:<5} {_outcome(row, story.zone)}")
        letters = [
            codec.decode("dead_letter", m.value)
            for m in kafka_io.read_committed(cfg.kafka.client_config(), [cfg.senders.dlq_topic], idle_timeout_s=1.0)
            if m.value is not None
        ]
        say("")
        say("The protocol each channel used (the providers its dispatcher was built with):")
        for line in story.protocols:
            say(line)
        say(
            f"Dead letters in {cfg.senders.dlq_topic}:"
            f" {[(story.messages[d['message_key']][0], d['reason_kind']) for d in letters]}"
        )
        say("u-amina's campaign waits in the delay topics and is checked again at 08:00 her time.")
        return story
    finally:
        world.stop()
        shutil.rmtree(work, ignore_errors=True)
