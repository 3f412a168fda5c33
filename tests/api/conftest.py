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

from api.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from api.tables import SCHEMA
from api.tokens import Caller, create_token
from harness.ports import free_port
from harness.settings_file import write_settings
from operators.contract import Topics
from operators.records import Category
from ops import kafka_io
from senders.runtime.pool import ensure_topics, open_status_store
from settings import REPO_ROOT, Settings
from tests.senders.conftest import fast_senders, register_users

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
              templates: tuple[str, ...] = (), rate: float | None = None) -> str:
        store = open_status_store(self.cfg)
        try:
            store.db.ensure_schema(SCHEMA)
            return create_token(store.db, Caller(name, frozenset(categories), frozenset(templates), rate),
                                int(time.time() * 1000))
        finally:
            store.close()

    def client(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


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


@pytest.fixture(scope="module")
def running_api(kafka_bootstrap: str, api_root: Path) -> Iterator[RunningApi]:
    cfg = api_settings(kafka_bootstrap, api_root)
    api = RunningApi(cfg, api_root).start()
    yield api
    if api.proc is not None:
        api.stop()
