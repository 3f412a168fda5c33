"""ops.priority: a throughput service's CPU nice, and its session's autogroup when it leads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from operators.errors import ConfigError
from settings import REPO_ROOT, Settings

AUTOGROUP = Path("/proc/self/autogroup")
#: the nice values below are raised from 0, which a test run at a nice of its own could not see
pytestmark = pytest.mark.skipif(os.getpriority(os.PRIO_PROCESS, 0) != 0, reason="the tests run at a nice already")

PROBE = """
import json, os, sys
from ops import priority
said = getattr(priority, sys.argv[2])(int(sys.argv[1]))
child = os.popen("cat /proc/self/autogroup; echo; python3 -c 'import os; print(os.getpriority(os.PRIO_PROCESS, 0))'").read()
group = open("/proc/self/autogroup").read().strip() if os.path.exists("/proc/self/autogroup") else None
print(json.dumps({"said": said, "nice": os.getpriority(os.PRIO_PROCESS, 0), "group": group,
                  "child": child.split()}))
"""


def _probe(nice: int, *, new_session: bool, how: str = "yield_cpu") -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", PROBE, str(nice), how], cwd=REPO_ROOT, capture_output=True,
                          text=True, check=True, timeout=60, start_new_session=new_session)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.skipif(not AUTOGROUP.exists(), reason="no autogroups in this kernel")
def test_a_session_leader_runs_and_starts_its_children_at_the_nice_with_its_autogroup() -> None:
    got = _probe(10, new_session=True)
    assert got["nice"] == 10
    assert str(got["group"]).endswith("nice 10")
    assert got["said"] == "nice 10, its session's autogroup at nice 10"
    *group, nice = got["child"]  # what it starts inherits both
    assert nice == "10" and " ".join(group).endswith("nice 10")


def test_a_process_that_does_not_lead_its_session_leaves_the_autogroup_alone() -> None:
    before = AUTOGROUP.read_text().strip() if AUTOGROUP.exists() else None
    got = _probe(7, new_session=False)
    assert got["nice"] == 7 and got["said"] == "nice 7"
    assert got["group"] == before  # the session's group (this test's, and its shell's) as it was


def test_zero_leaves_the_priority_as_it_is() -> None:
    got = _probe(0, new_session=True)
    assert got["nice"] == 0 and got["said"] == "CPU priority unchanged"
    if got["group"] is not None:
        assert str(got["group"]).endswith("nice 0")


@pytest.mark.skipif(os.geteuid() != 0, reason="a nice below 0 needs root (CAP_SYS_NICE)")
def test_the_api_s_priority_may_be_raised_above_the_other_services_and_a_throughput_one_s_may_not() -> None:
    got = _probe(-5, new_session=True, how="set_cpu_priority")
    assert got["nice"] == -5 and got["said"] == "nice -5, its session's autogroup at nice -5"
    if got["group"] is not None:
        assert str(got["group"]).endswith("nice -5")
    *_, nice = got["child"]
    assert nice == "-5"
    assert _probe(-5, new_session=True)["said"] == "CPU priority unchanged"  # yield_cpu: 0 or more only


def test_a_refused_raise_leaves_the_priority_and_says_so() -> None:
    import ops.priority as priority

    if os.geteuid() == 0:
        pytest.skip("root may raise it")
    assert priority.set_cpu_priority(-5) == "already at nice 0"


def test_the_api_s_nice_takes_minus_20_to_19() -> None:
    assert Settings().with_overrides(api={"nice": -5}).api.nice == -5
    for wrong in (-21, 20):
        with pytest.raises(ConfigError, match="nice"):
            Settings().with_overrides(api={"nice": wrong})


def test_the_settings_take_0_to_19() -> None:
    cfg = Settings().with_overrides(senders={"nice": 19}, flink={"nice": 10})
    assert (cfg.senders.nice, cfg.flink.nice) == (19, 10)
    for section in ("senders", "flink"):
        with pytest.raises(ConfigError, match="nice"):
            Settings().with_overrides(**{section: {"nice": 20}})
        with pytest.raises(ConfigError, match="nice"):
            Settings().with_overrides(**{section: {"nice": -5}})
