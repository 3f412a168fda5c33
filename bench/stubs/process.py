"""A provider stub in a process of its own (``multiprocessing`` with ``spawn``), so that its CPU
is not the senders' and its event loop shares no GIL with the harness. The harness drives it over
a pipe (:class:`StubProcess`): set the latency, read the counts, dump the arrivals, reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import socket
import traceback
from multiprocessing.connection import Connection
from typing import Any

from bench.stubs.http import HttpStubProtocol, StubState

_SPAWN = multiprocessing.get_context("spawn")
KINDS = ("http", "smtp")
SAMPLE_S = 0.1


def raise_fd_limit() -> None:
    """Open files up to the hard limit: a connection is a file, and thousands may be open."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))


def _listener(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(8192)
    sock.setblocking(False)
    return sock


async def _serve(conn: Connection, kind: str, host: str, port: int, latency_ms: float) -> None:
    loop = asyncio.get_running_loop()
    state = StubState(latency_s=latency_ms / 1000)
    sock = _listener(host, port)
    if kind == "http":
        server = await loop.create_server(lambda: HttpStubProtocol(state), sock=sock, backlog=8192)
    else:
        from bench.stubs.smtp import StubHandler, StubSmtp

        handler = StubHandler(state)
        server = await loop.create_server(lambda: StubSmtp(handler, enable_SMTPUTF8=True), sock=sock, backlog=8192)
    stopped = asyncio.Event()

    def on_command() -> None:
        try:
            command, *args = conn.recv()
        except EOFError:
            stopped.set()
            return
        answer = _answer(state, command, args, stopped)
        # the loop's reader made the pipe non-blocking, and a dump (every key's arrival) is larger
        # than the pipe holds: written that way it fails with EAGAIN whenever the benchmark has
        # not read the first part yet; the stub's loop may wait here, the run is over
        os.set_blocking(conn.fileno(), True)
        try:
            conn.send(answer)
        finally:
            os.set_blocking(conn.fileno(), False)

    loop.add_reader(conn.fileno(), on_command)
    conn.send(("ready", sock.getsockname()[1], os.getpid()))
    while not stopped.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopped.wait(), SAMPLE_S)
        now = state.clock()
        for tally in state.tallies.values():
            tally.sample(now)
    loop.remove_reader(conn.fileno())
    server.close()


def _answer(state: StubState, command: str, args: list[Any], stopped: asyncio.Event) -> Any:
    if command == "latency":
        state.latency_s = float(args[0]) / 1000
        return True
    if command == "count":
        tally = state.tallies.get(args[0])
        return tally.distinct if tally is not None else 0
    if command == "summary":
        return {"channels": {c: t.summary() for c, t in state.tallies.items()}, "connections": state.connections,
                "peak_connections": state.peak_connections, "h2_connections": state.h2_connections}
    if command == "dump":
        tally = state.tallies.get(args[0])
        return tally.dump() if tally is not None else None
    if command == "reset":
        state.tallies.clear()
        state.peak_connections = state.connections
        state.h2_connections = 0
        return True
    if command == "stop":
        stopped.set()
        return True
    return ValueError(f"unknown command {command!r}")


def _main(conn: Connection, kind: str, host: str, port: int, latency_ms: float) -> None:
    raise_fd_limit()
    try:
        try:
            import uvloop

            runner: Any = uvloop.run
        except ImportError:  # the plain loop does the same, with more CPU per call
            runner = asyncio.run
        runner(_serve(conn, kind, host, port, latency_ms))
    except BaseException:  # noqa: BLE001 - tell the harness why, then go
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))


class StubProcess:
    """``with StubProcess("http", latency_ms=200) as stub: stub.port, stub.count("sms") ...``"""

    def __init__(self, kind: str, latency_ms: float = 0.0, host: str = "127.0.0.1", port: int = 0) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}")
        self.kind = kind
        self.host = host
        self._conn, child = _SPAWN.Pipe()
        self._proc = _SPAWN.Process(target=_main, args=(child, kind, host, port, latency_ms), daemon=True,
                                    name=f"bench-stub-{kind}")
        self._proc.start()
        child.close()
        if not self._conn.poll(60):
            self.stop()
            raise RuntimeError(f"the {kind} stub did not start within 60 s")
        ready = self._conn.recv()
        if ready[0] != "ready":
            self.stop()
            raise RuntimeError(f"the {kind} stub failed: {ready[1]}")
        self.port: int = ready[1]
        self.pid: int = ready[2]

    def _call(self, *command: Any, timeout_s: float = 60.0) -> Any:
        self._conn.send(command)
        if not self._conn.poll(timeout_s):
            raise RuntimeError(f"the {self.kind} stub did not answer {command[0]!r} within {timeout_s:g} s")
        answer = self._conn.recv()
        if isinstance(answer, tuple) and answer and answer[0] == "error":
            raise RuntimeError(f"the {self.kind} stub failed: {answer[1]}")
        if isinstance(answer, Exception):
            raise answer
        return answer

    def set_latency(self, ms: float) -> None:
        self._call("latency", ms)

    def count(self, channel: str) -> int:
        """Distinct message keys seen on the channel."""
        return int(self._call("count", channel))

    def summary(self) -> dict[str, Any]:
        return dict(self._call("summary"))

    def dump(self, channel: str) -> dict[str, Any] | None:
        """The channel's tally: arrivals by message key, repeats, in-flight samples, summary."""
        found = self._call("dump", channel, timeout_s=300)
        return dict(found) if found is not None else None

    def reset(self) -> None:
        self._call("reset")

    def stop(self) -> None:
        if self._proc.is_alive():
            with contextlib.suppress(OSError, RuntimeError, EOFError):
                self._call("stop", timeout_s=10)
            self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._conn.close()

    def __enter__(self) -> StubProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
