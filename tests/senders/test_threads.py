"""senders/runtime/threads.py: the executor a worker's transactions run on."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from senders.runtime.threads import DaemonThreadExecutor, name_os_thread


def test_calls_run_in_order_on_one_daemon_thread() -> None:
    pool = DaemonThreadExecutor("t-txn", "snd-test")
    seen: list[tuple[int, str]] = []
    futures = [pool.submit(lambda i=i: seen.append((i, threading.current_thread().name)) or i) for i in range(5)]
    assert [f.result(timeout=5) for f in futures] == [0, 1, 2, 3, 4]
    assert seen == [(i, "t-txn") for i in range(5)]
    assert pool._thread.daemon
    pool.shutdown()
    assert not pool._thread.is_alive()


def test_an_exception_reaches_the_caller_and_the_thread_goes_on() -> None:
    pool = DaemonThreadExecutor("t-txn", "snd-test")

    def fail() -> None:
        raise ValueError("broken")

    with pytest.raises(ValueError, match="broken"):
        pool.submit(fail).result(timeout=5)
    assert pool.submit(lambda: 7).result(timeout=5) == 7
    pool.shutdown()


def test_shutdown_cancels_what_has_not_started_and_refuses_new_calls() -> None:
    pool = DaemonThreadExecutor("t-txn", "snd-test")
    release = threading.Event()
    started = threading.Event()

    def block() -> str:
        started.set()
        release.wait(10)
        return "ran"

    running = pool.submit(block)
    assert started.wait(5)
    queued = [pool.submit(lambda: "never") for _ in range(3)]
    pool.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in queued)
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(lambda: None)
    release.set()
    assert running.result(timeout=5) == "ran"
    pool._thread.join(5)
    assert not pool._thread.is_alive()


def test_a_call_that_never_returns_does_not_hold_shutdown_without_wait() -> None:
    pool = DaemonThreadExecutor("t-txn", "snd-test")
    forever = threading.Event()
    pool.submit(forever.wait)
    pool.shutdown(wait=False)  # returns although the call never will
    assert pool._thread.is_alive() and pool._thread.daemon
    forever.set()


def test_the_os_sees_the_threads_name() -> None:
    names: list[str] = []

    def run() -> None:
        name_os_thread("snd-a-very-long-name")
        tid = threading.get_native_id()
        names.append(Path(f"/proc/self/task/{tid}/comm").read_text().strip())

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert names == ["snd-a-very-long"]  # Linux keeps 15 bytes
