"""A standalone Flink cluster from the PyPI distribution's own scripts, for fault injection.

JobManager and TaskManager run as separate processes (``bin/jobmanager.sh``,
``bin/taskmanager.sh`` of the installed ``pyflink``), with a lib/ of the distribution's jars plus
``flink-python`` and the connector jars, and the job is submitted with ``flink run -py``. A
TaskManager killed with SIGKILL is replaced by a new one; the JobManager restores the job from
its latest checkpoint by itself.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from operators.errors import DedupError
from ops.flink_rest import RestClient
from settings import REPO_ROOT, Settings, flink_conf

FLINK_HOME = flink_conf.pyflink_home()


class ClusterError(DedupError):
    """The local standalone cluster could not be started, used or stopped."""


@dataclass
class LocalCluster:
    """A JobManager and TaskManagers under ``home``, REST on ``rest_port``.

    :param slots: task slots of each TaskManager
    :param settings: the job's settings, which its config.yaml states too (settings/flink_conf.py)
    """

    home: Path
    rest_port: int
    rpc_port: int
    slots: int = 2
    settings: Settings = field(default_factory=Settings)

    @property
    def rest(self) -> RestClient:
        return RestClient(f"http://127.0.0.1:{self.rest_port}")

    def _env(self) -> dict[str, str]:
        site = [p for p in sys.path if p.endswith("site-packages")]
        return {
            **os.environ,
            "FLINK_HOME": str(FLINK_HOME),
            "FLINK_CONF_DIR": str(self.home / "conf"),
            "FLINK_LIB_DIR": str(self.home / "lib"),
            "FLINK_LOG_DIR": str(self.home / "log"),
            "FLINK_PID_DIR": str(self.home / "pids"),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            # thread mode: the TaskManager's embedded Python must find pemja, pyflink and the job
            "PYTHONPATH": os.pathsep.join([*site, str(REPO_ROOT)]),
            # the connector jars are in lib/: the job must not ship them again
            "DEDUP_JARS_DIR": str(self.home / "no-jars"),
        }

    def _layout(self) -> None:
        lib = self.home / "lib"
        lib.mkdir(parents=True, exist_ok=True)
        (self.home / "log").mkdir(exist_ok=True)  # the scripts do not create it, and fail quietly
        (self.home / "pids").mkdir(exist_ok=True)
        jars = [*(FLINK_HOME / "lib").glob("*.jar"), *(FLINK_HOME / "opt").glob("flink-python-*.jar"),
                *(REPO_ROOT / ".cache" / "jars" / "flink").glob("*.jar")]
        for jar in jars:
            link = lib / jar.name
            if not link.exists():
                link.symlink_to(jar)
        conf = self.home / "conf"
        conf.mkdir(exist_ok=True)
        for name in ("log4j.properties", "log4j-cli.properties", "log4j-console.properties"):
            src = FLINK_HOME / "conf" / name
            if src.exists():
                (conf / name).write_text(src.read_text())
        settings = flink_conf.standalone(
            self.settings, rest_port=self.rest_port, rpc_port=self.rpc_port, slots=self.slots,
            java_opts=flink_conf.distribution_java_opts(FLINK_HOME),
        )
        (conf / "config.yaml").write_text("".join(f"{k}: {flink_conf.yaml_scalar(v)}\n" for k, v in settings.items()))
        (conf / "workers").write_text("127.0.0.1\n")
        (conf / "masters").write_text(f"127.0.0.1:{self.rest_port}\n")

    def _script(self, *args: str) -> str:
        result = subprocess.run([str(FLINK_HOME / "bin" / args[0]), *args[1:]], env=self._env(),
                                capture_output=True, text=True, timeout=180)
        if result.returncode != 0:
            raise ClusterError(f"{' '.join(args)}: {result.stdout[-2000:]} {result.stderr[-2000:]}")
        return result.stdout

    def foreground(self, role: str) -> tuple[list[str], dict[str, str]]:
        """Command and environment of a JobManager or TaskManager that stays in the foreground,
        for a supervisor that owns its process (the benchmark measures its CPU and memory)."""
        self._layout()
        script = {"jobmanager": "jobmanager.sh", "taskmanager": "taskmanager.sh"}[role]
        return [str(FLINK_HOME / "bin" / script), "start-foreground"], self._env()

    def start(self, taskmanagers: int = 1, timeout_s: float = 120.0) -> None:
        self._layout()
        self._script("jobmanager.sh", "start")
        for _ in range(taskmanagers):
            self._script("taskmanager.sh", "start")
        self.wait_taskmanagers(taskmanagers, timeout_s)

    def wait_taskmanagers(self, count: int, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.rest_port}/overview", timeout=5) as r:
                    if json.loads(r.read())["taskmanagers"] >= count:
                        return
            except OSError:
                pass
            time.sleep(1)
        raise ClusterError(f"fewer than {count} TaskManagers registered after {timeout_s:.0f} s")

    def taskmanager_pids(self) -> list[int]:
        pid_files = list((self.home / "pids").glob("*taskexecutor.pid"))
        pids: list[int] = []
        for f in pid_files:
            pids += [int(x) for x in f.read_text().split() if x.strip().isdigit()]
        return pids

    def kill_taskmanager(self) -> int:
        """SIGKILL a TaskManager and start a replacement; returns the killed pid."""
        pids = [p for p in self.taskmanager_pids() if _alive(p)]
        if not pids:
            raise ClusterError("no live TaskManager to kill")
        os.kill(pids[0], signal.SIGKILL)
        for f in (self.home / "pids").glob("*taskexecutor.pid"):  # forget the dead one
            f.write_text("".join(f"{p}\n" for p in self.taskmanager_pids() if p != pids[0]))
        self._script("taskmanager.sh", "start")
        return pids[0]

    def submit(self, config_file: Path, parallelism: int, savepoint: str | None = None) -> str:
        """``flink run -py jobs/dedup_job.py``, detached; returns the job id."""
        args = ["flink", "run", "-m", f"127.0.0.1:{self.rest_port}", "-d", "-p", str(parallelism)]
        if savepoint:
            args += ["-s", savepoint]
        args += ["-py", str(REPO_ROOT / "jobs" / "dedup_job.py"), "-pyexec", sys.executable,
                 "-pyclientexec", sys.executable, "--config", str(config_file)]
        out = self._script(*args)
        match = re.search(r"JobID ([0-9a-f]{32})", out)
        if not match:
            raise ClusterError(f"no job id in the output of flink run: {out[-2000:]}")
        return match.group(1)

    def stop(self) -> None:
        for script in (("taskmanager.sh", "stop-all"), ("jobmanager.sh", "stop-all")):
            try:
                self._script(*script)
            except (ClusterError, subprocess.TimeoutExpired):
                pass
        for pid in self.taskmanager_pids():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
