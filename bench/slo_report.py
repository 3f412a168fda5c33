"""The arithmetic of ``python -m bench.slo`` (pure: no Kafka, no processes) and its table.

A request the API accepted (202) is expected on each of its channels; the job's message key for
it is ``<dedup_key>:<channel>:<event_time>`` (README), so a provider stub's arrival (counted by
message key) or a status record (by message key) is matched to its request by the dedup key the
API answered with and the channel. Times are the machine's wall clock: the generator's due times
(epoch s) and the stubs' arrivals (epoch s).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.senders_report import delivery_window, latency_summary, nearest_rank

OK_STATUSES = (200, 202)
#: final statuses of the senders that are an outcome other than a delivery
DEAD = ("failed",)
RULED = ("skipped", "rejected")


#: what the API saw of a phase (its /metrics, ms; bench.api_scrape's names), recorded by bench.slo
#: and tabled here: accept, Kafka ack, reservation, loop lag, the store, the collector
API_HISTOGRAMS = ("accept_202", "kafka_ack", "reservation", "loop_lag", "store_queue", "store_call", "lock_wait",
                  "gc_pause")


def split_message_key(message_key: str) -> tuple[str, str]:
    """``<dedup_key>:<channel>:<event_time>`` -> (dedup_key, channel); a dedup key may hold ``:``."""
    dedup_key, channel, _ = message_key.rsplit(":", 2)
    return dedup_key, channel


def by_request(per_key: Mapping[str, Any]) -> dict[tuple[str, str], Any]:
    """{message key: value} -> {(dedup_key, channel): value}, the first of a pair kept."""
    out: dict[tuple[str, str], Any] = {}
    for key, value in per_key.items():
        try:
            pair = split_message_key(key)
        except ValueError:
            continue
        out.setdefault(pair, value)
    return out


def accept_summary(records: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """The caller's view of a phase's requests (records of ``bench.slo_load``): latency
    p50/p99/max (ms, nearest rank), statuses, errors (not 200/202) and their share, and how late
    the generator wrote them (p50/p99: the part of the latency spent before the request left it)
    and, of that, how late it queued them for its connections (its own delay, not a busy
    connection's)."""
    latencies = sorted(float(r[4]) for r in records)
    late = sorted(float(r[7]) for r in records if len(r) > 7)
    queued = sorted(float(r[8]) for r in records if len(r) > 8)
    statuses: dict[str, int] = {}
    for r in records:
        statuses[str(r[5])] = statuses.get(str(r[5]), 0) + 1
    errors = sum(n for s, n in statuses.items() if int(s) not in OK_STATUSES)
    return {"requests": len(records), "statuses": dict(sorted(statuses.items())), "errors": errors,
            "error_rate": errors / len(records) if records else None,
            "p50_ms": nearest_rank(latencies, 50), "p99_ms": nearest_rank(latencies, 99),
            "max_ms": latencies[-1] if latencies else None,
            "sent_late_p50_ms": nearest_rank(late, 50), "sent_late_p99_ms": nearest_rank(late, 99),
            "queued_late_p99_ms": nearest_rank(queued, 99)}


@dataclass(frozen=True)
class Expected:
    """One channel message a 202 promised: its request's kind and when that request was due."""

    kind: str
    due_s: float


def expected_messages(records: Iterable[Sequence[Any]], channels_of: Mapping[str, Sequence[str]]
                      ) -> dict[tuple[str, str], Expected]:
    """(dedup_key, channel) -> Expected for every request answered 202 (a 200 repeats one)."""
    out: dict[tuple[str, str], Expected] = {}
    for _stream, kind, _key, due, _ms, status, dedup_key, *_late in records:
        if status == 202 and dedup_key:
            for channel in channels_of[kind]:
                out[(dedup_key, channel)] = Expected(kind, float(due))
    return out


@dataclass
class Outcomes:
    """What became of one kind's expected messages."""

    expected: int = 0
    delivered: int = 0
    dead_lettered: int = 0
    skipped_by_rule: int = 0
    lost: int = 0
    lost_sample: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"expected": self.expected, "delivered": self.delivered, "dead_lettered": self.dead_lettered,
                "skipped_by_rule": self.skipped_by_rule, "lost": self.lost, "lost_sample": self.lost_sample,
                "api_to_provider_ms": latency_summary(sorted(self.latencies_ms), self.lost)}


def account(expected: Mapping[tuple[str, str], Expected], arrivals: Mapping[tuple[str, str], float],
            final_status: Mapping[tuple[str, str], str], sample: int = 5) -> dict[str, Outcomes]:
    """Per kind: each expected message delivered (it reached its stub: latency = arrival - due),
    else dead-lettered or skipped by a rule (its last status), else lost (never delivered and no
    such outcome: queued, sending, deferred or nothing at all). A lost message counts as slower
    than every delivered one in the latency summary."""
    out: dict[str, Outcomes] = {}
    for pair, exp in sorted(expected.items(), key=lambda kv: kv[1].due_s):
        o = out.setdefault(exp.kind, Outcomes())
        o.expected += 1
        arrived = arrivals.get(pair)
        status = final_status.get(pair)
        if arrived is not None:
            o.delivered += 1
            o.latencies_ms.append((arrived - exp.due_s) * 1000)
        elif status in DEAD:
            o.dead_lettered += 1
        elif status in RULED:
            o.skipped_by_rule += 1
        else:
            o.lost += 1
            if len(o.lost_sample) < sample:
                o.lost_sample.append(f"{pair[0]} on {pair[1]}: {status or 'no status'}")
    return out


#: the marks on a message's way after its request was due, in order, with what each leg up to it is
LEGS = (
    ("visible", "API call -> visible to a read_committed reader (the API, the job, its checkpoint)"),
    ("ruled", "-> a sender ruled on it (its poll, its claim round's profile read: the `sending` status' time)"),
    ("stub", "-> at the provider stub (the claim's transaction, the call)"),
)


def legs(expected: Mapping[tuple[str, str], Expected], kind: str,
         marks: Mapping[str, Mapping[tuple[str, str], float]],
         completions_ms: Sequence[float] = ()) -> dict[str, Any]:
    """Where the time of ``kind``'s expected messages went: for each message with every mark of
    ``LEGS`` (``marks``: mark -> {(dedup_key, channel): epoch s}), each leg's length from the
    mark before it (the first from when its request was due); p50/p99/max per leg over those
    messages, and each leg's median over the slowest of them (a whole way at or above the p99),
    which says which leg a slow message lost its time in. ``unmarked``: messages missing a mark.

    ``completions_ms`` (the job's checkpoints' completions, epoch ms, sorted): of the first leg,
    the part after the last checkpoint completed before the message was visible
    (``after_checkpoint``): the transaction's commit, which the job makes once told its checkpoint
    completed, and the brokers' replication of its markers."""
    ways: list[list[float]] = []
    unmarked = 0
    for pair, exp in expected.items():
        if exp.kind != kind:
            continue
        times = [marks.get(name, {}).get(pair) for name, _ in LEGS]
        if any(t is None for t in times):
            unmarked += 1
            continue
        points = [exp.due_s, *(t for t in times if t is not None)]
        way = [(b - a) * 1000 for a, b in zip(points, points[1:], strict=False)]
        completed = bisect.bisect_right(completions_ms, points[1] * 1000)
        way.append(points[1] * 1000 - completions_ms[completed - 1] if completed else math.nan)
        ways.append(way)
    totals = [sum(w[: len(LEGS)]) for w in ways]
    p99 = nearest_rank(sorted(totals), 99)
    slowest = [w for w, total in zip(ways, totals, strict=True) if p99 is not None and total >= p99]
    out: dict[str, Any] = {"messages": len(ways), "unmarked": unmarked, "slowest": len(slowest), "legs_ms": {}}
    for i, name in enumerate([*(name for name, _ in LEGS), "after_checkpoint"]):
        every = sorted(w[i] for w in ways if not math.isnan(w[i]))
        out["legs_ms"][name] = {
            **{k: v for k, v in latency_summary(every).items() if k in ("p50", "p99", "max")},
            "slowest_p50": latency_summary(sorted(w[i] for w in slowest if not math.isnan(w[i])))["p50"],
        }
    return out


def repeated_calls(repeats: Iterable[Sequence[Any]], wanted: Iterable[tuple[str, str]]) -> int:
    """Provider calls (a stub's ``repeats``: (message key, time)) for a key already called, among
    the messages ``wanted``."""
    keys = set(wanted)
    n = 0
    for message_key, _t in repeats:
        try:
            if split_message_key(message_key) in keys:
                n += 1
        except ValueError:
            continue
    return n


def campaign_rate(arrivals: Iterable[float]) -> dict[str, Any]:
    """Campaign messages delivered per second at the stub (first to last, and 10%..90%)."""
    w = delivery_window(arrivals)
    return {k: w[k] for k in ("delivered", "window_s", "rate", "rate_10_90")}


# -- the table ------------------------------------------------------------------------------------


def _ms(v: Any) -> str:
    return "n/a" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def _probe(machine: Mapping[str, Any]) -> str:
    """The machine's speed before and after the run (``bench.measure.speed_probe``), if taken."""
    if "speed_probe_ms" not in machine:
        return ""
    return (f" speed probe {machine['speed_probe_ms']:.0f} ms before the services,"
            f" {machine.get('speed_probe_ms_at_end', math.nan):.0f} after (lower is faster);")


def _load(p: Mapping[str, Any]) -> str:
    a, b = p["load_average"]
    return f"{a:.1f} -> {b:.1f}"


def _idle(config: Mapping[str, Any]) -> str:
    if not config.get("cpu_idle"):
        return ""
    reliefs = config.get("idle_guard_reliefs", {})
    return f" in a CPU-idle cgroup (its guard relieved it {sum(reliefs.values())} times)"


def markdown(result: Mapping[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"# bench.slo {result['mode']}{' ' + result['label'] if result['label'] else ''}, {result['date']}",
        "",
        f"commit {result['git']['commit'][:12]} ({result['git']['dirty_paths']} changed paths), {m['nproc']} CPUs,"
        f" brokers {result['config']['brokers']}, checkpoint interval {result['config']['checkpoint_interval_ms']} ms,"
        f" provider stubs {result['config']['stub_latency_ms']} ms, {result['config']['users']:,} campaign users,"
        f" job and senders at nice {result['config'].get('nice', 0)}"
        f"{_idle(result['config'])},"
        f" API at nice {result['config'].get('api_nice', 0)},"
        f" load generator at nice {result['config'].get('generator_nice', 0)};"
        f"{_probe(m)}"
        f" `{result['command']}`",
        "",
        "## Accept latency (open loop, timed from when each request was due)",
        "",
        "| phase | rate/s | requests | p50 ms | p99 ms | max ms | errors | error rate | target | load avg |"
        " written late p50 / p99 ms | of it queued late p99 ms |",
        "|---|--:|--:|--:|--:|--:|--:|--:|---|---|--:|--:|",
    ]
    for p in result["phases"]:
        a = p["accept"]
        rate = "+".join(f"{r:g}" for r in p["rates"].values())
        target = p.get("accept_target_p99_ms")
        met = a["p99_ms"] is not None and target is not None and a["p99_ms"] < target and not a["errors"]
        verdict = "n/a" if target is None else f"p99 < {target:g}: {'met' if met else 'missed'}"
        lines.append(f"| {p['name']} | {rate} | {a['requests']:,} | {_ms(a['p50_ms'])} | {_ms(a['p99_ms'])} |"
                     f" {_ms(a['max_ms'])} | {a['errors']:,} | {(a['error_rate'] or 0):.4%} | {verdict} | {_load(p)} |"
                     f" {_ms(a.get('sent_late_p50_ms'))} / {_ms(a.get('sent_late_p99_ms'))} |"
                     f" {_ms(a.get('queued_late_p99_ms'))} |")
    lines += ["", "## API call -> provider stub, and what became of every accepted request", "",
              "| phase | kind | accepted | delivered | p50 ms | p99 ms | max ms | dead-lettered | skipped by rule |"
              " lost | target |",
              "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for p in result["phases"]:
        for kind, o in p["outcomes"].items():
            lat = o["api_to_provider_ms"]
            target = p.get("delivery_targets_p99_ms", {}).get(kind)
            verdict = "" if target is None else (
                f"p99 <= {target / 1000:g} s: {'met' if lat['p99'] is not None and lat['p99'] <= target else 'missed'}")
            lines.append(f"| {p['name']} | {kind} | {o['expected']:,} | {o['delivered']:,} | {_ms(lat['p50'])} |"
                         f" {_ms(lat['p99'])} | {_ms(lat['max'])} | {o['dead_lettered']:,} |"
                         f" {o['skipped_by_rule']:,} | **{o['lost']:,}** | {verdict} |")
    lines += ["", "| phase | campaign delivered | campaign msg/s (10-90%) | flood held | repeated provider keys |"
              " settle | notes |", "|---|--:|--:|---|--:|---|---|"]
    for p in result["phases"]:
        c = p.get("campaign")
        if c:
            rate = "n/a" if c["rate"] is None else f"{c['rate']:.0f} ({(c['rate_10_90'] or 0):.0f})"
            held = "yes" if c["flood_held"] else "no"
            done = f"{c['delivered']:,} of {c['users']:,}"
        else:
            rate, held, done = "-", "-", "-"
        lines.append(f"| {p['name']} | {done} | {rate} | {held} | **{p['repeated_provider_keys']}** |"
                     f" {p['settle_s']:.0f} s{'' if p['settled'] else ' (bound)'} | {'; '.join(p['notes']) or ''} |")
    for p in result["phases"]:
        loss = p.get("broker_loss")
        if loss:
            role = {True: "the active controller", False: "not the controller"}.get(loss.get("was_controller"), "")
            lines += ["", f"{p['name']}: node {loss['node']}{f' ({role})' if role else ''} SIGKILLed"
                      f" {loss['killed_at_s']:g} s in; fenced after {loss['fenced_after_s']:g} s, back in every ISR"
                      f" after {loss['back_in_sync_after_s']:g} s."]
    if any(p.get("code_legs", {}).get("messages") for p in result["phases"]):
        lines += ["", "Where the one-time codes' time went, leg by leg (ms; p50 / p99 / max of each leg, and its"
                  " median over the slowest 1% of the codes' whole ways); the legs: "
                  + "; ".join(what for _, what in LEGS) + ". Of the first, the part after the last of the job's"
                  " checkpoints completed (its last acknowledgement) before the code was visible: the commit of"
                  " its transaction.", "",
                  "| phase | codes | visible | of it after its checkpoint | ruled | stub | slowest: visible (after"
                  " its checkpoint) / ruled / stub |", "|---|--:|--:|--:|--:|--:|--:|"]
        for p in result["phases"]:
            c = p.get("code_legs")
            if c and c["messages"]:
                g = c["legs_ms"]
                after = g.get("after_checkpoint", {"p50": None, "p99": None, "max": None, "slowest_p50": None})
                each = [g["visible"], after, g["ruled"], g["stub"]]
                unmarked = f" ({c['unmarked']} unmarked)" if c["unmarked"] else ""
                lines.append(f"| {p['name']} | {c['messages']:,}{unmarked} | "
                             + " | ".join(" / ".join(_ms(leg[k]) for k in ("p50", "p99", "max")) for leg in each)
                             + f" | {c['slowest']}: {_ms(g['visible']['slowest_p50'])}"
                             f" ({_ms(after['slowest_p50'])}) / {_ms(g['ruled']['slowest_p50'])}"
                             f" / {_ms(g['stub']['slowest_p50'])} |")
    names = API_HISTOGRAMS
    lines += ["", "What the API's /metrics saw over the phase's load (ms, p50 / p99 from the histograms' buckets):",
              "", "| phase | " + " | ".join(names) + " |", "|---|" + "--:|" * len(names)]
    for p in result["phases"]:
        h = p.get("api_metrics", {})
        lines.append(f"| {p['name']} | " + " | ".join(
            f"{_ms(h[n].get('p50'))} / {_ms(h[n].get('p99'))}" if n in h else "n/a" for n in names) + " |")
    if any(p.get("senders_store_locks") for p in result["phases"]):
        kinds = ("priority_wait", "priority_held", "normal_wait", "normal_held")
        lines += ["", "The senders' write transactions on the status store from the phase's first request until"
                  " its messages were delivered (their /metrics; SQLite's write lock: each transaction's wait"
                  " for it and how long it then held it, by lane; count, and ms p50 / p99):", "",
                  "| phase | " + " | ".join(k.replace("_", " ") for k in kinds) + " |", "|---|" + "--:|" * len(kinds)]
        for p in result["phases"]:
            locks = p.get("senders_store_locks")
            if locks:
                lines.append(f"| {p['name']} | " + " | ".join(
                    f"{locks[k]['count']:,.0f}: {_ms(locks[k]['p50'])} / {_ms(locks[k]['p99'])}" for k in kinds) + " |")
    if any("broker_gc_pauses_ms" in p for p in result["phases"]):
        lines += ["", "The brokers' JVM collection pauses while the phase's load ran (their gc.log; ms):", "",
                  "| phase | pauses | p90 | max | sum |", "|---|--:|--:|--:|--:|"]
        for p in result["phases"]:
            g = p.get("broker_gc_pauses_ms")
            if g is not None:
                lines.append(f"| {p['name']} | {g['count']} | {_ms(g['p90'])} | {_ms(g['max'])} | {_ms(g['sum'])} |")
    if any(p.get("checkpoints") for p in result["phases"]):
        lines += ["", "The job's checkpoints triggered from the phase's first request until its messages were"
                  " delivered (Flink's REST API; the duration is trigger to last acknowledgement, what a"
                  " read_committed reader waits for on top of the interval; ms):", "",
                  "| phase | completed | failed | between completions p50 / max | duration p50 / p99 / max |",
                  "|---|--:|--:|--:|--:|"]
        for p in result["phases"]:
            c = p.get("checkpoints")
            if c:
                gaps = f"{_ms(c['between_completions_ms_p50'])} / {_ms(c['between_completions_ms_max'])}"
                took = " / ".join(_ms(c[k]) for k in ("duration_ms_p50", "duration_ms_p99", "duration_ms_max"))
                lines.append(f"| {p['name']} | {c['completed']} | {c['failed']} | {gaps} | {took} |")
    if any((p.get("checkpoints") or {}).get("phases_ms") for p in result["phases"]):
        lines += ["", "Of those checkpoints, each task's slowest subtask (Flink's per-subtask figures; ms): from"
                  " the trigger to its barrier (start delay); its synchronous part, where the task processes"
                  " nothing (the Kafka sink's flush and its next transaction's start are there); its"
                  " asynchronous part; its alignment:", "",
                  "| phase | task | checkpoints | start delay p50 / p99 | sync p50 / p99 / max | async p50 / p99 |"
                  " alignment p99 |", "|---|---|--:|--:|--:|--:|--:|"]
        for p in result["phases"]:
            for task, f in ((p.get("checkpoints") or {}).get("phases_ms") or {}).items():
                delay = f"{_ms(f['start_delay']['p50'])} / {_ms(f['start_delay']['p99'])}"
                sync = " / ".join(_ms(f["sync"][k]) for k in ("p50", "p99", "max"))
                lines.append(f"| {p['name']} | {task_label(task)} | {f['checkpoints']} | {delay} | {sync} |"
                             f" {_ms(f['async']['p50'])} / {_ms(f['async']['p99'])} | {_ms(f['alignment']['p99'])} |")
    groups = list(result["phases"][0]["cpu_cores"]) if result["phases"] else []
    jvms = list(result["phases"][0].get("jit_cores", {})) if result["phases"] else []
    lines += ["", "CPU of each service from the phase's first request until its messages were delivered"
              f" (cores; the machine has {m['nproc']}), and of it the JVMs' JIT compilers':", "",
              "| phase | " + " | ".join(groups) + "".join(f" | {g} JIT" for g in jvms) + " |",
              "|---|" + "--:|" * (len(groups) + len(jvms))]
    for p in [*result.get("warm_up", []), *result["phases"]]:
        cores, jit = p["cpu_cores"], p.get("jit_cores", {})
        name = p.get("name") or f"warm-up {p['round']}"
        lines.append(f"| {name} | " + " | ".join(_cores(cores.get(g)) for g in groups)
                     + "".join(f" | {_cores(jit.get(g), 3)}" for g in jvms) + " |")
    return "\n".join(lines) + "\n"


def task_label(name: str) -> str:
    """A Flink task's name (its chained operators, ``a -> b -> c``) short enough for a table."""
    ops = name.split(" -> ")
    label = ops[0] if len(ops) == 1 else f"{ops[0]} -> ... -> {ops[-1]}"
    return label if len(label) <= 70 else label[:67] + "..."


def _cores(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"
