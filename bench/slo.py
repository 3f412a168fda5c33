"""The product's service levels end to end: ``python -m bench.slo [--quick|--full] [--broker-kill]``
(``make bench-slo``; issue 22, bench/README.md).

Every service in its own process, as ``dedupctl`` runs them, from one settings file: a local
broker (or three: ``--brokers 3``), the dedup job (``dedupctl run``), ``dedupctl senders run``
(push and SMS, both lanes) with each channel's provider a local stub answering after 200 ms
(bench/stubs/), and the API (``dedupctl api run``); users imported with ``dedupctl users
import``. Then, after a warm-up that goes through the whole pipeline:

1. **accept**: open-loop load (``bench.slo_load``, timed from when each request was due) at each
   ``--accept-rates`` for ``--accept-s``: order updates, one-time codes and repeats of an
   Idempotency-Key; accept p50/p99/max and errors; then the pipeline is left to deliver it all;
2. **flood**: a campaign (``POST /v1/campaigns``, ``eid_sale``, ``--users`` users at
   ``--campaign-rate``) and, once it is delivering, one-time codes at ``--code-rate`` (priority
   high) and order updates at ``--order-rate`` through ``POST /v1/notifications`` for ``--flood-s``;
3. **flood with a broker kill** (``--broker-kill``, three brokers): the same with other users,
   the node leading most of the requests topic's partitions SIGKILLed halfway through and
   started again.

For every request answered 202: API call (when it was due) -> provider stub, per kind; and what
became of it (delivered, dead-lettered, skipped by a rule, or lost: none of those), read from the
stubs and the senders' status topic (read_committed); provider calls with a repeated message key;
the campaign's deliveries per second; the CPU of each service over each phase. Results:
``bench/results/slo-<date>[-<label>].json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from bench import slo_report as report
from bench.checkpoints import CheckpointLog, epoch_ms, job_history, subtask_phases
from bench.checkpoints import summarize as summarize_checkpoints
from bench.lane_watch import LaneWatch
from bench.measure import (
    ProcSampler,
    gc_pauses,
    git_info,
    java_pids,
    jit_seconds,
    machine_info,
    percentile,
    poll_until,
    speed_probe,
)
from bench.slo_load import codes_in
from bench.stubs.process import StubProcess, raise_fd_limit
from bench.systems import Proc
from harness.broker_loss import VICTIMS
from ops.stacks import STACKS_SIGNAL
from settings import REPO_ROOT, Settings

CALLER = "bench"
#: rate -> accept p99 it must stay under (ms), the issue's targets
ACCEPT_TARGETS_MS = {1000.0: 50.0, 2000.0: 100.0}
#: kind -> API call -> provider p99 it must stay within during the flood (ms)
DELIVERY_TARGETS_MS = {"code": 2000.0, "order": 10_000.0}
GROUPS = ("broker", "job", "senders", "api", "store", "stub", "generator")
#: the JVMs, whose JIT compiler's time is reported per phase
JVM_GROUPS = ("broker", "job")
#: a JVM compiling for less than this share of a core over a warm-up round is warm
JIT_SETTLED = 0.05


@dataclass(frozen=True)
class Plan:
    """:param accept_rates: requests/s of the accept phases, ``accept_s`` seconds each
    :param users: the campaign's users (each phase of a flood its own)
    :param campaign_rate: the campaign's rate (requests/s the API writes)
    :param flood_s: how long codes and order updates are sent during a flood
    :param settle_bound_s: how long after a phase its deliveries are waited for at most
    :param checkpoint_ms: ``flink.checkpoint_interval_ms`` (None: the setting's default)
    :param nice: ``flink.nice`` and ``senders.nice``: the job and the senders below the API and
        the broker on the CPU, as one host running them all is deployed (ops/priority.py); 0:
        all at one priority
    :param cpu_idle: ``flink.cpu_idle`` and ``senders.cpu_idle``: the job and the senders in a
        CPU-idle control group (ops/cpu_idle.py; needs root here, else they run on with a
        warning); the result counts the times its guard found the group starved
        (``idle_guard_reliefs``). At 2,000/s the accept p99 was 54.5-84.8 ms with it and 90.8-143
        ms without, interleaved (bench/results/slo-2026-12-0[67]-s41-*)
    :param api_nice: ``api.nice``: the API's processes above the other services (its autogroup's
        share of the CPU; needs root, else the API runs at 0 and its log says so); 0: as they
    :param generator_nice: the load generator's (its own session and autogroup). It stands for
        callers on other hosts, and a request it sends late is timed from when it was due, so its
        own turns on this host's CPU count against the API; but at the API's -5 it took the API's
        turns: at 2,000/s the API's own accept p99 was 107 and 112 ms against 59-76 ms in five runs
        at 0, and the callers' 113 and 126 ms (bench/results/slo-2026-12-06-s3[89]-*gen-nice*)"""

    mode: str
    accept_rates: tuple[float, ...]
    accept_s: float
    users: int
    campaign_rate: float
    flood_s: float
    settle_bound_s: float
    code_rate: float = 20.0
    order_rate: float = 200.0
    #: the warm-up: rounds of ``warmup_s`` at ``warmup_rate``, until the JVMs (broker, job) have
    #: compiled their hot paths (each compiled for under ``JIT_SETTLED`` of a core over the last
    #: round), at most ``warmup_rounds``. A service deployed has long been warm; a phase that
    #: counts the JIT compiler's work counts an artefact of the benchmark's start (after 30 s at
    #: 500/s the broker still spent 27% of its CPU and the job 23% in C2 during the first accept
    #: phase: async-profiler, bench/README.md)
    warmup_s: float = 20.0
    warmup_rate: float = 1000.0
    warmup_rounds: int = 6
    brokers: int = 1
    broker_kill: bool = False
    #: which node the kill takes (harness.broker_loss.VICTIMS): the one leading the most request
    #: partitions (the active controller or not, as it falls), the active controller, or another
    kill_victim: str = "leader"
    checkpoint_ms: int | None = None
    stub_latency_ms: int = 200
    api_processes: int = 1
    nice: int = 10
    cpu_idle: bool = True
    api_nice: int = -5
    generator_nice: int = 0
    connections: int = 64
    store: str = "sqlite"
    partitions: int = 4
    order_channels: tuple[str, ...] = ("push",)
    campaign_channels: tuple[str, ...] = ("push",)
    label: str = ""


QUICK = Plan("quick", (1000.0, 2000.0), 20.0, users=20_000, campaign_rate=2000.0, flood_s=20.0, settle_bound_s=180.0)
FULL = Plan("full", (1000.0, 2000.0), 60.0, users=100_000, campaign_rate=2000.0, flood_s=120.0,
            settle_bound_s=900.0)


@dataclass
class Services:
    cfg: Settings
    config: Path
    url: str
    token: str
    stub: StubProcess
    procs: dict[str, Proc]


class Slo:
    def __init__(self, plan: Plan, work: Path) -> None:
        self.plan = plan
        self.work = work
        self.uid = uuid.uuid4().hex[:6]
        self.sampler = ProcSampler(interval_s=0.25)
        self.sampler.start()
        self.records: dict[str, list[list[Any]]] = {}  # phase -> the generator's records
        self.campaigns: dict[str, tuple[str, int, int, float]] = {}  # phase -> (id, first user, users, created)
        self.code_offset = 0
        self.expected_at_stub: dict[str, int] = {}  # channel -> messages expected so far
        self.imports: dict[str, Any] = {}
        self.procs: dict[str, Proc] = {}  # the services started, stopped at the end whatever happens
        self.cluster: Any = None
        self.checkpoints: CheckpointLog | None = None  # every checkpoint of the job, from its REST API
        self.lane_watch: LaneWatch | None = None  # when each code became visible to a read_committed reader
        self.senders_metrics = ""  # the senders' /metrics

    # -- the services -------------------------------------------------------------------------

    def start(self, cluster: Any, stub: StubProcess, store_location: str) -> Services:
        from api.callers import Caller
        from api.database import open_api_store
        from api.scopes import Scope
        from api.tokens import create_caller
        from harness.chaos import wait_running
        from harness.ports import free_port
        from harness.settings_file import write_settings
        from operators.records import Category, Channel, Priority
        from ops import kafka_io
        from ops.flink_rest import RestClient
        from senders.profiles.crypto import generate_key
        from senders.runtime.pool import ensure_topics

        plan = self.plan
        origin = f"http://127.0.0.1:{stub.port}"
        flink: dict[str, Any] = {"checkpoint_dir": str(self.work / "checkpoints"), "rest_port": free_port(),
                                 "transactional_id_prefix": f"slo{self.uid}", "nice": plan.nice,
                                 "cpu_idle": plan.cpu_idle}
        if plan.checkpoint_ms is not None:
            flink["checkpoint_interval_ms"] = plan.checkpoint_ms
        cfg = Settings(data_dir=str(self.work)).with_overrides(
            kafka={"bootstrap_servers": cluster.bootstrap, "partitions": plan.partitions},
            flink=flink,
            senders={"status_store": store_location, "push_primary": f"{origin}/push",
                     "sms_primary": f"{origin}/sms", "push_rate_per_sec": 1e6, "sms_rate_per_sec": 1e6,
                     "rate_burst": 100_000, "contact_encryption_keys": generate_key(),
                     "contact_lookup_keys": generate_key(), "metrics_log_interval_s": 0, "nice": plan.nice,
                     "cpu_idle": plan.cpu_idle},
            api={"port": free_port(), "default_rate_per_sec": 1e6, "processes": plan.api_processes,
                 "nice": plan.api_nice},
        )
        kafka_io.ensure_topics(cfg.kafka, cfg.topics.all(), plan.partitions)
        ensure_topics(cfg, [Channel.PUSH, Channel.SMS])
        self.lane_watch = LaneWatch({"bootstrap.servers": cluster.bootstrap},
                                    [cfg.topics.channel_topic(Channel.SMS, Priority.HIGH)])
        self.lane_watch.start()
        config = write_settings(cfg, self.work / "slo.toml")
        db = open_api_store(cfg)
        token = create_caller(db, Caller(CALLER, frozenset({Scope.SEND, Scope.CAMPAIGNS, Scope.STATUS_READ}),
                                         frozenset({Category.TRANSACTIONAL, Category.MARKETING})),
                              int(time.time() * 1000))
        db.close()
        self._import_users(config)
        self.cluster = cluster
        procs = self.procs
        say("starting the job (dedupctl run), the senders (dedupctl senders run), the API (dedupctl api run)")
        procs["job"] = self._proc("job", config, ["run", "--fresh"])
        senders_port = free_port()
        self.senders_metrics = f"http://127.0.0.1:{senders_port}"
        procs["senders"] = self._proc("senders", config, ["senders", "run", "--channel", "push", "--channel", "sms",
                                                         "--metrics-port", str(senders_port)],
                                      {"DEDUP_SENDERS_INSTANCE_ID": f"slo{self.uid}"})
        procs["api"] = self._proc("api", config, ["api", "run"])
        url = f"http://127.0.0.1:{cfg.api.port}"
        from bench.api import _wait_ready

        _wait_ready(url, procs["api"].popen, procs["api"].log, timeout_s=180)
        rest = RestClient(f"http://127.0.0.1:{cfg.flink.rest_port}")
        job_id = wait_running(rest, timeout_s=300)
        # the REST API keeps the last 10 checkpoints (5 s at the default interval): every second;
        # each completed one's phases per task: a call per task (the job has 2), once a checkpoint
        self.checkpoints = CheckpointLog(partial(job_history, rest, job_id), interval_s=1.0,
                                         details=partial(subtask_phases, rest, job_id, rest.vertex_ids(job_id)))
        self.checkpoints.start()
        for node in cluster.nodes:
            pid = node.pid()
            if pid:
                self.sampler.watch("broker", pid)
        self.sampler.watch("stub", stub.pid)
        return Services(cfg, config, url, token, stub, procs)

    def _proc(self, name: str, config: Path, args: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, [sys.executable, "-m", "dedupctl.cli", "--config", str(config), *args],
                    self.work / f"{name}.log", env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.sampler.watch(name, proc.pid)
        return proc

    def _import_users(self, config: Path) -> None:
        from bench.senders_load import write_profiles

        plan = self.plan
        campaign_users = plan.users * (2 if plan.broker_kill else 1)
        codes = codes_in("mix", int(plan.warmup_s * plan.warmup_rate)) * plan.warmup_rounds
        codes += sum(codes_in("mix", int(r * plan.accept_s)) for r in plan.accept_rates)
        codes += codes_in("code", int(plan.code_rate * plan.flood_s)) * (2 if plan.broker_kill else 1)
        path = write_profiles(self.work / "profiles.jsonl", campaign_users, codes)
        say(f"importing {campaign_users + codes:,} users (dedupctl users import)")
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "dedupctl.cli", "--config", str(config), "users", "import",
                               str(path), "--progress-seconds", "0", "--progress-every", "0"],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=7200)
        if done.returncode != 0:
            raise RuntimeError(f"users import failed ({done.returncode}): {done.stderr[-1500:]}")
        seconds = time.monotonic() - started
        self.imports = {"profiles": campaign_users + codes, "seconds": round(seconds, 1),
                        "profiles_per_s": round((campaign_users + codes) / seconds, 1)}

    # -- load ---------------------------------------------------------------------------------

    def generate(self, s: Services, phase: str, streams: Sequence[tuple[str, float]], seconds: float) -> None:
        """The generator, in a process of its own, for ``seconds``; its records kept by phase."""
        out = self.work / f"load-{phase}.jsonl"
        stream_args = [a for kind, rate in streams for a in ("--stream", f"{kind}:{rate:g}")]
        gen = subprocess.Popen(
            [sys.executable, "-m", "bench.slo_load", s.url, str(out), "--run", f"{self.uid}-{phase}", *stream_args,
             "--seconds", str(seconds), "--users", str(self.plan.users), "--code-offset", str(self.code_offset),
             "--order-channels", ",".join(self.plan.order_channels), "--connections", str(self.plan.connections),
             "--nice", str(self.plan.generator_nice)],
            cwd=REPO_ROOT, env={**os.environ, "BENCH_API_TOKEN": s.token}, start_new_session=True,
        )
        self.sampler.watch("generator", gen.pid)
        try:
            code = gen.wait(timeout=seconds * 3 + 120)
        finally:
            if gen.poll() is None:
                gen.kill()
                gen.wait()
        if code != 0:
            raise RuntimeError(f"the load generator of {phase} failed with exit {code}")
        self.code_offset += sum(codes_in(kind, int(rate * seconds)) for kind, rate in streams)
        records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines() if line]
        self.records[phase] = records
        for kind, channels in self.channels_of().items():
            n = sum(1 for r in records if r[1] == kind and r[5] == 202)
            for c in channels:
                self.expected_at_stub[c] = self.expected_at_stub.get(c, 0) + n

    def channels_of(self) -> dict[str, tuple[str, ...]]:
        return {"order": self.plan.order_channels, "code": ("sms",), "repeat": (),
                "campaign": self.plan.campaign_channels}

    def settle(self, s: Services, phase: str, bound_s: float) -> tuple[bool, float]:
        """Until every channel's stub has seen the messages expected so far, or the bound."""
        started = time.monotonic()

        def done() -> bool:
            return all(s.stub.count(c) >= n for c, n in self.expected_at_stub.items())

        def where() -> str:
            return ", ".join(f"{c} {s.stub.count(c):,} of {n:,}" for c, n in self.expected_at_stub.items())

        ok = wait_for(done, started + bound_s, s.procs, lambda: f"{phase}: delivering ({where()} at the stub)")
        return ok, time.monotonic() - started

    def campaign(self, s: Services, phase: str, first_user: int) -> None:
        plan = self.plan
        users = [f"u-{first_user + i}" for i in range(plan.users)]
        body = json.dumps({"template": "eid_sale", "segment": users, "params": {"pct": "20"},
                           "channels": list(plan.campaign_channels), "rate": plan.campaign_rate}).encode()
        req = urllib.request.Request(f"{s.url}/v1/campaigns", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {s.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as reply:
            campaign_id = str(json.loads(reply.read())["campaign_id"])
        self.campaigns[phase] = (campaign_id, first_user, plan.users, time.time())
        for c in plan.campaign_channels:
            self.expected_at_stub[c] = self.expected_at_stub.get(c, 0) + plan.users
        say(f"{phase}: campaign {campaign_id} of {plan.users:,} users at {plan.campaign_rate:g}/s created")

    def campaign_written(self, s: Services, phase: str) -> str:
        campaign_id = self.campaigns[phase][0]
        req = urllib.request.Request(f"{s.url}/v1/campaigns/{campaign_id}",
                                     headers={"Authorization": f"Bearer {s.token}"})
        try:
            with urllib.request.urlopen(req, timeout=5) as reply:
                c = json.loads(reply.read())
            return f"campaign {c['state']} {c['written']:,} of {c['total']:,} written"
        except OSError as exc:
            return f"campaign: {exc}"

    # -- the phases ---------------------------------------------------------------------------

    def phase(self, s: Services, name: str, run: Callable[[], None], bound_s: float) -> dict[str, Any]:
        from bench import api_scrape

        load0, t0, wall0 = os.getloadavg()[0], time.monotonic(), time.time()
        jit0 = self.jit()
        before = api_scrape.scrape(s.url)
        senders_before = api_scrape.scrape(self.senders_metrics)
        run()
        load1, t1, wall1 = os.getloadavg()[0], time.monotonic(), time.time()
        metrics = api_scrape.phase_report(before, api_scrape.scrape(s.url))
        settled, settle_s = self.settle(s, name, bound_s)
        store_locks = api_scrape.store_locks(senders_before, api_scrape.scrape(self.senders_metrics))
        t2, jit1 = time.monotonic(), self.jit()
        jit_cores: dict[str, float | None] = {}
        for g in JVM_GROUPS:
            a, b = jit0[g], jit1[g]
            jit_cores[g] = None if a is None or b is None else round(max(0.0, b - a) / (t2 - t0), 3)
        return {"name": name, "load_average": [round(load0, 2), round(load1, 2)],
                "api_metrics": {k: metrics[k] for k in report.API_HISTOGRAMS},
                "api_gc_by_generation": metrics["gc_pauses_by_generation"],
                "senders_store_locks": store_locks,
                "broker_gc_pauses_ms": self.broker_gc(wall0, wall1),
                "cpu_cores": self.cores(t0, t2), "jit_cores": jit_cores, "seconds": round(t1 - t0, 1),
                "checkpoints": summarize_checkpoints(self.checkpoints, epoch_ms(t0), epoch_ms(t2)),
                "settled": settled, "settle_s": round(settle_s, 1), "notes": []}

    def broker_gc(self, since: float, until: float) -> dict[str, float | int | None]:
        """The brokers' collection pauses while the phase's load ran (their gc.log): how many, the
        90th percentile, the longest, the sum (ms)."""
        pauses: list[float] = []
        for node in self.cluster.nodes if self.cluster else ():
            for log in sorted(node.gc_log.parent.glob(node.gc_log.name + "*")):  # the current one and rotated
                pauses += gc_pauses(log.read_text(encoding="utf-8", errors="replace"), since, until)
        ranked = sorted(pauses)
        return {"count": len(ranked), "p90": percentile(ranked, 90), "max": ranked[-1] if ranked else None,
                "sum": round(sum(ranked), 1)}

    def jit(self) -> dict[str, float | None]:
        """The JIT compilers' seconds so far, per JVM group (summed over its JVMs; a broker
        started again starts from 0, so a phase with a broker kill under-counts)."""
        pids = {"broker": [p for n in (self.cluster.nodes if self.cluster else ()) if (p := n.pid())],
                "job": java_pids(self.procs["job"].pid) if "job" in self.procs else []}
        out: dict[str, float | None] = {}
        for group in JVM_GROUPS:
            seconds = [jit_seconds(p) for p in pids[group]]
            out[group] = None if not seconds or None in seconds else sum(x for x in seconds if x is not None)
        return out

    def warm_up(self, s: Services) -> list[dict[str, Any]]:
        """Rounds of load through to the providers until the JVMs are warm (or the last round)."""
        plan = self.plan
        rounds: list[dict[str, Any]] = []
        for n in range(1, plan.warmup_rounds + 1):
            say(f"warm-up {n}: {plan.warmup_rate:g} requests/s for {plan.warmup_s:g} s, through to the providers"
                " (not measured)")
            name = f"warm-up-{n}"

            def load(name: str = name) -> None:
                self.generate(s, name, [("mix", plan.warmup_rate)], plan.warmup_s)

            p = self.phase(s, name, load, 300.0)
            rounds.append({"round": n, "jit_cores": p["jit_cores"], "cpu_cores": p["cpu_cores"],
                           "settle_s": p["settle_s"]})
            jit = ", ".join(f"{g} {v if v is not None else 'n/a'}" for g, v in p["jit_cores"].items())
            say(f"warm-up {n}: delivered {p['settle_s']:.0f} s after its last request; JIT cores: {jit}")
            if all(v is not None and v < JIT_SETTLED for v in p["jit_cores"].values()):
                break
        return rounds

    def cores(self, t0: float, t1: float) -> dict[str, float | None]:
        """Each service's CPU over the span, in cores (CPU seconds per second)."""
        out: dict[str, float | None] = {}
        for g in GROUPS:
            cpu = self.sampler.cpu_in(g, t0, min(t1, time.monotonic() - 0.5))
            out[g] = None if cpu is None else round(cpu / (t1 - t0), 2)
        return out

    def accept_phase(self, s: Services, rate: float) -> dict[str, Any]:
        name = f"accept-{rate:g}"
        say(f"{name}: {rate:g} requests/s for {self.plan.accept_s:g} s (load average {os.getloadavg()[0]:.1f})")
        p = self.phase(s, name, lambda: self.generate(s, name, [("mix", rate)], self.plan.accept_s),
                       self.plan.settle_bound_s)
        p["rates"] = {"mix": rate}
        p["accept_target_p99_ms"] = ACCEPT_TARGETS_MS.get(rate)
        return p

    def flood_phase(self, s: Services, name: str, first_user: int, cluster: Any | None) -> dict[str, Any]:
        plan = self.plan
        loss: dict[str, Any] = {}

        def run() -> None:
            push_before = {c: s.stub.count(c) for c in plan.campaign_channels}
            self.campaign(s, name, first_user)
            # the campaign delivering first: 2 s after its first message reached the stub
            wait_for(lambda: any(s.stub.count(c) > push_before[c] for c in plan.campaign_channels),
                     time.monotonic() + plan.settle_bound_s, s.procs,
                     lambda: f"{name}: waiting for the campaign's first delivery ({self.campaign_written(s, name)})")
            time.sleep(2.0)
            say(f"{name}: codes at {plan.code_rate:g}/s and order updates at {plan.order_rate:g}/s for"
                f" {plan.flood_s:g} s beside the campaign ({self.campaign_written(s, name)})")
            killer = None
            if cluster is not None:
                from bench.api import _lose_a_broker

                killer = threading.Thread(target=_lose_a_broker, daemon=True,
                                          args=(cluster, s.cfg.topics.requests, plan.flood_s / 2, loss,
                                                plan.kill_victim))
                killer.start()
            self.generate(s, name, [("code", plan.code_rate), ("order", plan.order_rate)], plan.flood_s)
            if killer is not None:
                killer.join(300)

        p = self.phase(s, name, run, plan.settle_bound_s)
        p["rates"] = {"code": plan.code_rate, "order": plan.order_rate}
        p["delivery_targets_p99_ms"] = DELIVERY_TARGETS_MS
        if cluster is not None:
            p["broker_loss"] = loss
        return p


def say(text: str) -> None:
    sys.stdout.write(f"[{time.strftime('%H:%M:%S')}] {text}\n")
    sys.stdout.flush()


def wait_for(done: Callable[[], bool], deadline: float, procs: dict[str, Proc],
             progress: Callable[[], str]) -> bool:
    """``poll_until`` on the services: one that exits fails the run (ServiceExited)."""
    def exited() -> str | None:
        for name, p in procs.items():
            if not p.alive():
                return f"{name} exited ({p.popen.returncode}): {p.tail(8)}"
        return None

    return poll_until(done, deadline, exited=exited, progress=lambda _: say(progress()))


def figures(slo: Slo, phases: list[dict[str, Any]], arrivals: dict[str, dict[str, float]],
            repeats: list[Any], final: dict[tuple[str, str], str],
            marks: Mapping[str, Mapping[tuple[str, str], float]] | None = None) -> None:
    """Each phase's accept figures, outcomes and latencies, repeated keys, campaign rate (in place);
    with ``marks`` (``report.LEGS`` before the stub: {(dedup_key, channel): epoch s}), where the
    codes' time went."""
    at_stub: dict[tuple[str, str], float] = {}
    for channel_arrivals in arrivals.values():
        at_stub.update(report.by_request(channel_arrivals))
    channels_of = slo.channels_of()
    completions = sorted(float(e["latest_ack_timestamp"]) for e in slo.checkpoints.completed()) \
        if marks is not None and slo.checkpoints is not None else []
    for p in phases:
        p["notes"] = []
        records = slo.records.get(p["name"], [])
        p["accept"] = report.accept_summary(records)
        expected = report.expected_messages(records, channels_of)
        campaign = slo.campaigns.get(p["name"])
        if campaign is not None:
            campaign_id, first, users, created = campaign
            wanted = {(f"{CALLER}/{campaign_id}:u-{first + i}", c): report.Expected("campaign", created)
                      for i in range(users) for c in slo.plan.campaign_channels}
            expected.update(wanted)
            times = [at_stub[k] for k in wanted if k in at_stub]
            last_due = max((float(r[3]) for r in records), default=0.0)
            p["campaign"] = {"id": campaign_id, "users": users, **report.campaign_rate(times),
                             "flood_held": bool(times) and max(times) >= last_due}
            if not p["campaign"]["flood_held"]:
                p["notes"].append("the campaign was delivered before the codes and orders ended")
        outcomes = report.account(expected, at_stub, final)
        p["outcomes"] = {k: o.as_dict() for k, o in outcomes.items()}
        p["lost"] = sum(o.lost for o in outcomes.values())
        p["repeated_provider_keys"] = report.repeated_calls(repeats, expected)
        if marks is not None:
            p["code_legs"] = report.legs(expected, "code", {**marks, "stub": at_stub}, completions)
        if not p["settled"]:
            p["notes"].append(f"not every message at the stubs {p['settle_s']:.0f} s after the phase")


def guard_reliefs(log: Path) -> int:
    """How often a service's CPU-idle guard found its group starved (ops/cpu_idle.py), from its log."""
    from ops.cpu_idle import STARVED

    return log.read_text(encoding="utf-8", errors="replace").count(STARVED) if log.exists() else 0


def dump_stacks(procs: list[Proc]) -> None:
    """Ask each process and its children for their threads' stacks (``ops.stacks``: written to
    their logs), and give them a moment to write them."""
    try:
        import psutil
    except ImportError:  # the bench extra is not installed
        return
    from bench.api import Processes

    for proc in procs:
        try:
            tree = Processes(proc.pid).tree()
        except psutil.NoSuchProcess:
            continue
        for p in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(STACKS_SIGNAL)
        say(f"{proc.name}: its threads' stacks asked for (in {proc.log.name})")
    time.sleep(1.0)


def run(plan: Plan, out_dir: Path, keep: bool) -> int:
    from bench.senders_load import read_statuses
    from harness.local_kafka import LocalCluster

    work = Path(tempfile.mkdtemp(prefix="bench-slo-"))
    started = dt.datetime.now(dt.UTC)
    machine, git = machine_info(), git_info(REPO_ROOT)
    slo = Slo(plan, work)
    cluster = LocalCluster.on_free_ports(work / "kafka", plan.brokers)
    stub: StubProcess | None = None
    postgres: Any = None
    services: Services | None = None
    phases: list[dict[str, Any]] = []
    warm_up: list[dict[str, Any]] = []
    failures: list[str] = []
    reliefs: dict[str, int] = {}
    finished = False
    try:
        say(f"starting {plan.brokers} broker(s) and the provider stub ({plan.stub_latency_ms} ms), work in {work}")
        cluster.start()
        stub = StubProcess("http", latency_ms=plan.stub_latency_ms)
        location = str(work / "status.sqlite3")
        if plan.store == "postgresql":
            from harness.local_postgres import LocalPostgres
            from harness.ports import free_port

            postgres = LocalPostgres(port=free_port()).start()
            location = postgres.create_database("slo")
            # the server and its backends (SQLite's work is in its callers' processes)
            slo.sampler.watch("store", int((postgres.data_dir / "postmaster.pid").read_text().split()[0]))
        s = services = slo.start(cluster, stub, location)
        warm_up = slo.warm_up(s)
        for rate in plan.accept_rates:
            phases.append(slo.accept_phase(s, rate))
        phases.append(slo.flood_phase(s, "flood", 0, None))
        if plan.broker_kill:
            phases.append(slo.flood_phase(s, "flood-broker-kill", plan.users, cluster))
        say("reading the stubs' arrivals and the senders' status topic (read_committed)")
        deadline = time.monotonic() + plan.settle_bound_s
        while True:  # a stub's count includes what the API accepted after its caller gave up: match
            arrivals: dict[str, dict[str, float]] = {}
            repeats: list[Any] = []
            for channel in ("push", "sms"):
                dump = stub.dump(channel) or {"arrivals": {}, "repeats": []}
                arrivals[channel] = dump["arrivals"]
                repeats += dump["repeats"]
            figures(slo, phases, arrivals, repeats, {})
            missing = sum(p["lost"] for p in phases)
            if not missing or time.monotonic() >= deadline:
                break
            say(f"{missing:,} accepted messages not at the stub yet")
            time.sleep(5)
        total = sum(slo.expected_at_stub.values())
        statuses = read_statuses(cluster.bootstrap, s.cfg.senders.status_topic, total, timeout_s=120)
        visible = slo.lane_watch.stop() if slo.lane_watch is not None else {}
        ruled = {pair: ms / 1000 for pair, ms in report.by_request(statuses.claimed_ms).items()}
        figures(slo, phases, arrivals, repeats, report.by_request(statuses.final),
                {"visible": report.by_request(visible), "ruled": ruled})
        for p in phases:
            if p["lost"] or p["repeated_provider_keys"]:
                failures.append(f"{p['name']}: {p['lost']} lost, {p['repeated_provider_keys']} repeated provider keys")
        reliefs = {name: guard_reliefs(slo.procs[name].log) for name in ("job", "senders")}
        finished = True
    finally:
        if failures or not finished:  # where a stuck service waits: its threads' stacks, in its log
            dump_stacks([slo.procs[name] for name in ("api", "senders") if name in slo.procs])
        if slo.checkpoints is not None:
            slo.checkpoints.stop()
        if slo.lane_watch is not None:
            slo.lane_watch.stop()
        for proc in slo.procs.values():
            proc.terminate(grace_s=30)
        if stub is not None:
            stub.stop()
        cluster.stop()
        if postgres is not None:
            postgres.stop()
        slo.sampler.stop()
        if keep or failures or not finished:  # a failed run's logs are what explains it
            say(f"the work directory (logs, store, load records) is kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    assert services is not None
    result = {
        "date": started.isoformat(timespec="seconds"), "mode": plan.mode, "label": plan.label,
        "command": " ".join(["python", "-m", "bench.slo", *sys.argv[1:]]),
        "machine": {**machine, "loadavg_at_end": os.getloadavg(), "speed_probe_ms_at_end": speed_probe()}, "git": git,
        "config": {**asdict(plan), "checkpoint_interval_ms": services.cfg.flink.checkpoint_interval_ms,
                   "senders_max_in_flight": services.cfg.senders.max_in_flight,
                   "senders_commit_interval_ms": services.cfg.senders.commit_interval_ms,
                   "idle_guard_reliefs": reliefs},
        "imports": slo.imports, "warm_up": warm_up, "phases": phases, "failures": failures,
    }
    stem = "slo-" + started.date().isoformat() + (f"-{plan.label}" if plan.label else "")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    table = report.markdown(result)
    (out_dir / f"{stem}.md").write_text(table, encoding="utf-8")
    print(table)
    print(f"-> {out_dir / stem}.json, .md")
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.slo", description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the default: 20 s accept phases, a 20,000-user campaign")
    mode.add_argument("--full", action="store_true", help="the issue's sizes: 60 s phases, 100,000 users")
    parser.add_argument("--accept-rates", help="requests/s of the accept phases, comma-separated (1000,2000)")
    parser.add_argument("--accept-s", type=float, help="each accept phase's length (quick 20, full 60)")
    parser.add_argument("--users", type=int, help="the campaign's users (quick 20000, full 100000)")
    parser.add_argument("--campaign-rate", type=float, help="the campaign's rate (2000)")
    parser.add_argument("--flood-s", type=float, help="codes and order updates during the flood for this long")
    parser.add_argument("--code-rate", type=float, help="one-time codes/s during the flood (20)")
    parser.add_argument("--order-rate", type=float, help="order updates/s during the flood (200)")
    parser.add_argument("--warmup-s", type=float, help="each warm-up round's length, not measured (20)")
    parser.add_argument("--warmup-rate", type=float, help="the warm-up's requests/s (1000)")
    parser.add_argument("--warmup-rounds", type=int, help="the most warm-up rounds: until the JVMs are warm (6)")
    parser.add_argument("--settle-bound-s", type=float, help="wait at most this long for a phase's deliveries")
    parser.add_argument("--brokers", type=int, help="local brokers (1; 3 with --broker-kill)")
    parser.add_argument("--broker-kill", action="store_true", help="phase 3: the flood with a broker SIGKILLed")
    parser.add_argument("--kill-victim", choices=VICTIMS,
                        help="which node the kill takes: the busiest leader (as it falls), the active controller,"
                             " or a broker that is not it (leader)")
    parser.add_argument("--checkpoint-ms", type=int, help="flink.checkpoint_interval_ms (default: the setting's)")
    parser.add_argument("--stub-latency-ms", type=int, help="the providers' answer time (200)")
    parser.add_argument("--api-processes", type=int, help="dedupctl api run --processes (1)")
    parser.add_argument("--nice", type=int, choices=range(20), metavar="0-19",
                        help="the job's and the senders' CPU nice (flink.nice, senders.nice; 10; 0: as the API's)")
    parser.add_argument("--cpu-idle", action=argparse.BooleanOptionalAction, default=None,
                        help="the job and the senders in a CPU-idle cgroup (flink.cpu_idle, senders.cpu_idle; on)")
    parser.add_argument("--api-nice", type=int, choices=range(-20, 1), metavar="-20-0",
                        help="the API's CPU nice (api.nice; -5, which needs root; 0: as the other services)")
    parser.add_argument("--generator-nice", type=int, choices=range(-20, 1), metavar="-20-0",
                        help="the load generator's CPU nice (0)")
    parser.add_argument("--connections", type=int, help="the load generator's keep-alive connections (64)")
    parser.add_argument("--store", choices=("sqlite", "postgresql"), help="the API's and senders' store (sqlite)")
    parser.add_argument("--label", help="named into the result files: slo-<date>-<label>.json")
    parser.add_argument("--out", default=str(REPO_ROOT / "bench" / "results"))
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (logs, store); a failed run's is always kept")
    args = parser.parse_args(argv)
    plan = FULL if args.full else QUICK
    changes: dict[str, Any] = {}
    if args.accept_rates:
        changes["accept_rates"] = tuple(float(r) for r in args.accept_rates.split(",") if r)
    for name in ("warmup_s", "warmup_rate", "warmup_rounds", "accept_s", "users", "campaign_rate", "flood_s",
                 "code_rate", "order_rate", "settle_bound_s", "brokers", "kill_victim", "checkpoint_ms",
                 "stub_latency_ms", "api_processes", "nice", "cpu_idle", "api_nice", "generator_nice",
                 "connections", "store", "label"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if args.broker_kill:
        changes["broker_kill"] = True
        if changes.setdefault("brokers", 3) < 3:
            parser.error("--broker-kill needs three brokers: one broker of one is not a partial loss")
    raise_fd_limit()
    return run(replace(plan, **changes), Path(args.out), args.keep)


if __name__ == "__main__":
    sys.exit(main())
