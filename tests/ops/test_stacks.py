"""``kill -USR1 <pid>`` of one of our processes writes every thread's stack to its standard error,
and the process goes on (``ops.stacks``)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

from ops.stacks import STACKS_SIGNAL
from settings import REPO_ROOT

PARKED = textwrap.dedent("""
    import sys, threading
    from ops.stacks import dump_stacks_on_signal

    def parked_in_a_campaign(release):
        release.wait()

    dump_stacks_on_signal()
    release = threading.Event()
    worker = threading.Thread(target=parked_in_a_campaign, args=(release,), name="runner")
    worker.start()
    print("ready", flush=True)
    sys.stdin.readline()  # the signal comes while the main thread waits here
    release.set()
    worker.join()
    print("went on", flush=True)
""")


def test_the_signal_writes_each_thread_s_stack_and_the_process_goes_on() -> None:
    proc = subprocess.Popen([sys.executable, "-c", PARKED], cwd=REPO_ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(STACKS_SIGNAL)
        stacks = ""
        while "in <module>" not in stacks:  # the main thread's stack is written last
            line = proc.stderr.readline()
            assert line, f"the stacks ended early: {stacks}"
            stacks += line
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "went on\n"
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert stacks.count("(most recent call first):") == 2, stacks  # the worker and the main thread
    assert "in parked_in_a_campaign" in stacks  # the waiting thread, where it waits
    # the main thread, at its readline, or still returning from the print before it when the signal came
    assert re.search(r'File "<string>", line 1[23] in <module>', stacks), stacks
