"""Fixtures of the API tests: the API as its own process (``dedupctl api run``) on the session's
broker, with its settings in a TOML file, tokens, profiles, signed receipts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.callers import Caller
from api.database import open_api_store
from api.scopes import Scope
from api.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from api.tokens import create_caller
from harness.local_jaeger import LocalJaeger
from harness.ports import free_port
from harness.settings_file import write_settings
from operators.contract import Topics
from operators.records import Category, Channel
from ops import kafka_io
from senders.runtime.pool import ensure_topics
from senders.statuses import Lane
from settings import REPO_ROOT, Settings
from tests.senders.conftest import fast_senders, read_records, register_users
from tests.senders.fake_http import FakeHttpProvider

WEBHOOK_SECRET = "whsec-test-3f9a"


def api_settings(bootstrap: str, root: Path, *, senders: Mapping[str, object] | None = None,
                 api: Mapping[str, object] | None = None, partitions: int = 2) -> Settings:
    """Fresh topics (every role, the senders' and the campaigns'), a store under ``root``."""
    run = uuid.uuid4().hex[:8]
    topics = Topics().with_prefix(f"a{run}.")
    kafka_io.create_topics({"bootstrap.servers": bootstrap}, topics.all(), partitions)
    prefix = f"a{run}."
    values = fast_senders(root, status_topic=f"{prefix}notifications.status", dlq_topic=f"{prefix}notifications.dlq")
    values.update(senders or {})
    cfg = Settings(topics=topics).with_overrides(
        kafka={"bootstrap_servers": bootstrap, "partitions": partitions, "group_id": f"test-{run}"},
        senders=values,
        api={
            "port": free_port(),
            "campaigns_topic": f"{prefix}notifications.campaigns",
            "transactional_id_prefix": f"api-{run}",
            "outcomes_group": f"api-outcomes-{run}",
            "webhook_secrets": f"127.0.0.1={WEBHOOK_SECRET}",
            "ack_timeout_ms": 5000,
            "prune_interval_s": 3600,
            **(api or {}),
        },
        flink={
            "checkpoint_dir": str(root / f"checkpoints-{run}"),
            "checkpoint_interval_ms": 1000,
            "transactional_id_prefix": f"test-{run}",
            "rest_port": free_port(),
            "restart_attempts": 3,
            "restart_delay_ms": 500,
        },
        dedup={"idleness_ms": 5000},
    )
    ensure_topics(cfg)
    return cfg


@dataclass
class RunningApi:
    """``dedupctl api run`` in its own process."""

    cfg: Settings
    root: Path
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.root / f"api-{uuid.uuid4().hex[:6]}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.cfg.api.port}"

    def start(self, timeout_s: float = 60.0, ready_path: str = "/readyz") -> RunningApi:
        config = write_settings(self.cfg, self.root / "api.toml")
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dedupctl.cli", "--config", str(config), "api", "run"],
            cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the API exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + ready_path, timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the API was not ready within {timeout_s:g} s:\n{self.log.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout_s)
        self.proc = None
        return code

    def token(self, name: str, categories: tuple[Category, ...] = (Category.TRANSACTIONAL,),
              templates: tuple[str, ...] = (), rate: float | None = None,
              scopes: tuple[Scope, ...] = (Scope.SEND, Scope.STATUS_READ), namespaces: tuple[str, ...] = (),
              expires_ms: int | None = None) -> str:
        """A new caller ``name`` and its token (as ``dedupctl api token create`` makes them)."""
        return make_token(self.cfg, Caller(name, frozenset(scopes), frozenset(categories), frozenset(templates), rate,
                                           frozenset(namespaces)), expires_ms)

    def client(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def make_token(cfg: Settings, caller: Caller, expires_ms: int | None = None) -> str:
    db = open_api_store(cfg)
    try:
        return create_caller(db, caller, int(time.time() * 1000), expires_ms)
    finally:
        db.close()


ALL_SCOPES = tuple(Scope)


def signed(body: dict[str, Any], secret: str = WEBHOOK_SECRET, at: int | None = None) -> tuple[bytes, dict[str, str]]:
    raw = json.dumps(body).encode()
    ts = int(time.time()) if at is None else at
    return raw, {TIMESTAMP_HEADER: str(ts), SIGNATURE_HEADER: sign(secret.encode(), ts, raw),
                 "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def api_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("api")


def register(cfg: Settings, users: list[str]) -> None:
    register_users(cfg, users)


PIPELINE_USERS = ["nusrat", "bruno", "chen"]


@dataclass
class Pipeline:
    """The API, the dedup job and the sender workers (SMS, an HTTP provider: a local fake)."""

    api: RunningApi
    cfg: Settings
    fake: FakeHttpProvider
    provider: str  # the senders' name of the HTTP provider (its host:port)
    sender: str  # the token of caller "shop": send, status:read
    bootstrap: str
    support: str  # a support:read token
    jaeger: LocalJaeger  # where the pipeline's traces go ([telemetry] otlp_endpoint)

    def client(self, token: str | None = None) -> httpx.Client:
        return self.api.client(token if token is not None else self.sender)

    def _path(self, ident: str, support: bool) -> str:
        return f"/v1/support/notifications/{ident}" if support else f"/v1/notifications/{ident}"

    def status(self, ident: str, support: bool = False, token: str | None = None) -> dict:  # type: ignore[type-arg]
        """``GET`` of a notification: the caller's own (``token``, else shop's), or support's."""
        reply = self.client(self.support if support else token).get(self._path(ident, support))
        assert reply.status_code == 200, reply.text
        return reply.json()  # type: ignore[no-any-return]

    def verdict(self, ident: str, support: bool = False, token: str | None = None) -> str | None:
        reply = self.client(self.support if support else token).get(self._path(ident, support))
        return str(reply.json()["verdict"]) if reply.status_code == 200 else None

    def requests(self) -> list[dict]:  # type: ignore[type-arg]
        return read_records(self.bootstrap, self.cfg.topics.requests, "notification_request")


@pytest.fixture(scope="module")
def pipeline(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    root = tmp_path_factory.mktemp("pipeline")
    fake = FakeHttpProvider().start()
    provider = fake.url.split("/")[2]
    # traces on, to a real Jaeger: test_pipeline's trace test finds a notification's trace in it
    jaeger = LocalJaeger(root / "jaeger").start()
    # push's primary is the outbox (never used: no user has a push address, the pool sends SMS only),
    # so that the API serves GET /v1/outbox, from the pipeline's own data directory
    cfg = api_settings(
        kafka_bootstrap, root, senders={"sms_primary": fake.url, "push_primary": "outbox"},
        api={"webhook_secrets": f"{provider}=whsec-test-3f9a"},
    ).with_overrides(telemetry={"otlp_endpoint": jaeger.otlp_endpoint}).model_copy(update={"data_dir": str(root / "data")})
    register_users(cfg, PIPELINE_USERS, [Channel.SMS])
    from jobs.runner import run_job
    from senders.runtime.pool import build_pool

    job = run_job(cfg.with_overrides(dedup={"max_field_bytes": 100}), None, detached=True)
    pool = build_pool(cfg, channels=[Channel.SMS], lanes=[Lane.NORMAL, Lane.PRIORITY]).start()
    api = RunningApi(cfg, root).start()
    try:
        yield Pipeline(api, cfg, fake, provider, api.token("shop"), kafka_bootstrap,
                       api.token("support", scopes=(Scope.SUPPORT_READ,)), jaeger)
    finally:
        api.stop()
        pool.stop()
        try:
            job.cancel().result()  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - already finished
            pass
        fake.stop()
        jaeger.stop()


@pytest.fixture(scope="module")
def running_api(kafka_bootstrap: str, api_root: Path) -> Iterator[RunningApi]:
    cfg = api_settings(kafka_bootstrap, api_root)
    api = RunningApi(cfg, api_root).start()
    yield api
    if api.proc is not None:
        api.stop()
