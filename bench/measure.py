"""What the benchmark measures with: output parsers, rates, exactness checks, a process sampler.

The output watcher and the live producer run in processes of their own (bench/watch.py); what
they read and when is turned into figures here. The parsers read only the few fields the checks
need (the notification id and channel), so the watcher stays cheap next to the system it
measures.
"""

from __future__ import annotations

import bisect
import datetime as dt
import json
import logging
import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.api_load import PROGRESS_S
from bench.dataset import Item, lane_of
from operators import codec
from operators.contract import SCHEMAS_DIR

logger = logging.getLogger(__name__)

# -- parsing output records ------------------------------------------------------------------


def _read_str(buf: bytes, pos: int) -> tuple[str, int]:
    n, pos = codec.read_long(buf, pos)
    return buf[pos:pos + n].decode("utf-8"), pos + n


def _schema_fields(stem: str) -> list[dict[str, Any]]:
    return list(json.loads((SCHEMAS_DIR / f"{stem}.avsc").read_text(encoding="utf-8"))["fields"])


_CM = _schema_fields("channel_message")
_DN = _schema_fields("duplicate_notice")
#: the fast paths read the leading fields; when the schemas change order they fall back to fastavro
_CM_FAST = [f["name"] for f in _CM[:3]] == ["message_key", "channel", "notification_id"]
_CHANNELS: list[str] = _CM[1]["type"]["symbols"] if _CM_FAST else []
_DN_FAST = [f["name"] for f in _DN[:3]] == ["notification_id", "dedup_key", "original_notification_id"]


def parse_channel_message(value: bytes, lane: str) -> Item:
    if _CM_FAST:
        _, pos = _read_str(value, 0)
        channel, pos = codec.read_long(value, pos)
        nid, _ = _read_str(value, pos)
        return ("a", nid, _CHANNELS[channel], lane)
    rec = codec.decode("channel_message", value)
    return ("a", rec["notification_id"], rec["channel"], lane)


def parse_duplicate_notice(value: bytes) -> Item:
    if _DN_FAST:
        nid, pos = _read_str(value, 0)
        _, pos = _read_str(value, pos)
        orig, _ = _read_str(value, pos)
        return ("d", nid, orig)
    rec = codec.decode("duplicate_notice", value)
    return ("d", rec["notification_id"], rec["original_notification_id"])


Parser = Callable[[str, bytes | None], Item]


@dataclass(frozen=True)
class AvroParser:
    """Outputs in the job's format: Avro ChannelMessage per lane topic, DuplicateNotice.
    (A class, not a closure: it is sent to the watcher's process.)"""

    channel_lanes: dict[str, str]
    duplicates: str

    def __call__(self, topic: str, value: bytes | None) -> Item:
        if value is None:
            return ("x", topic, "<null value>")
        try:
            if topic in self.channel_lanes:
                return parse_channel_message(value, self.channel_lanes[topic])
            if topic == self.duplicates:
                return parse_duplicate_notice(value)
        except (IndexError, UnicodeDecodeError, ValueError) as exc:
            return ("x", topic, f"unparsable: {exc}")
        return ("x", topic, value[:64].hex())  # late, invalid: nothing is expected there


@dataclass(frozen=True)
class JsonParser:
    """Outputs of the Flink SQL peer: JSON rows, one per accepted request and channel."""

    accepted: str
    duplicates: str

    def __call__(self, topic: str, value: bytes | None) -> Item:
        try:
            rec = json.loads(value or b"null")
            if topic == self.accepted:
                return ("a", rec["notification_id"], rec["channel"], lane_of(rec["priority"]))
            if topic == self.duplicates:
                return ("d", rec["notification_id"], rec["original_notification_id"])
        except (ValueError, KeyError, TypeError) as exc:
            return ("x", topic, f"unparsable: {exc}")
        return ("x", topic, "unexpected topic")


def sustained_rate(batches: list[tuple[float, int]], until_count: int, requests: int,
                   bursty: bool, window: tuple[float, float] = (0.0, 1.0),
                   cluster_s: float = 0.3) -> dict[str, Any]:
    """Requests/s while the backlog was processed, from the times its output became visible.

    ``bursty`` (exactly-once systems): output becomes visible a checkpoint (commit) at a time.
    The first burst holds what was processed before the clock could start, and the last one
    what was processed in a partial interval, made visible up to an interval later; so the rate
    is taken from the end of a burst to the end of a later one, whole intervals only, never from
    before the end of the first or to the end of the last. Otherwise (output visible as it is
    written) it is taken between the times shares of the backlog's output were visible, within
    10% .. 90%. ``window`` (shares of the backlog's output) chooses the part: (0, 1) the whole
    backlog, (0.5, 1) its second half (the bursts from the first that reaches half of the output
    to the second-to-last: the rate once the system is warm), (0, 0.5) its first half.
    ``counted``: (start, end, requests) of the rate, for the CPU over the same time.
    ``first_to_last`` is the plain "outputs after the first visible ones, over the time to the
    last" for reference (biased low by up to two commit intervals). Rates are converted from
    output records to requests with the stream's ratio (``requests / until_count``).
    """
    out: dict[str, Any] = {"rate": None, "first_to_last": None, "span_s": None, "bursts": 0, "intervals": 0}
    upto = _until(batches, until_count)
    if upto is None:
        return out
    batches = upto
    ratio = requests / until_count
    lo, hi = window[0] * until_count, window[1] * until_count
    bursts: list[tuple[float, float, int]] = []  # (start, end, cumulative outputs at the end)
    total = 0
    for t, n in batches:
        total += n
        if bursts and t - bursts[-1][1] <= cluster_s:
            bursts[-1] = (bursts[-1][0], t, total)
        else:
            bursts.append((t, t, total))
    t_first, t_done = batches[0][0], batches[-1][0]
    first_burst = bursts[0][2]
    out.update(span_s=t_done - t_first, bursts=len(bursts), first_burst_outputs=first_burst,
               burst_ends=[(end, cum) for _, end, cum in bursts])
    if t_done - bursts[0][1] >= 0.5:
        out["first_to_last"] = (until_count - first_burst) / (t_done - bursts[0][1]) * ratio
    if bursty:
        last = len(bursts) - 2  # the last burst is a partial interval
        i = next((k for k, b in enumerate(bursts) if b[2] >= lo), len(bursts))
        j = last if window[1] >= 1 else next((k for k, b in enumerate(bursts) if b[2] >= hi), last)
        j = min(j, last)
        if j > i and bursts[j][1] - bursts[i][1] >= 0.5:
            out["rate"] = (bursts[j][2] - bursts[i][2]) / (bursts[j][1] - bursts[i][1]) * ratio
            out["intervals"] = j - i
            out["counted"] = (bursts[i][1], bursts[j][1], (bursts[j][2] - bursts[i][2]) * ratio)
        return out
    lo, hi = max(lo, 0.1 * until_count), min(hi, 0.9 * until_count)
    total, t_lo, t_hi = 0, None, None
    for t, n in batches:
        total += n
        if t_lo is None and total >= lo:
            t_lo, c_lo = t, total
        if total >= hi:
            t_hi, c_hi = t, total
            break
    if t_lo is not None and t_hi is not None and t_hi - t_lo >= 0.2:
        out["rate"] = (c_hi - c_lo) / (t_hi - t_lo) * ratio
        out["counted"] = (t_lo, t_hi, (c_hi - c_lo) * ratio)
    return out


def _until(batches: list[tuple[float, int]], count: int) -> list[tuple[float, int]] | None:
    total = 0
    for i, (_, n) in enumerate(batches):
        total += n
        if total >= count:
            return batches[:i + 1]
    return None


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, int(round(q / 100 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


# -- exactness -------------------------------------------------------------------------------


@dataclass
class Exactness:
    expected: int
    seen: int
    missing: int
    unexpected: int
    twice: int
    examples: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.missing == 0 and self.unexpected == 0

    def as_dict(self) -> dict[str, Any]:
        return {"exact": self.exact, "expected": self.expected, "seen": self.seen, "missing": self.missing,
                "unexpected": self.unexpected, "twice": self.twice, "examples": self.examples}


def compare(expected: Counter[Item], seen: Counter[Item]) -> Exactness:
    """Multiset comparison of output items: every expected item once, nothing else."""
    missing = expected - seen
    extra = seen - expected
    twice = sum(n - 1 for item, n in seen.items() if n > 1 and item in expected)
    examples = [f"missing {item}" for item in list(missing)[:3]]
    examples += [f"unexpected {item}" for item in list(extra)[:3]]
    return Exactness(sum(expected.values()), sum(seen.values()), sum(missing.values()),
                     sum(extra.values()), twice, examples)


#: the ceiling's records (and the latency floor's) begin with their index in the stream, in
#: this many ASCII digits; the rest of each is a request of the dataset, so sizes are the job's
INDEX_DIGITS = 12


def index_record(i: int, filler: bytes) -> bytes:
    """Record ``i`` of a pass-through stream: its index, then ``filler`` (same length)."""
    return b"%012d" % i + filler[INDEX_DIGITS:]


def read_index(value: bytes | None) -> int | None:
    try:
        return int(value[:INDEX_DIGITS]) if value else None
    except ValueError:
        return None


def index_exactness(counts: bytes | bytearray, expected: int, unreadable: int) -> Exactness:
    """Records 0 .. ``expected``-1 of a pass-through stream each exactly once, nothing else.

    ``counts[i]``: how often record i was read (saturating at 255); ``unreadable``: records read
    that carry no index in range."""
    head = counts[:expected]
    missing = head.count(0)
    twice = sum(head) - (expected - missing)
    beyond = sum(counts[expected:])
    examples = [f"missing record {i}" for i in _first(head, lambda c: c == 0)] if missing else []
    if twice:
        examples += [f"record {i} read {head[i]} times" for i in _first(head, lambda c: c > 1)]
    return Exactness(expected, sum(counts) + unreadable, missing, twice + beyond + unreadable, twice, examples)


def _first(values: bytes | bytearray, pred: Callable[[int], bool], n: int = 3) -> list[int]:
    out: list[int] = []
    for i, v in enumerate(values):
        if pred(v):
            out.append(i)
            if len(out) == n:
                break
    return out


# -- processes -------------------------------------------------------------------------------


@dataclass
class _Proc:
    group: str
    pid: int
    name: str
    cmd: str
    cpu: float = 0.0
    rss_peak: int = 0
    rss_last: int = 0


class ProcSampler(threading.Thread):
    """CPU seconds and peak RSS of process trees, sampled every ``interval_s`` (psutil).

    CPU is read between named marks (:meth:`mark`, :meth:`cpu_between`), or between any two
    times from each group's series of samples (:meth:`cpu_in`, interpolated between samples)."""

    def __init__(self, interval_s: float = 0.25) -> None:
        super().__init__(name="proc-sampler", daemon=True)
        try:
            import psutil
        except ImportError:  # the bench extra is not installed: no CPU or memory figures
            psutil = None
        self._psutil = psutil
        self.interval_s = interval_s
        self.roots: dict[str, list[tuple[int, bool]]] = {}
        self.procs: dict[tuple[str, int], _Proc] = {}
        self.marks: dict[tuple[str, str], dict[int, float]] = {}
        #: per group: (monotonic time of a sample, CPU seconds of all its processes so far)
        self.series: dict[str, list[tuple[float, float]]] = {}
        self._lock = threading.Lock()
        self._stop_event = threading.Event()

    def watch(self, group: str, pid: int, recursive: bool = True) -> None:
        with self._lock:
            self.roots.setdefault(group, []).append((pid, recursive))
        self.sample()

    def unwatch(self, group: str) -> None:
        self.sample()
        with self._lock:
            self.roots.pop(group, None)

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)

    def sample(self) -> None:
        ps = self._psutil
        if ps is None:
            return
        with self._lock:
            for group, roots in self.roots.items():
                for root_pid, recursive in roots:
                    try:
                        root = ps.Process(root_pid)
                        tree = [root, *root.children(recursive=True)] if recursive else [root]
                    except ps.Error:
                        continue
                    for p in tree:
                        try:
                            with p.oneshot():
                                cpu = p.cpu_times()
                                rss = p.memory_info().rss
                                key = (group, p.pid)
                                rec = self.procs.get(key)
                                if rec is None:
                                    rec = _Proc(group, p.pid, p.name(), _short_cmd(p.cmdline()))
                                    self.procs[key] = rec
                        except ps.Error:
                            continue
                        if not rec.cmd:
                            try:
                                rec.cmd = _short_cmd(p.cmdline())
                            except ps.Error:
                                pass
                        rec.cpu = max(rec.cpu, cpu.user + cpu.system)
                        rec.rss_last = rss
                        rec.rss_peak = max(rec.rss_peak, rss)
            now = time.monotonic()
            totals: dict[str, float] = dict.fromkeys(self.roots, 0.0)
            for (g, _), r in self.procs.items():
                if g in totals:
                    totals[g] += r.cpu
            for g, total in totals.items():
                self.series.setdefault(g, []).append((now, total))

    def cpu_in(self, group: str, t0: float, t1: float) -> float | None:
        """CPU seconds of ``group`` between two monotonic times (None: not sampled over them)."""
        with self._lock:
            series = list(self.series.get(group, ()))
        if not series or t0 < series[0][0] or t1 > series[-1][0] or t1 < t0:
            return None
        return _at(series, t1) - _at(series, t0)

    def mark(self, group: str, name: str) -> None:
        self.sample()
        with self._lock:
            self.marks[(group, name)] = {pid: r.cpu for (g, pid), r in self.procs.items() if g == group}

    def cpu_between(self, group: str, start: str | None, end: str | None) -> dict[int, float]:
        """CPU seconds per pid of ``group`` between two marks (None: since birth / until now)."""
        with self._lock:
            a = self.marks.get((group, start), {}) if start else {}
            b = self.marks.get((group, end)) if end else None
            out = {}
            for (g, pid), r in self.procs.items():
                if g != group:
                    continue
                until = b.get(pid, r.cpu) if b is not None else r.cpu
                if b is not None and pid not in b:
                    continue  # born after the end mark
                out[pid] = max(0.0, until - a.get(pid, 0.0))
            return out

    def processes(self, group: str) -> list[_Proc]:
        with self._lock:
            return [r for (g, _), r in self.procs.items() if g == group]


def _at(series: list[tuple[float, float]], t: float) -> float:
    """The series' value at ``t``, linear between the samples around it."""
    k = bisect.bisect_left(series, (t, -1.0))
    if k < len(series) and series[k][0] == t or k == 0:
        return series[k][1]
    (ta, a), (tb, b) = series[k - 1], series[min(k, len(series) - 1)]
    return a if tb <= ta else a + (b - a) * (t - ta) / (tb - ta)


def _short_cmd(cmdline: list[str]) -> str:
    if not cmdline:
        return ""
    exe = Path(cmdline[0]).name
    if exe.startswith("java"):
        main = next((a for a in cmdline[1:] if not a.startswith("-") and "." in a and "/" not in a), "")
        return f"java {main}".strip()
    if exe.startswith("python") and "-m" in cmdline:
        i = cmdline.index("-m")
        return f"python -m {' '.join(cmdline[i + 1:i + 2])}"
    return " ".join([exe, *cmdline[1:3]])[:80]


def thread_cpu(pid: int) -> dict[int, float]:
    """OS thread id -> its CPU seconds (user + system, /proc); empty when the process is gone.
    Native threads too (librdkafka's, a JVM's), which py-spy does not see."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return out


def thread_comms(pid: int) -> dict[int, str]:
    """OS thread id -> its name as /proc has it (at most 15 characters)."""
    out: dict[int, str] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out[int(task.name)] = (task / "comm").read_text().strip()
        except OSError:
            continue
    return out


#: HotSpot's JIT compiler threads, as /proc names them (15 characters)
_JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")


_GC_PAUSE = re.compile(r"^\[(?P<at>[^\]]+)\].*\bPause\b.* (?P<ms>[0-9.]+)ms$")


def gc_pauses(text: str, since: float, until: float) -> list[float]:
    """The pauses (ms) a JVM's ``-Xlog:gc:...:time`` log records between two wall-clock times
    (seconds since the epoch): each line ``[<ISO time>][info][gc] GC(n) Pause ... <ms>ms``."""
    out: list[float] = []
    for line in text.splitlines():
        m = _GC_PAUSE.match(line.strip())
        if m is None:
            continue
        try:
            at = dt.datetime.strptime(m["at"], "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
        except ValueError:
            continue
        if since <= at <= until:
            out.append(float(m["ms"]))
    return out


def jit_seconds(pid: int) -> float | None:
    """CPU seconds a JVM's JIT compiler threads have used, from /proc (not ``jstat``, which is a
    JVM of its own and costs a burst of CPU each time); None when the JVM is gone. A compiler
    thread that exited between two readings takes its time with it (HotSpot starts and stops
    extra ones as the queue grows), so a difference may under-count."""
    cpu = thread_cpu(pid)
    if not cpu:
        return None
    names = thread_comms(pid)
    return sum(spent for tid, spent in cpu.items() if names.get(tid, "").startswith(_JIT_THREADS))


def java_pids(root_pid: int) -> list[int]:
    """The JVMs in a process tree (the root included)."""
    try:
        import psutil
    except ImportError:
        return []
    try:
        root = psutil.Process(root_pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    found = []
    for p in tree:
        try:
            if p.name() == "java":
                found.append(p.pid)
        except psutil.Error:
            continue
    return found


class ServiceExited(RuntimeError):
    """A process a benchmark waits on has exited."""


def poll_until(
    done: Callable[[], bool],
    deadline: float,
    *,
    exited: Callable[[], str | None],
    progress: Callable[[float], None] | None = None,
    interval_s: float = 0.2,
) -> bool:
    """Poll ``done()`` until it holds (True) or ``deadline`` (``time.monotonic``) passes (False).
    ``exited()`` names a process that has exited (then ServiceExited is raised with it), or gives
    None; ``progress(seconds waited)`` is called every ``PROGRESS_S``. The benchmarks' one wait."""
    started = said = time.monotonic()
    while not done():
        now = time.monotonic()
        if now >= deadline:
            return False
        gone = exited()
        if gone is not None:
            raise ServiceExited(gone)
        if progress is not None and now - said >= PROGRESS_S:
            said = now
            progress(now - started)
        time.sleep(interval_s)
    return True


# -- the machine -----------------------------------------------------------------------------


#: the speed probe's work: a loop of plain Python, the kind of work the API and the senders do
PROBE_LOOPS = 2_000_000


def speed_probe(rounds: int = 3) -> float:
    """How long a fixed loop of Python takes on one core now (ms, the median of ``rounds``; lower
    is faster). This machine is a share of a host: the same loop on it, idle, has taken from 1.26
    to 1.72 s in one hour (10 million turns, 2026-12-07), so a run's figures are read beside its
    probe, taken before the services start and after they stop."""
    took = []
    for _ in range(rounds):
        started = time.perf_counter()
        total = 0
        for i in range(PROBE_LOOPS):
            total += i * i
        took.append((time.perf_counter() - started) * 1000)
    return round(sorted(took)[len(took) // 2], 1)


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "speed_probe_ms": speed_probe(),
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "loadavg_at_start": os.getloadavg(),
    }
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        m = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
        info["cpu_model"] = m.group(1).strip() if m else None
        meminfo = Path("/proc/meminfo").read_text()
        m = re.search(r"^MemTotal:\s*(\d+) kB", meminfo, re.M)
        info["memory_gib"] = round(int(m.group(1)) / 1024 / 1024, 1) if m else None
    except OSError:
        pass
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        info["java"] = (out.stderr or out.stdout).splitlines()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        info["java"] = None
    return info


def git_info(repo: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    status = git("status", "--porcelain", "--", "jobs", "operators", "connector", "dedupctl", "bench")
    return {"commit": git("rev-parse", "HEAD"), "dirty_paths": len(status.splitlines())}
