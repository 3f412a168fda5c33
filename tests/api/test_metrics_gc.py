"""The API's garbage-collector pauses (``api_gc_pause_seconds``) are observed from the event loop,
not from the collector's callback: the callback runs in whichever thread's allocation started the
collection, and that thread may hold prometheus_client's lock then (one lock for every value with
several processes, not reentrant). Observing there stopped the thread for good, and every thread
of its process after it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from api.metrics import MULTIPROC_ENV
from settings import REPO_ROOT

# new labelled children (each made under the values' lock) while a collection starts at nearly
# every allocation, so some start inside that lock, in the thread holding it
SCRIPT = textwrap.dedent("""
    import gc, sys, threading
    from api.metrics import ApiMetrics

    metrics = ApiMetrics()
    metrics.watch_gc()
    done = threading.Event()

    def new_children():
        gc.set_threshold(1)
        for i in range(2000):
            metrics.rate_limited.labels(f"caller-{i}", "send").inc()
        gc.set_threshold(700)
        done.set()

    threading.Thread(target=new_children, daemon=True).start()
    if not done.wait(60):
        print("stuck", flush=True)
        sys.exit(3)
    text = metrics.render().decode()
    counts = [line for line in text.splitlines() if line.startswith("api_gc_pause_seconds_count")]
    print(sum(float(line.rsplit(" ", 1)[1]) for line in counts), flush=True)
""")


def test_collections_inside_the_values_lock_neither_stop_the_thread_nor_go_unobserved(tmp_path: Path) -> None:
    env = {**os.environ, MULTIPROC_ENV: str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert float(done.stdout.strip()) >= 2000  # threshold 1: a collection at least per child made
