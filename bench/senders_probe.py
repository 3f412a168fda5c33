"""A rough probe of one ``dedupctl senders run`` process (the runtime's own check while building it;
``python -m bench.senders`` is the benchmark): a local broker, N email messages of N users with
profiles, a provider stub in another process answering every POST after a set latency, then one
``senders run`` driven through DEDUP_* settings only. Prints messages/s (first to last SENT),
the sender process's CPU per delivered message, store transactions per message (the
``sender_store_transactions_total`` counter from ``--metrics-port``), the stub's peak calls in
flight and any message key it saw twice.

    python -m bench.senders_probe --messages 20000 --latency-ms 200 --max-in-flight 500 [--postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.measure import thread_comms, thread_cpu
from harness.local_kafka import LocalBroker
from harness.ports import free_port
from settings import REPO_ROOT, Settings


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of every thread of ``pid``, summed by thread name (librdkafka's
    native threads included, which py-spy does not see)."""
    names = thread_comms(pid)
    found: dict[str, float] = {}
    for tid, spent in thread_cpu(pid).items():
        if tid not in names:  # the thread ended meanwhile
            continue
        name = re.sub(r"\d+", "N", names[tid])
        found[name] = found.get(name, 0.0) + spent
    return found


def _stub(port: int, latency_s: float, report: multiprocessing.connection.Connection) -> None:
    """An HTTP/1.1 keep-alive stub: 202 with an id after ``latency_s``; counts keys and calls open."""
    seen: dict[str, int] = {}
    state = {"open": 0, "peak": 0, "n": 0}

    class Conn(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.t = transport
            self.buf = b""

        def data_received(self, data: bytes) -> None:
            self.buf += data
            while True:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buf[:end].decode("latin-1")
                size = int(re.search(r"(?im)^content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
                if len(self.buf) < end + 4 + size:
                    return
                found = re.search(r"(?im)^idempotency-key:\s*(\S+)", head)
                key = found.group(1) if found else ""
                self.buf = self.buf[end + 4 + size :]
                seen[key] = seen.get(key, 0) + 1
                state["n"] += 1
                state["open"] += 1
                state["peak"] = max(state["peak"], state["open"])
                body = b'{"id":"m-%d"}' % state["n"]
                reply = b"HTTP/1.1 202 Accepted\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                asyncio.get_running_loop().call_later(latency_s, self._answer, reply)

        def _answer(self, reply: bytes) -> None:
            state["open"] -= 1
            if not self.t.is_closing():
                self.t.write(reply)  # type: ignore[attr-defined]

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Conn, "127.0.0.1", port, backlog=4096)
        report.send("ready")
        while not report.poll(0):
            await asyncio.sleep(0.2)
        report.recv()
        report.send({"calls": state["n"], "peak": state["peak"], "repeated": sum(1 for n in seen.values() if n > 1)})
        server.close()

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main())


@contextmanager
def _broker(home: Path) -> Iterator[LocalBroker]:
    broker = LocalBroker(home=home, port=free_port(), controller_port=free_port(), heap_mb=768)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()  # noqa: S310
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def main() -> int:  # noqa: PLR0915 - one straight run
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--max-in-flight", type=int, default=500)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--postgres", action="store_true", help="the status store on a local PostgreSQL")
    parser.add_argument("--profile", help="py-spy record the sender into this file (collapsed stacks)")
    args = parser.parse_args()

    import psutil

    from operators import codec
    from ops import kafka_io
    from senders.profiles.crypto import generate_key
    from senders.profiles.model import parse_profile
    from senders.runtime.pool import ensure_topics, open_profile_store, open_status_store

    work = Path(tempfile.mkdtemp(prefix="senders-probe-"))
    with _broker(work / "kafka") as broker:
        pg = None
        store = str(work / "status.sqlite3")
        if args.postgres:
            from harness.local_postgres import LocalPostgres

            pg = LocalPostgres(port=free_port()).start()
            store = pg.dsn
        run = uuid.uuid4().hex[:6]
        port = free_port()
        senders = {
            "group_prefix": f"probe-{run}",
            "instance_id": f"probe-{run}",
            "status_store": store,
            "sqlite_synchronous": "NORMAL",
            "email_primary": f"http://127.0.0.1:{port}/v1/send",
            "email_rate_per_sec": 100_000.0,
            "rate_burst": 1000,
            "max_in_flight": args.max_in_flight,
            "contact_encryption_keys": generate_key(),
            "contact_lookup_keys": generate_key(),
            "metrics_log_interval_s": 0,
        }
        cfg = Settings().with_overrides(
            kafka={"bootstrap_servers": broker.bootstrap, "partitions": args.partitions}, senders=senders
        )
        kafka_io.create_topics(cfg.kafka.client_config(), [cfg.topics.email], args.partitions)
        ensure_topics(cfg)
        n = args.messages
        profiles = open_profile_store(cfg)
        for i in range(0, n, 5000):
            profiles.put_many(
                (f"u{j}", parse_profile({"contacts": {"email": [f"u{j}@example.com"]}}))
                for j in range(i, min(n, i + 5000))
            )
        producer = kafka_io.producer(cfg.kafka.client_config(), **{"linger.ms": "20"})
        messages = (
            {
                "message_key": f"p{i}:email:1",
                "channel": "email",
                "notification_id": f"n{i}",
                "user_id": f"u{i}",
                "template_id": "order_shipped",
                "params": {"order": str(i)},
                "channels": ["email"],
                "priority": "normal",
                "category": "transactional",
                "event_time": int(time.time() * 1000),
                "dedup_key": f"p{i}",
                "dedup_ttl_sec": None,
            }
            for i in range(n)
        )
        kafka_io.produce_all(
            producer,
            cfg.topics.email,
            ((str(m["user_id"]).encode(), codec.encode("channel_message", m)) for m in messages),
        )
        ours, theirs = multiprocessing.Pipe()
        stub = multiprocessing.Process(target=_stub, args=(port, args.latency_ms / 1000, theirs), daemon=True)
        stub.start()
        assert ours.recv() == "ready"
        env = dict(os.environ)
        env.update({f"DEDUP_SENDERS_{k.upper()}": str(v) for k, v in senders.items()})
        env["DEDUP_KAFKA_BOOTSTRAP_SERVERS"] = broker.bootstrap
        env["DEDUP_KAFKA_PARTITIONS"] = str(args.partitions)
        metrics_port = free_port()
        log = open(work / "senders.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dedupctl.cli",
                "senders",
                "run",
                "--channel",
                "email",
                "--lane",
                "normal",
                "--metrics-port",
                str(metrics_port),
                "--no-create-topics",
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        spy = None
        if args.profile:
            spy = subprocess.Popen(
                [
                    str(Path(sys.executable).with_name("py-spy")),
                    "record",
                    "-r",
                    "100",
                    "-f",
                    "raw",
                    "-o",
                    args.profile,
                    "-p",
                    str(proc.pid),
                ]
            )
        sampler = psutil.Process(proc.pid)
        status = open_status_store(cfg)
        first_cpu = None
        first_at = None
        sent = 0
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            time.sleep(0.25)
            if proc.poll() is not None:
                raise SystemExit(f"senders run exited with {proc.returncode}: see {work / 'senders.log'}")
            with status.db.tx(write=False) as cur:
                found = status.db.exec(cur, "SELECT COUNT(*) FROM delivery_status WHERE status = 'sent'").fetchone()
            sent = int(found[0])
            if sent and first_at is None:
                first_at, first_cpu = time.monotonic(), sampler.cpu_times()
                first_threads = _thread_cpu(proc.pid)
                first_sent = sent
            if sent >= n:
                break
        done_at, done_cpu = time.monotonic(), sampler.cpu_times()
        done_threads = _thread_cpu(proc.pid)
        transactions = _metric(metrics_port, "sender_store_transactions_total")
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spy.wait(60)
        proc.terminate()
        proc.wait(60)
        log.close()
        ours.send("stop")
        stub_report = ours.recv()
        assert first_at is not None and first_cpu is not None
        delivered = sent - first_sent
        wall = done_at - first_at
        cpu = (done_cpu.user + done_cpu.system) - (first_cpu.user + first_cpu.system)
        print(
            json.dumps(
                {
                    "messages": n,
                    "sent": sent,
                    "store": "postgresql" if args.postgres else "sqlite",
                    "latency_ms": args.latency_ms,
                    "max_in_flight": args.max_in_flight,
                    "messages_per_s": round(delivered / wall, 1) if wall > 0 else None,
                    "cpu_us_per_message": round(cpu / delivered * 1e6, 1) if delivered else None,
                    "store_transactions_per_message": round(transactions / n, 3),
                    "stub": stub_report,
                    "thread_cpu_us_per_message": {
                        name: round((done_threads[name] - first_threads.get(name, 0.0)) / delivered * 1e6, 1)
                        for name in sorted(done_threads)
                        if delivered and done_threads[name] - first_threads.get(name, 0.0) > 0
                    },
                },
                indent=2,
            )
        )
        if pg is not None:
            pg.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
