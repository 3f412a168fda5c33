"""The ``dedupctl status`` screen: a compact table of a StatusReport (docs/operations.md)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime

from ops.status import StatusReport

NONE = "-"


def fmt_time(ms: int | None) -> str:
    if ms is None:
        return NONE
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def fmt_duration(ms: float | None) -> str:
    """850ms, 12.3s, 4m05s, 2h14m, 3d04h; negative durations keep their sign."""
    if ms is None:
        return NONE
    sign, ms = ("-" if ms < 0 else ""), abs(ms)
    if ms < 1_000:
        return f"{sign}{ms:.0f}ms"
    s = ms / 1000
    if s < 60:
        return f"{sign}{s:.1f}s"
    m, s = divmod(int(s), 60)
    if m < 60:
        return f"{sign}{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{sign}{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{sign}{d}d{h:02d}h"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return NONE
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_pct(x: float | None, digits: int = 1) -> str:
    return NONE if x is None else f"{100 * x:.{digits}f}%"


def short_topic_names(names: list[str]) -> dict[str, str]:
    """Topic -> name without the prefix all of them share (``notifications.``)."""
    prefix = os.path.commonprefix(names) if len(names) > 1 else ""
    prefix = prefix[: prefix.rfind(".") + 1]
    return {n: n[len(prefix):] or n for n in names}


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs]
        lines.append("  ".join(cells).rstrip())
    return lines


def render(r: StatusReport) -> str:
    lines = [
        f"{r.job_name}  {r.state}  up {fmt_duration(r.uptime_ms)}  restarts "
        f"{NONE if r.restarts is None else r.restarts}  job {r.job_id}  {r.rest}",
        "",
    ]
    rows = [
        (
            f"{o.operator}" + (f" x{o.parallelism}" if o.parallelism > 1 else ""),
            "end of input" if o.end_of_input else fmt_time(o.watermark),
            fmt_duration(o.lag_event_ms),
            fmt_duration(o.lag_wall_ms),
            NONE if o.backpressured_ms_per_s is None else f"{o.backpressured_ms_per_s:.0f} ms/s",
        )
        for o in r.operators
    ]
    lines += _table(("operator", "watermark", "behind newest event", "behind now", "back-pressured"), rows)
    lines.append("")
    c = r.checkpoint
    if c is None:
        lines.append("checkpoint  none reported")
    elif c.last_id is None:
        lines.append(f"checkpoint  none completed yet; {c.failed} failed, {c.in_progress} in progress")
    else:
        lines.append(
            f"checkpoint  #{c.last_id} {fmt_duration(c.age_ms)} ago, {fmt_bytes(c.size_bytes)} written"
            f" (full {fmt_bytes(c.full_size_bytes)}), took {fmt_duration(c.duration_ms)};"
            f" {c.completed:,} completed, {c.failed:,} failed"
        )
    if c is not None and c.last_failure_at and (c.completed_at is None or c.last_failure_at > c.completed_at):
        reason = c.last_failure or "no reason given"
        lines.append(f"            last failure {fmt_time(c.last_failure_at)}: {reason}")
    st = r.state_size
    rocks = NONE if st.rocksdb_estimated_keys is None else f"{st.rocksdb_estimated_keys:,}"
    lines.append(
        f"state       {st.keys_held:,} keys held (RocksDB estimate {rocks}); live data"
        f" {fmt_bytes(st.rocksdb_live_data_bytes)}, SST files {fmt_bytes(st.rocksdb_sst_bytes)}"
    )
    if r.rates_per_s is None:
        lines.append("rates       - (no second reading of the counters yet)")
    else:
        rates = "  ".join(f"{n} {v:.1f}/s" for n, v in r.rates_per_s.items())
        lines.append(f"rates       {rates}  (over {r.rate_window_s or 0:.1f} s)")
    t = r.totals
    lines.append(
        f"totals      accepted {t['accepted']:,}  duplicates {t['duplicates']:,}  late {t['late']:,}"
        f"  invalid {t['invalid']:,}  evicted {t['evicted']:,}"
    )
    b = r.bloom
    lines.append(
        f"bloom       skip rate {fmt_pct(b.skip_rate)}, false positives {fmt_pct(b.fp_rate, 2)}"
        f" (configured {fmt_pct(b.fp_rate_configured, 2)}), fill"
        f" {NONE if st.bloom_fill_ratio_pct is None else f'{st.bloom_fill_ratio_pct:.0f}%'}"
    )
    if r.emitted:
        short = short_topic_names(list(r.emitted))
        lines.append("emitted     " + "  ".join(f"{short[t]} {n:,}" for t, n in r.emitted.items()))
    return "\n".join(lines)
