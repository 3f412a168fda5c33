"""The worker's threads: the OS name of a thread (``top -H``, ``/proc/PID/task/TID/comm``), so
that the CPU of a ``senders run`` process can be told apart by thread (the event loop, each
worker's consumer, producer and store threads, librdkafka's own, named by librdkafka), and an
executor whose one thread the process may exit without."""

from __future__ import annotations

import ctypes
import ctypes.util
import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

_PR_SET_NAME = 15
_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    except OSError:  # pragma: no cover - no libc to load: threads keep the interpreter's name
        _libc = None


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` (cut to Linux's 15 bytes); nothing off Linux."""
    if _libc is not None:
        _libc.prctl(_PR_SET_NAME, name.encode("ascii", "replace")[:15], 0, 0, 0)


_Call = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonThreadExecutor(Executor):
    """Runs the calls submitted to it one after another on one daemon thread.

    A ``ThreadPoolExecutor``'s threads are joined when the interpreter exits, so one call that
    never returns (a librdkafka call that outlives its own timeout) would keep the process from
    ever exiting. A worker that gives up on such a call leaves it here and starts over."""

    def __init__(self, name: str, os_name: str) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._shut = False
        self._thread = threading.Thread(target=self._serve, args=(os_name,), name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        done: Future[Any] = Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._calls.put((done, fn, args, kwargs))
        return done

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """As ``ThreadPoolExecutor.shutdown``: no new calls; with ``cancel_futures`` the calls
        not yet started are cancelled; with ``wait``, returns when the running one returns."""
        with self._lock:
            if not self._shut:
                self._shut = True
                if cancel_futures:
                    while True:
                        try:
                            call = self._calls.get_nowait()
                        except queue.Empty:
                            break
                        if call is not None:
                            call[0].cancel()
                self._calls.put(None)
        if wait:
            self._thread.join()

    def _serve(self, os_name: str) -> None:
        name_os_thread(os_name)
        while (call := self._calls.get()) is not None:
            done, fn, args, kwargs = call
            if not done.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                done.set_exception(exc)
            else:
                done.set_result(result)
