"""A throughput service in a CPU-idle control group, with a guard against its starvation.

``flink.nice`` and ``senders.nice`` lower the job and the senders inside the scheduler's fair
share; a control group with ``cpu.idle`` set (Linux 5.15+, cgroup v1's ``cpu`` controller or
v2's) takes them out of it: the scheduler runs the group's threads only when nothing else wants
the core, and a waking API or broker thread preempts them at once instead of waiting for their
turn to end. systemd's ``CPUWeight=idle`` sets the same on a unit; ``flink.cpu_idle`` and
``senders.cpu_idle`` do it for the processes ``dedupctl run`` and ``dedupctl senders run`` start
on a host without such a unit. Both join one group, ``IDLE_GROUP``, below the process's own
group in the ``cpu`` hierarchy, created if missing. It needs write access to that hierarchy
(root, or a delegated subtree); refused, the service runs on where it was and its log says why.
``cpu.idle`` ranks a group against its siblings only, so this yields to the API and the broker
when they run in the same group as the process (the root on a host where nothing else sorts
services into groups, as here); where each service has a group of its own (systemd with CPU
accounting), the unit's ``CPUWeight=idle`` is the way.

An idle group gets the CPU nobody else wants, and on a host whose API and broker want all of it,
next to none: its checkpoints, transactions and Kafka sessions would time out. ``IdleGuard`` is
a thread in each process of the group that reads, every ``window_s``, what the group's threads
ran and how long they waited on a run queue: when the group ran under ``min_cores`` while its
threads waited, for ``starved_s``, it clears ``cpu.idle`` for ``relief_s`` (the group then
competes at its weight, as with ``nice`` alone), and sets it again after. The job's and the
senders' deadlines are tens of seconds (a checkpoint 120 s, a consumer's session 45 s); the guard
acts at 5 s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

IDLE_GROUP = "notify-batch"
#: how the guard's log says it cleared ``cpu.idle`` (``bench.slo`` counts the lines)
STARVED = "the CPU-idle group was starved"
MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class CpuHierarchy:
    """Where this process sits in the hierarchy that holds the ``cpu`` controller.

    :param mount: the hierarchy's mount point
    :param own: the process's group in it, relative to the mount (``""``: its root)
    :param version: 1 or 2"""

    mount: Path
    own: str
    version: int

    def group(self, name: str) -> Path:
        return self.own_dir() / name

    def own_dir(self) -> Path:
        return self.mount / self.own if self.own else self.mount


def find_hierarchy(mountinfo: str, proc_cgroup: str) -> CpuHierarchy | None:
    """The ``cpu`` controller's hierarchy from ``/proc/self/mountinfo`` and ``/proc/self/cgroup``:
    a v1 mount whose options name ``cpu`` first (a hybrid host binds the controller there), else
    the v2 mount; None without either. A mount's root (a cgroup namespace's or a container's
    bind mount) is taken off the process's path."""
    v1: tuple[Path, str] | None = None
    v2: tuple[Path, str] | None = None
    for line in mountinfo.splitlines():
        pre, sep, post = line.partition(" - ")
        if not sep:
            continue
        fields, after = pre.split(), post.split()
        if len(fields) < 5 or len(after) < 3:
            continue
        root, mount, fstype, options = fields[3], fields[4], after[0], after[2].split(",")
        if fstype == "cgroup" and "cpu" in options and v1 is None:
            v1 = (Path(mount), root)
        elif fstype == "cgroup2" and v2 is None:
            v2 = (Path(mount), root)
    for line in proc_cgroup.splitlines():
        hierarchy_id, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if v1 is not None and "cpu" in controllers.split(","):
            return CpuHierarchy(v1[0], _relative(path, v1[1]), 1)
        if v1 is None and v2 is not None and hierarchy_id == "0" and controllers == "":
            return CpuHierarchy(v2[0], _relative(path, v2[1]), 2)
    return None


def _relative(path: str, root: str) -> str:
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    return path.strip("/")


def current_hierarchy(pid: int | str = "self") -> CpuHierarchy | None:
    """A process's place (this one's by default) in the ``cpu`` controller's hierarchy; None
    where it has none, or is gone."""
    try:
        return find_hierarchy(MOUNTINFO.read_text(), Path(f"/proc/{pid}/cgroup").read_text())
    except OSError:
        return None


def join_idle_group(name: str = IDLE_GROUP, *, hierarchy: CpuHierarchy | None = None) -> Path | None:
    """Move this process (and so what it starts from now on) into the idle group ``name``, made
    if missing; returns the group's directory, or None (logged) where the host refuses."""
    if hierarchy is None:
        hierarchy = current_hierarchy()
    if hierarchy is None:
        logger.warning("the process stays in its CPU group: no cgroup hierarchy holds the cpu controller")
        return None
    group = hierarchy.group(name)
    try:
        if hierarchy.version == 2:
            _enable_cpu_below(hierarchy.own_dir())
        group.mkdir(exist_ok=True)
        (group / "cpu.idle").write_text("1")
        (group / "cgroup.procs").write_text("0")  # 0: the writing process
    except OSError as exc:
        logger.warning(
            "the process stays in its CPU group (%s: %s); on systemd, CPUWeight=idle on its unit does the same",
            group, exc.strerror or exc,
        )
        return None
    return group


def _enable_cpu_below(own: Path) -> None:
    control = own / "cgroup.subtree_control"
    if "cpu" not in control.read_text().split():
        control.write_text("+cpu")


@dataclass(frozen=True)
class GuardOptions:
    """:param window_s: the guard reads the group's threads' scheduler times this often
    :param min_cores: the group is starved when it ran less than this many cores ...
    :param min_waiting: ... while its threads waited on a run queue at least this many
        thread-seconds a second ...
    :param starved_s: ... for this long; then ``cpu.idle`` is cleared
    :param relief_s: for this long after the group's last starved window"""

    window_s: float = 1.0
    min_cores: float = 0.05
    min_waiting: float = 0.5
    starved_s: float = 5.0
    relief_s: float = 30.0


#: a thread's time on a CPU and waiting on a run queue, in ns (``/proc/<tid>/schedstat``)
Times = dict[int, tuple[int, int]]


def usage(before: Times, after: Times, seconds: float) -> tuple[float, float]:
    """Cores the group ran and thread-seconds a second it waited runnable between two readings,
    over the threads present in both (a thread started or gone in between counts from the next)."""
    ran = waited = 0
    for tid, (run_ns, wait_ns) in after.items():
        if tid in before:
            ran += run_ns - before[tid][0]
            waited += wait_ns - before[tid][1]
    scale = 1e9 * max(seconds, 1e-9)
    return ran / scale, waited / scale


@dataclass(frozen=True)
class GuardWindow:
    """What the guard read in one window, for a metric.

    :param cores: cores the group ran
    :param waiting: thread-seconds a second its threads waited on a run queue
    :param idle: whether the group is idle after the window
    :param relieved: whether the window began a relief"""

    cores: float
    waiting: float
    idle: bool
    relieved: bool


class GuardPolicy:
    """Whether the group should be idle, from what it ran and waited in each window."""

    def __init__(self, options: GuardOptions) -> None:
        self.options = options
        self.starved_since: float | None = None
        self.relieved_until: float | None = None
        self.reliefs = 0

    def idle_after(self, now: float, cores: float, waiting: float) -> bool:
        o = self.options
        if cores < o.min_cores and waiting >= o.min_waiting:
            if self.starved_since is None:
                self.starved_since = now - o.window_s  # the window just read was starved throughout
            if now - self.starved_since >= o.starved_s:
                if self.relieved_until is None:
                    self.reliefs += 1
                self.relieved_until = now + o.relief_s
        else:
            self.starved_since = None
        if self.relieved_until is not None and now >= self.relieved_until:
            self.relieved_until = None
        return self.relieved_until is None


class IdleGuard(threading.Thread):
    """Keeps the group's ``cpu.idle`` as ``GuardPolicy`` decides, from its threads' scheduler
    times; a daemon thread of each process in the group, itself outside it where the hierarchy
    allows (v1). A light thread that sleeps is woken in time in a starved group beside a busy
    loop on each core (10 ms late at worst), but not under a full ``make test``, and a starved
    group's own lateness says nothing anyway: the guard reads what the group's threads ran and
    waited."""

    def __init__(self, group: Path, options: GuardOptions = GuardOptions(),
                 observer: Callable[[GuardWindow], None] | None = None) -> None:
        super().__init__(name="cpu-idle-guard", daemon=True)
        self.group = group
        self.policy = GuardPolicy(options)
        self.observer = observer
        self.stopping = threading.Event()

    def run(self) -> None:
        self._leave_group()
        idle = True
        before, then = self.times(), time.monotonic()
        while not self.stopping.wait(self.policy.options.window_s):
            after, now = self.times(), time.monotonic()
            cores, waiting = usage(before, after, now - then)
            before, then = after, now
            reliefs = self.policy.reliefs
            if not self.policy.idle_after(now, cores, waiting):
                # a relief wins over another process's guard setting the group idle again
                if self._read() != "0" and self._write("0") and idle:
                    logger.warning("%s (%.3f cores, %.1f threads waiting, for %.0f s): it competes at its weight "
                                   "for %.0f s", STARVED, cores, waiting, self.policy.options.starved_s,
                                   self.policy.options.relief_s)
                idle = False
            elif not idle and self._write("1"):
                idle = True
                logger.info("the CPU-idle group is idle again")
            if self.observer is not None:
                self.observer(GuardWindow(cores, waiting, idle, self.policy.reliefs > reliefs))

    def _leave_group(self) -> None:
        """Move this thread back to the group the process came from, so that the guard is not
        starved with what it guards (a full make test once kept it from acting for 12 s). Only
        cgroup v1 moves a single thread (its ``tasks``); on v2 the guard stays in the group."""
        listing = self.group.parent / "tasks"
        if not (self.group / "tasks").exists():
            return
        try:
            listing.write_text(str(threading.get_native_id()))
        except OSError as exc:
            logger.info("the CPU-idle group's guard stays in the group (%s)", exc)

    def times(self) -> Times:
        """Each of the group's threads' scheduler times (v1 lists them in ``tasks``, v2 in
        ``cgroup.threads``)."""
        listing = self.group / "tasks"
        if not listing.exists():
            listing = self.group / "cgroup.threads"
        got: Times = {}
        try:
            tids = [int(t) for t in listing.read_text().split()]
        except OSError:
            return got
        for tid in tids:
            try:
                run_ns, wait_ns, _ = Path(f"/proc/{tid}/schedstat").read_text().split()
            except (OSError, ValueError):
                continue  # gone since the listing
            got[tid] = (int(run_ns), int(wait_ns))
        return got

    def _read(self) -> str:
        try:
            return (self.group / "cpu.idle").read_text().strip()
        except OSError:
            return ""

    def _write(self, value: str) -> bool:
        try:
            (self.group / "cpu.idle").write_text(value)
        except OSError as exc:
            logger.warning("the CPU-idle group's cpu.idle stays as it was: %s", exc)
            return False
        return True

    def stop(self) -> None:
        self.stopping.set()


def run_cpu_idle(name: str = IDLE_GROUP, options: GuardOptions = GuardOptions(),
                 observer: Callable[[GuardWindow], None] | None = None) -> str:
    """Join the idle group (every thread of the process, and what it starts from now on) and
    start its guard, which hands each window to ``observer``; says what was done, for the log.
    Never raises."""
    group = join_idle_group(name)
    if group is None:
        return "not in a CPU-idle group (see the warning above)"
    IdleGuard(group, options, observer=observer).start()
    return (f"in the CPU-idle group {group}, its guard clearing cpu.idle when the group ran under"
            f" {options.min_cores:g} cores for {options.starved_s:g} s with threads waiting")
