"""Hypothesis strategies and builders shared by the tests of the dedup rule."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from operators.records import Channel, NotificationRequest, Priority
from operators.window import DAY_MS, NO_WATERMARK, LatePolicy, WindowConfig

SIDE = LatePolicy.SIDE_OUTPUT
BEST = LatePolicy.BEST_EFFORT


def req(
    nid: str,
    t: int,
    *,
    key: str | None = "k",
    ttl: int | None = None,
    user: str = "u",
    channels: tuple[Channel, ...] = (Channel.PUSH,),
    priority: Priority = Priority.NORMAL,
    params: dict[str, str] | None = None,
) -> NotificationRequest:
    return NotificationRequest(
        notification_id=nid,
        user_id=user,
        template_id="tmpl",
        channels=channels,
        event_time=t,
        params=params or {},
        priority=priority,
        dedup_key=key,
        dedup_ttl_sec=ttl,
    )


# -- strategies ---------------------------------------------------------------------------------

TTLS = st.sampled_from([None, None, 0, -1, -1_000, 1, 2, 5, 10, 30, 10**6, 10**12])
# explicit keys, an empty key (falls back to the derived one) and derived keys of two users
KEYS = st.sampled_from([("k1", "u"), ("k2", "u"), ("k3", "u"), ("", "u"), (None, "u"), (None, "v")])


@st.composite
def configs(draw: st.DrawFn, policy: LatePolicy | None = None) -> WindowConfig:
    return WindowConfig(
        default_window_ms=draw(st.sampled_from([1_000, 5_000, 20_000, 7 * DAY_MS])),
        max_window_ms=draw(st.sampled_from([1_000, 3_000, 10_000, 30 * DAY_MS])),
        allowed_lateness_ms=draw(st.sampled_from([0, 1, 500, 5_000, 60_000])),
        late_policy=policy if policy is not None else draw(st.sampled_from([SIDE, BEST])),
    )


@st.composite
def streams(draw: st.DrawFn, cfg: WindowConfig) -> list[tuple[NotificationRequest, int]]:
    """Requests of a few keys with in-order, out-of-order, boundary and far-apart event
    times, under a watermark that is absent for a while and then rises monotonically."""
    n = draw(st.integers(0, 40))
    first_watermark_at = draw(st.integers(0, n + 1))
    widths = {cfg.default_window_ms, cfg.max_window_ms, 1_000, 2_000, 5_000, 10_000}
    deltas = sorted({d for w in widths for d in (w - 1, w, w + 1)} | {0, 1})
    times: list[int] = []
    watermark = NO_WATERMARK
    out = []
    for i in range(n):
        dedup_key, user = draw(KEYS)
        mode = draw(st.sampled_from(["fresh", "near", "near", "boundary", "far"]))
        if mode == "near" and times:
            t = draw(st.sampled_from(times)) + draw(st.integers(-30_000, 30_000))
        elif mode == "boundary" and times:
            t = draw(st.sampled_from(times)) + draw(st.sampled_from(deltas)) * draw(st.sampled_from([1, -1]))
        elif mode == "far":
            t = draw(st.integers(-(10**12), 10**12))
        else:
            t = draw(st.integers(0, 60_000))
        times.append(t)
        if i >= first_watermark_at:
            if watermark == NO_WATERMARK:
                watermark = draw(st.integers(-10_000, 60_000))
            else:
                watermark += draw(st.sampled_from([0, 1, 999, 1_000]) | st.integers(0, 20_000))
        out.append((req(f"n{i}", t, key=dedup_key, ttl=draw(TTLS), user=user), watermark))
    return out


@st.composite
def cases(draw: st.DrawFn, policy: LatePolicy | None = None) -> tuple[WindowConfig, Any]:
    cfg = draw(configs(policy))
    return cfg, draw(streams(cfg))


