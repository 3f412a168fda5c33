"""ops.cpu_idle: a throughput service in a CPU-idle control group, and the guard that lets the
group compete again when it starves."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ops.cpu_idle import (
    STARVED,
    CpuHierarchy,
    GuardOptions,
    GuardPolicy,
    find_hierarchy,
    join_idle_group,
    usage,
)
from settings import REPO_ROOT, Settings, load_settings
from tests.ops.helpers import writable_cpu_hierarchy

HYBRID_MOUNTS = """\
25 30 0:22 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
29 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:13 - cgroup cgroup rw,cpu,cpuacct
30 25 0:27 / /sys/fs/cgroup/cpuset rw,nosuid shared:14 - cgroup cgroup rw,cpuset
"""
HYBRID_GROUPS = "4:cpuset:/\n3:cpu,cpuacct:/system.slice/notify.service\n0::/system.slice/notify.service\n"
V2_MOUNTS = "27 22 0:24 / /sys/fs/cgroup rw,nosuid,nodev,noexec shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_the_cpu_controller_is_found_in_a_hybrid_host_s_v1_mount_and_in_a_v2_host_s_one() -> None:
    assert find_hierarchy(HYBRID_MOUNTS, HYBRID_GROUPS) == CpuHierarchy(
        Path("/sys/fs/cgroup/cpu,cpuacct"), "system.slice/notify.service", 1)
    assert find_hierarchy(V2_MOUNTS, "0::/user.slice/session-3.scope\n") == CpuHierarchy(
        Path("/sys/fs/cgroup"), "user.slice/session-3.scope", 2)
    got = find_hierarchy(V2_MOUNTS, "0::/\n")
    assert got is not None and got.group("notify-batch") == Path("/sys/fs/cgroup/notify-batch")


def test_a_namespaced_mount_s_root_is_taken_off_the_process_s_path() -> None:
    mounts = "40 30 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    got = find_hierarchy(mounts, "0::/kubepods/pod1/app\n")
    assert got == CpuHierarchy(Path("/sys/fs/cgroup"), "app", 2)


def test_lines_that_are_not_mounts_or_groups_are_passed_over() -> None:
    mounts = "garbage\n - \n1 2 3 - cgroup\n1 2 3 4 - cgroup2\n" + V2_MOUNTS + "\x00\xff - ?\n"
    assert find_hierarchy(mounts, "nonsense\n::\n0::/svc\n") == CpuHierarchy(Path("/sys/fs/cgroup"), "svc", 2)


def test_no_hierarchy_with_the_cpu_controller_is_none() -> None:
    assert find_hierarchy("30 25 0:27 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n", "4:cpuset:/\n") is None
    assert find_hierarchy("", "") is None


def test_usage_is_the_cores_run_and_threads_waiting_of_the_threads_read_both_times() -> None:
    before = {1: (0, 0), 2: (1_000_000_000, 0), 3: (5, 5)}  # 3 is gone by the second reading
    after = {1: (500_000_000, 2_000_000_000), 2: (1_500_000_000, 1_000_000_000), 4: (9e9, 9e9)}
    cores, waiting = usage(before, after, 2.0)  # type: ignore[arg-type]
    assert (cores, waiting) == (0.5, 1.5)


def test_the_policy_relieves_a_group_starved_for_starved_s_for_relief_s_after_its_last_starved_window() -> None:
    policy = GuardPolicy(GuardOptions(window_s=1.0, min_cores=0.05, min_waiting=0.5, starved_s=3.0, relief_s=10.0))
    assert policy.idle_after(1.0, 0.01, 2.0)  # starved for 1 s, 2 s: not yet
    assert policy.idle_after(2.0, 0.01, 2.0)
    assert not policy.idle_after(3.0, 0.01, 2.0)  # 3 s
    assert policy.reliefs == 1
    assert not policy.idle_after(4.0, 0.01, 2.0)  # still starved: the relief runs on
    assert not policy.idle_after(13.0, 0.9, 0.1)  # 9 s after the last starved window
    assert policy.idle_after(14.0, 0.9, 0.1)
    assert policy.reliefs == 1


def test_a_group_that_runs_little_because_it_wants_little_is_not_starved() -> None:
    policy = GuardPolicy(GuardOptions(window_s=1.0, starved_s=2.0))
    for second in range(1, 20):
        assert policy.idle_after(float(second), 0.001, 0.01)  # idle, not waiting
    for second in range(20, 40):  # busy and waiting, but running: a full host, not a starved group
        assert policy.idle_after(float(second), 0.3, 3.0)
    assert policy.idle_after(40.0, 0.01, 1.0) and policy.reliefs == 0  # starved for one window: 1 s
    assert not policy.idle_after(41.0, 0.01, 1.0)  # a second in a row: 2 s
    assert policy.reliefs == 1


def test_joining_writes_the_group_s_cpu_idle_and_moves_the_process(tmp_path: Path) -> None:
    v1 = CpuHierarchy(tmp_path / "cpu", "", 1)
    v1.mount.mkdir()
    group = join_idle_group("batch", hierarchy=v1)
    assert group == tmp_path / "cpu" / "batch"
    assert (group / "cpu.idle").read_text() == "1" and (group / "cgroup.procs").read_text() == "0"

    v2 = CpuHierarchy(tmp_path / "unified", "svc", 2)  # v2: the cpu controller enabled below its group first
    (v2.mount / "svc").mkdir(parents=True)
    (v2.mount / "svc" / "cgroup.subtree_control").write_text("memory\n")
    assert join_idle_group("batch", hierarchy=v2) == tmp_path / "unified" / "svc" / "batch"
    assert (v2.mount / "svc" / "cgroup.subtree_control").read_text() == "+cpu"


def test_a_refused_join_leaves_the_process_where_it_was_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ops.cpu_idle")
    assert join_idle_group("batch", hierarchy=CpuHierarchy(tmp_path / "missing", "", 1)) is None
    assert "the process stays in its CPU group" in caplog.text and "CPUWeight=idle" in caplog.text


def test_the_settings_are_off_by_default_and_read_from_the_environment() -> None:
    assert (Settings().flink.cpu_idle, Settings().senders.cpu_idle) == (False, False)
    cfg = load_settings(env={"DEDUP_FLINK_CPU_IDLE": "true", "DEDUP_SENDERS_CPU_IDLE": "1"})
    assert (cfg.flink.cpu_idle, cfg.senders.cpu_idle) == (True, True)


REAL = writable_cpu_hierarchy()
needs_cgroups = pytest.mark.skipif(REAL is None, reason="no writable cgroup hierarchy with the cpu controller")

#: a process in a fresh idle group, a thread of it spinning, two busy loops outside it (one per
#: core of this machine): the group runs next to nothing until its guard clears cpu.idle
STARVING = """
import json, logging, os, subprocess, sys, threading, time
from ops.cpu_idle import GuardOptions, IdleGuard, join_idle_group
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
group = join_idle_group(sys.argv[1])
inherited = subprocess.run(["cat", "/proc/self/cgroup"], capture_output=True, text=True).stdout
windows = []
guard = IdleGuard(group, GuardOptions(window_s=0.5, starved_s=1.5, relief_s=60.0), observer=windows.append)
guard.start()
stop = time.monotonic() + 12
def spin():
    while time.monotonic() < stop and guard.policy.reliefs == 0:
        pass
threading.Thread(target=spin, daemon=True).start()
out = sys.argv[2]
hogs = [subprocess.Popen([sys.executable, "-c",
        f"open('{out}/cgroup.procs', 'w').write('0')\\nimport time\\nt = time.monotonic() + 10\\n"
        "while time.monotonic() < t: pass"]) for _ in range(os.cpu_count() or 2)]
while time.monotonic() < stop and guard.policy.reliefs == 0:
    time.sleep(0.1)
guarded_from = open(f"/proc/self/task/{guard.native_id}/cgroup").read()
guard.stop()
guard.join()  # its window's write and log done
idle = open(f"{group}/cpu.idle").read().strip()
for h in hogs:
    h.kill()
print(json.dumps({"group": str(group), "own": open("/proc/self/cgroup").read(), "child": inherited,
                  "guard": guarded_from,
                  "reliefs": guard.policy.reliefs, "least_cores": min(w.cores for w in windows), "idle": idle,
                  "windows": [[w.idle, w.relieved] for w in windows]}))
"""


@needs_cgroups
def test_a_starved_group_is_relieved_by_its_guard() -> None:
    assert REAL is not None
    name = f"notify-test-{uuid.uuid4().hex[:8]}"
    group = REAL.group(name)
    try:
        done = subprocess.run([sys.executable, "-c", STARVING, name, str(REAL.own_dir())], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-3000:]
        got = json.loads(done.stdout)
        path = "/" + (f"{REAL.own}/{name}" if REAL.own else name)
        assert got["group"] == str(group)
        assert any(line.endswith(":" + path) for line in got["own"].splitlines()), got["own"]
        assert any(line.endswith(":" + path) for line in got["child"].splitlines()), got["child"]  # inherited
        if REAL.version == 1:  # the guard's own thread left the group: it is not starved with it
            assert not any(line.endswith(":" + path) for line in got["guard"].splitlines()), got["guard"]
        assert got["reliefs"] == 1 and got["idle"] == "0", done.stderr[-2000:]
        *before, last = got["windows"]  # what a metric is told: idle until the window that relieved it
        assert before and all(w == [True, False] for w in before) and last == [False, True], got["windows"]
        assert got["least_cores"] < 0.05  # what the guard measured: the spinning thread all but stopped
        assert STARVED in done.stderr
    finally:
        if group.exists():
            group.rmdir()
