"""The delivery benchmark: ``python -m bench.senders [--full]`` (``make bench``; bench/README.md).

It starts what it needs: a local broker, a local PostgreSQL (for the PostgreSQL runs), an HTTP
provider stub (push, SMS) and an SMTP stub (email), each in a process of its own, and for every
run ``dedupctl senders run`` processes configured only through a settings file (and
``DEDUP_SENDERS_INSTANCE_ID``). A run: a fresh store (a SQLite file, or a new PostgreSQL
database) and fresh topics; N profiles imported with ``dedupctl users import``; N campaign
messages written to the channel topic in committed transactions; the senders started; the stub
counts until it has seen every message key, or the run's time bound passes. Then the priority
lane: a campaign flood of emails queued, and one-time codes written to the SMS priority topic at
~20/s while it drains. Results: ``bench/results/senders-<date>[-quick].json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bench import senders_report as report
from bench.measure import ServiceExited, git_info, machine_info, poll_until
from bench.push_protocols import PUSH_PROTOCOLS, push_settings, write_push_keys
from bench.senders_env import Environment
from bench.senders_load import (
    TransactionalWriter,
    campaign_messages,
    code_message,
    read_statuses,
    write_profiles,
)
from bench.stubs.process import raise_fd_limit
from bench.systems import Proc
from harness.ports import free_port
from harness.settings_file import write_settings
from operators.contract import Topics
from operators.records import Channel, Priority
from ops import kafka_io
from senders.runtime.pool import ensure_topics
from settings import REPO_ROOT, Settings

logger = logging.getLogger("bench.senders")

STORES = ("sqlite", "postgresql", "postgresql-x2")
CODE_TARGET_MS = 1000.0
TARGET_CAMPAIGN = 100_000  # the issue's: a code within 1 s beside 100,000 queued campaign emails


@dataclass(frozen=True)
class Plan:
    """What to run. :param users: messages (and users) per throughput run
    :param bound_s: a throughput run stops this long after its senders start, delivered or not
    :param campaign: emails queued for the priority-lane phase; ``codes`` codes at ``code_rate``/s
    :param isolation_bound_s: the priority-lane phase's bound
    :param overrides: ``[senders]`` settings given with ``--set``
    :param push_protocol: how push is sent to the stub: ``json`` (this project's contract over
        HTTP/1.1), ``fcm`` or ``apns`` (their adapters, HTTP/2; bench/push_protocols.py)"""

    mode: str
    channels: tuple[str, ...]
    stores: tuple[str, ...]
    latencies: tuple[int, ...]
    users: int
    bound_s: float
    isolation_stores: tuple[str, ...]
    isolation_latency_ms: int
    campaign: int
    codes: int
    code_rate: float
    isolation_bound_s: float
    partitions: int = 4
    overrides: dict[str, str] = field(default_factory=dict)
    label: str = ""
    push_protocol: str = "json"


QUICK = Plan("quick", ("push", "sms", "email"), STORES, (0, 50, 200), users=6000, bound_s=60,
             isolation_stores=("sqlite",), isolation_latency_ms=200, campaign=20_000, codes=120, code_rate=20,
             isolation_bound_s=120)
FULL = Plan("full", ("push", "sms", "email"), STORES, (0, 50, 200), users=30_000, bound_s=300,
            isolation_stores=("sqlite", "postgresql"), isolation_latency_ms=200, campaign=100_000, codes=300,
            code_rate=20, isolation_bound_s=600)


def _store_kind(store: str) -> tuple[str, int]:
    return ("postgresql", 2) if store == "postgresql-x2" else (store, 1)


@dataclass
class RunSpace:
    """One run's own topics, store, settings file and logs."""

    name: str
    dir: Path
    cfg: Settings
    config: Path
    database: str | None


class Bench:
    def __init__(self, env: Environment, plan: Plan) -> None:
        self.env = env
        self.plan = plan
        self.uid = uuid.uuid4().hex[:6]
        self.count = 0
        self.imports: list[dict[str, Any]] = []
        self.failures: list[str] = []
        assert env.http is not None
        self.stub_origin = f"http://127.0.0.1:{env.http.port}"
        keyed = plan.push_protocol != "json"
        self.push_keys = write_push_keys(env.work / "push-keys", self.stub_origin) if keyed else {}

    # -- a run's space ------------------------------------------------------------------------

    def space(self, kind: str, store: str, channels: Sequence[Channel]) -> RunSpace:
        self.count += 1
        name = f"r{self.count:02d}-{kind}"
        run_dir = self.env.work / name
        run_dir.mkdir(parents=True)
        prefix = f"bs{self.uid}.{self.count:02d}."
        topics = Topics().with_prefix(prefix)
        database = None
        if _store_kind(store)[0] == "postgresql":
            database = f"bench_{self.uid}_{self.count:02d}"
            location = self.env.database(database)
        else:
            location = str(run_dir / "status.sqlite3")
        http = self.env.http
        smtp = self.env.smtp
        assert http is not None and smtp is not None
        senders: dict[str, Any] = {
            "group_prefix": f"bench-{self.uid}-{self.count:02d}",
            "status_store": location,
            "status_topic": f"{prefix}notifications.status",
            "dlq_topic": f"{prefix}notifications.dlq",
            **push_settings(self.plan.push_protocol, self.stub_origin, self.push_keys),
            "sms_primary": f"http://127.0.0.1:{http.port}/sms",
            "email_primary": "smtp",
            "smtp_host": "127.0.0.1",
            "smtp_port": smtp.port,
            "push_rate_per_sec": 1e6, "sms_rate_per_sec": 1e6, "email_rate_per_sec": 1e6, "rate_burst": 100_000,
            "contact_encryption_keys": self.env.keys[0],
            "contact_lookup_keys": self.env.keys[1],
            "metrics_log_interval_s": 0,
            **self.plan.overrides,
        }
        cfg = Settings(topics=topics, data_dir=str(run_dir)).with_overrides(
            kafka={"bootstrap_servers": self.env.bootstrap, "partitions": self.plan.partitions}, senders=senders)
        kafka_io.create_topics({"bootstrap.servers": self.env.bootstrap},
                               [topics.channel_topic(c, p) for c in channels for p in (Priority.NORMAL, Priority.HIGH)],
                               self.plan.partitions)
        ensure_topics(cfg, channels)
        return RunSpace(name, run_dir, cfg, write_settings(cfg, run_dir / "senders.toml"), database)

    def import_profiles(self, space: RunSpace, campaign_users: int, code_users: int, store: str) -> None:
        path = write_profiles(space.dir / "profiles.jsonl", campaign_users, code_users)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "dedupctl.cli", "--config", str(space.config), "users", "import", str(path),
             "--progress-seconds", "0", "--progress-every", "0"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=3600,
        )
        seconds = time.monotonic() - started
        want = campaign_users + code_users
        if done.returncode != 0 or f"imported {want} profile(s)" not in done.stdout:
            raise RuntimeError(f"users import failed ({done.returncode}): {done.stdout[-500:]} {done.stderr[-1500:]}")
        self.imports.append({"store": store, "profiles": want, "seconds": round(seconds, 2),
                             "profiles_per_s": round(want / seconds, 1), "run": space.name})

    # -- the senders ----------------------------------------------------------------------------

    @contextmanager
    def senders(self, space: RunSpace, channels: Sequence[Channel], processes: int) -> Iterator[list[SenderProc]]:
        """The run's sender processes, stopped at the end: SIGTERM (they finish their batch), after
        ``SenderProc.grace_s`` SIGKILL (a run cut by its bound need not wait for a slow batch)."""
        procs = [SenderProc(space, channels, i, f"bench{self.uid}{self.count:02d}p{i}") for i in range(processes)]
        group = f"senders-{space.name}"
        try:
            for p in procs:
                self.env.sampler.watch(group, p.proc.pid)
            yield procs
        finally:
            for p in procs:
                p.proc.popen.terminate()
            for p in procs:
                p.proc.terminate(grace_s=p.grace_s)
            self.env.sampler.unwatch(group)

    def _check_alive(self, space: RunSpace, procs: Sequence[SenderProc]) -> None:
        for p in procs:
            if not p.proc.alive():
                self.failures.append(f"{space.name}: a senders process exited ({p.proc.popen.returncode}), see"
                                     f" {p.proc.log}: {p.proc.tail(3)}")

    # -- a throughput run -----------------------------------------------------------------------

    def throughput(self, channel: Channel, store: str, latency_ms: int) -> dict[str, Any]:
        kind, processes = _store_kind(store)
        n = self.plan.users
        space = self.space(f"{channel.value}-{store}-{latency_ms}ms", store, [channel])
        stub = self.env.stub(channel)
        self.import_profiles(space, n, 0, kind)
        messages = campaign_messages(space.name, channel, n, int(time.time() * 1000))
        expected = {m["message_key"] for m in messages}
        writer = TransactionalWriter(self.env.bootstrap, space.name)
        writer.write(space.cfg.topics.channel_topic(channel, Priority.NORMAL), messages)
        writer.close()
        stub.reset()
        stub.set_latency(latency_ms)
        xact0 = self.env.xact_commit(space.database) if space.database else None
        notes: list[str] = []
        with self.senders(space, [channel], processes) as procs:
            started = time.monotonic()
            complete = _wait_for(lambda: stub.count(channel.value) >= n, started + self.plan.bound_s, procs, notes,
                                 lambda: f"{space.name}: {stub.count(channel.value):,} of {n:,} at the stub")
            counter = _settle_and_count(procs, stub.count(channel.value))
            for p in procs:
                p.grace_s = 30.0 if complete else 5.0
            self._check_alive(space, procs)
        dump = stub.dump(channel.value) or {"arrivals": {}, "repeats": [], "in_flight_series": []}
        connections = stub.summary()
        xact1 = self.env.xact_commit(space.database) if space.database else None
        statuses = read_statuses(self.env.bootstrap, space.cfg.senders.status_topic, len(dump["arrivals"]))
        result = self._figures(space, channel, kind, processes, latency_ms, n, complete, dump, statuses, expected,
                               counter, None if xact0 is None or xact1 is None else xact1 - xact0, notes)
        result["protocol"] = self.plan.push_protocol if channel is Channel.PUSH else None
        # the stub's connections since its reset: at the peak, and those that spoke HTTP/2
        result["connections"] = {k: connections.get(k) for k in ("peak_connections", "h2_connections")}
        if space.database:
            self.env.drop_database(space.database)
        return result

    def _figures(self, space: RunSpace, channel: Channel, store: str, processes: int, latency_ms: int, n: int,
                 complete: bool, dump: dict[str, Any], statuses: Any, expected: set[str], counter: float | None,
                 xact: int | None, notes: list[str]) -> dict[str, Any]:
        arrivals: dict[str, float] = dump["arrivals"]
        window = report.delivery_window(arrivals.values())
        delivered = window["delivered"]
        lat = report.latency_summary(report.latency_ms(statuses.claimed_ms, arrivals))
        cpu = self._cpu(f"senders-{space.name}", window, delivered, channel)
        unexpected = len(set(arrivals) - expected)
        repeated = len(dump["repeats"])
        if repeated or unexpected:
            self.failures.append(f"{space.name}: {repeated} repeated keys, {unexpected} unexpected keys")
        if not complete:
            notes.append(f"bound: {delivered:,} of {n:,} delivered within {self.plan.bound_s:g} s of the start")
        sent = statuses.counts().get("sent", 0)
        if sent != delivered:
            notes.append(f"{sent:,} sent status records read for {delivered:,} messages delivered")
        if window["window_s"] is not None and window["window_s"] < 2:
            notes.append(f"delivery window {window['window_s']:.2f} s: the CPU figure is rough")
        return {
            "run": space.name, "channel": channel.value, "store": store, "processes": processes,
            "latency_ms": latency_ms, "messages": n, "delivered": delivered, "complete": complete,
            "rate": window["rate"], "rate_10_90": window["rate_10_90"], "window_s": window["window_s"],
            "claim_to_provider_ms": lat, "peak_in_flight": dump.get("peak_in_flight", 0),
            "peak_calls_per_s": dump.get("peak_calls_per_s", 0),
            "store_tx_per_message": {"pg_xact_commit": report.per_message(xact, delivered),
                                     "counter": report.per_message(counter, delivered),
                                     "pg_xact_commit_total": xact, "counter_total": counter},
            "cpu_us_per_message": cpu, "repeated_key_calls": repeated, "unexpected_keys": unexpected,
            "statuses": statuses.counts(), "status_records": statuses.records, "notes": notes,
        }

    def _cpu(self, group: str, window: dict[str, Any], delivered: int, channel: Channel) -> dict[str, Any]:
        out: dict[str, Any] = {"senders": None, "stub": None, "broker": None, "postgres": None}
        if window["window_s"] is None or delivered < 2:
            return out
        t0 = report.to_monotonic(window["first"], self.env.offset_s)
        t1 = report.to_monotonic(window["last"], self.env.offset_s)
        stub_group = "stub-smtp" if channel is Channel.EMAIL else "stub-http"
        for name, g in (("senders", group), ("stub", stub_group), ("broker", "broker"), ("postgres", "postgres")):
            cpu = self.env.sampler.cpu_in(g, t0, t1)
            out[name] = None if cpu is None else round(cpu / (delivered - 1) * 1e6, 1)
        return out

    # -- the priority lane under a campaign flood --------------------------------------------------

    def isolation(self, store: str) -> dict[str, Any]:
        kind, processes = _store_kind(store)
        plan = self.plan
        latency_ms = plan.isolation_latency_ms
        space = self.space(f"priority-{store}-{latency_ms}ms", store, [Channel.EMAIL, Channel.SMS])
        self.import_profiles(space, plan.campaign, plan.codes, kind)
        now_ms = int(time.time() * 1000)
        campaign = campaign_messages(space.name, Channel.EMAIL, plan.campaign, now_ms)
        writer = TransactionalWriter(self.env.bootstrap, space.name)
        writer.write(space.cfg.topics.channel_topic(Channel.EMAIL, Priority.NORMAL), campaign)
        codes_topic = space.cfg.topics.channel_topic(Channel.SMS, Priority.HIGH)
        for stub in self.env.stubs():
            stub.reset()
            stub.set_latency(latency_ms)
        assert self.env.http is not None and self.env.smtp is not None
        http, smtp = self.env.http, self.env.smtp
        written: dict[str, int] = {}
        notes: list[str] = []
        with self.senders(space, [Channel.EMAIL, Channel.SMS], processes) as procs:
            deadline = time.monotonic() + plan.isolation_bound_s
            # the campaign at full tilt first: deliveries for 2 s (or a tenth of it, if sooner)
            _wait_for(lambda: smtp.count("email") > 0, deadline, procs, notes)
            warm = time.monotonic() + 2.0
            _wait_for(lambda: smtp.count("email") >= plan.campaign // 10, warm, procs, [])
            started = time.monotonic()
            for i in range(plan.codes):
                pause = started + i / plan.code_rate - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                message = code_message(space.name, i, int(time.time() * 1000))
                written[message["message_key"]] = writer.write_one(codes_topic, message)
            _wait_for(lambda: http.count("sms") >= plan.codes, deadline, procs, notes,
                      lambda: f"{space.name}: {http.count('sms'):,} of {plan.codes:,} codes and"
                              f" {smtp.count('email'):,} of {plan.campaign:,} campaign emails at the stubs")
            self._check_alive(space, procs)
        writer.close()
        sms = http.dump("sms") or {"arrivals": {}, "repeats": []}
        email = smtp.dump("email") or {"arrivals": {}, "repeats": [], "in_flight_series": [], "peak_in_flight": 0}
        if space.database:
            self.env.drop_database(space.database)
        return self._isolation_figures(space, kind, processes, latency_ms, written, sms, email, notes)

    def _isolation_figures(self, space: RunSpace, store: str, processes: int, latency_ms: int,
                           written: dict[str, int], sms: dict[str, Any], email: dict[str, Any],
                           notes: list[str]) -> dict[str, Any]:
        plan = self.plan
        arrivals: dict[str, float] = sms["arrivals"]
        values = report.latency_ms(written, arrivals)
        missing = len(set(written) - set(arrivals))
        lat = report.latency_summary(values, missing)
        first_code = min(written.values()) / 1000 if written else 0.0
        last_code = max((arrivals[k] for k in written if k in arrivals), default=0.0)
        campaign_times = sorted(email["arrivals"].values())
        during = [t for t in campaign_times if first_code <= t <= last_code]
        span = last_code - first_code if last_code > first_code else None
        flood_held = bool(campaign_times) and span is not None and campaign_times[-1] >= last_code
        series = [(t, n) for t, n in email.get("in_flight_series", [])]
        mean = report.mean_in_flight(series, first_code, last_code) if span else None
        peak = max((n for t, n in series if first_code <= t <= last_code), default=0)
        repeated = len(sms["repeats"]) + len(email["repeats"])
        if repeated:
            self.failures.append(f"{space.name}: {repeated} repeated keys")
        if plan.campaign < TARGET_CAMPAIGN:
            notes.append(f"a campaign of {plan.campaign:,} emails, not the target's {TARGET_CAMPAIGN:,}"
                         f" ({plan.mode} mode; --full or --campaign for more)")
        if not flood_held:
            notes.append("the campaign was not delivering any more when the last code arrived: the codes did not"
                         " compete with a flood for all of the phase")
        return {
            "run": space.name, "store": store, "processes": processes, "latency_ms": latency_ms,
            "campaign": plan.campaign, "codes": plan.codes, "code_rate": plan.code_rate,
            "code_latency_ms": lat, "target_p99_ms": CODE_TARGET_MS,
            "target_met": lat["p99"] is not None and lat["p99"] < CODE_TARGET_MS,
            "campaign_delivered": len(campaign_times),
            "campaign_rate_during_codes": (len(during) / span) if span else None,
            "campaign_in_flight_mean": None if mean is None else round(mean, 1),
            "campaign_peak_in_flight": peak, "flood_held": flood_held, "repeated_key_calls": repeated,
            "notes": notes,
        }


class SenderProc:
    """One ``dedupctl senders run`` process of a run, its metrics on a port of its own."""

    def __init__(self, space: RunSpace, channels: Sequence[Channel], index: int, instance_id: str) -> None:
        self.metrics_port = free_port()
        self.grace_s = 5.0
        selection = [a for c in channels for a in ("--channel", c.value)]
        env = {**os.environ, "DEDUP_SENDERS_INSTANCE_ID": instance_id, "PYTHONUNBUFFERED": "1"}
        self.proc = Proc(f"senders-{index}", [sys.executable, "-m", "dedupctl.cli", "--config", str(space.config),
                                              "senders", "run", *selection, "--metrics-port", str(self.metrics_port)],
                         space.dir / f"senders-{index}.log", env=env)

    def metrics(self) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as reply:
                return str(reply.read().decode("utf-8"))
        except OSError:
            return None


def _wait_for(done: Callable[[], bool], deadline: float, procs: Sequence[SenderProc], notes: list[str],
              progress: Callable[[], str] | None = None) -> bool:
    """``poll_until`` on the sender processes: True when ``done()`` holds; False at the deadline
    or when one exits (said in ``notes``); ``progress()`` (where the phase is) as lines of their own."""
    def exited() -> str | None:
        for p in procs:
            if not p.proc.alive():
                return f"a senders process exited ({p.proc.popen.returncode}): {p.proc.tail(5)}"
        return None

    def say(waited_s: float) -> None:
        assert progress is not None
        print(f"  ... {progress()} after {waited_s:.0f} s", flush=True)

    try:
        return poll_until(done, deadline, exited=exited, progress=say if progress is not None else None)
    except ServiceExited as exc:
        notes.append(str(exc))
        return False


def _settle_and_count(procs: Sequence[SenderProc], delivered: int) -> float | None:
    """Wait (10 s at most) until the processes count the delivered messages as sent, then read
    ``sender_store_transactions_total`` of all of them (None when a process has no such counter)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        texts = [p.metrics() or "" for p in procs]
        sent = sum(report.prometheus_sum(t, "sender_deliveries_total", outcome="sent") or 0 for t in texts)
        if sent >= delivered:
            break
        time.sleep(0.2)
    time.sleep(0.5)  # the last batch's outcome and publication
    totals = [report.prometheus_sum(p.metrics() or "", "sender_store_transactions_total") for p in procs]
    return None if any(t is None for t in totals) else float(sum(t for t in totals if t is not None))


# -- the command ----------------------------------------------------------------------------------


def run(plan: Plan, bootstrap: str | None, postgres: str | None, out_dir: Path, keep: bool) -> int:
    work = Path(tempfile.mkdtemp(prefix="bench-senders-"))
    started = dt.datetime.now(dt.UTC)
    machine, git = machine_info(), git_info(REPO_ROOT)  # as the run starts: the load, the code it ran
    needs_pg = any(_store_kind(s)[0] == "postgresql" for s in (*plan.stores, *plan.isolation_stores))
    env = Environment(work, bootstrap, postgres, needs_pg)
    bench = Bench(env, plan)
    runs: list[dict[str, Any]] = []
    phases: list[dict[str, Any]] = []
    try:
        for channel in plan.channels:
            for store in plan.stores:
                for latency in plan.latencies:
                    result = bench.throughput(Channel(channel), store, latency)
                    runs.append(result)
                    print(report.run_line(result), flush=True)
        for store in plan.isolation_stores:
            phase = bench.isolation(store)
            phases.append(phase)
            print(report.isolation_line(phase), flush=True)
    finally:
        env.close()
        if not keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    result = {
        "date": started.isoformat(timespec="seconds"), "mode": plan.mode, "label": plan.label,
        "command": " ".join(["python", "-m", "bench.senders", *sys.argv[1:]]),
        "machine": {**machine, "loadavg_at_end": os.getloadavg()}, "git": git,
        "plan": asdict(plan), "runs": runs, "priority_lane": phases, "imports": bench.imports,
        "failures": bench.failures,
    }
    stem = "senders-" + started.date().isoformat() + (f"-{plan.label}" if plan.label else "") + (
        "-quick" if plan.mode == "quick" else "")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    table = report.markdown(result)
    (out_dir / f"{stem}.md").write_text(table, encoding="utf-8")
    print(table)
    print(f"-> {out_dir / stem}.json, .md")
    for failure in bench.failures:
        print(f"FAILED: {failure}")
    return 1 if bench.failures else 0


def _plan(args: argparse.Namespace) -> Plan:
    plan = FULL if args.full else QUICK
    changes: dict[str, Any] = {}
    if args.channels:
        changes["channels"] = tuple(Channel(c).value for c in args.channels.split(","))
    if args.stores is not None:
        stores = tuple(s for s in args.stores.split(",") if s)
        unknown = sorted(set(stores) - set(STORES))
        if unknown:
            raise SystemExit(f"unknown store(s) {unknown}: choose from {', '.join(STORES)}")
        changes["stores"] = stores
    if args.isolation_stores is not None:
        changes["isolation_stores"] = tuple(s for s in args.isolation_stores.split(",") if s)
    if args.push_protocol is not None:
        if args.push_protocol not in PUSH_PROTOCOLS:
            raise SystemExit(f"unknown push protocol {args.push_protocol!r}: choose from {', '.join(PUSH_PROTOCOLS)}")
        changes["push_protocol"] = args.push_protocol
    if args.latencies:
        changes["latencies"] = tuple(int(v) for v in args.latencies.split(","))
    for name in ("users", "bound_s", "campaign", "codes", "code_rate", "isolation_bound_s", "partitions",
                 "isolation_latency_ms", "label"):
        value = getattr(args, name)
        if value is not None:
            changes[name] = value
    overrides = {}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set wants FIELD=VALUE, not {item!r}")
        overrides[key.removeprefix("senders.")] = value
    changes["overrides"] = overrides
    return replace(plan, **changes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.senders", description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="more messages per run, both stores for the priority lane")
    parser.add_argument("--channels", help="comma-separated (default push,sms,email)")
    parser.add_argument("--stores", help=f"comma-separated of {', '.join(STORES)} (default all; empty: none)")
    parser.add_argument("--push-protocol", help="how push reaches the stub: json (default), fcm or apns (HTTP/2)")
    parser.add_argument("--latencies", help="provider latencies in ms, comma-separated (default 0,50,200)")
    parser.add_argument("--users", type=int, help="messages per throughput run (quick 6000, full 30000)")
    parser.add_argument("--bound-s", type=float, help="a throughput run's time bound (quick 60, full 300)")
    parser.add_argument("--isolation-stores", help="stores of the priority-lane phase (quick sqlite; empty: skip)")
    parser.add_argument("--isolation-latency-ms", type=int, help="its provider latency (200)")
    parser.add_argument("--campaign", type=int, help="campaign emails queued then (quick 20000, full 100000)")
    parser.add_argument("--codes", type=int, help="one-time codes written then (quick 120, full 300)")
    parser.add_argument("--code-rate", type=float, help="codes per second (20)")
    parser.add_argument("--isolation-bound-s", type=float, help="the phase's time bound (quick 120, full 600)")
    parser.add_argument("--partitions", type=int, help="partitions of every topic (4)")
    parser.add_argument("--set", action="append", metavar="FIELD=VALUE",
                        help="a [senders] setting for the sender processes (repeatable), e.g. max_in_flight=400")
    parser.add_argument("--label", help="named into the result files (senders-<date>-<label>[-quick].json)")
    parser.add_argument("--bootstrap", help="use this running broker instead of starting one")
    parser.add_argument("--postgres", help="use this PostgreSQL server (a DSN that may create databases)")
    parser.add_argument("--out", default=str(REPO_ROOT / "bench" / "results"), help="where the results go")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, stores)")
    args = parser.parse_args(argv)
    raise_fd_limit()  # the sender processes inherit it: a call in flight is a connection
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(_plan(args), args.bootstrap, args.postgres, Path(args.out), args.keep)


if __name__ == "__main__":
    sys.exit(main())
