"""The README's walk-throughs run as written: every shell block of "A session by hand" and of
"The HTTP API", in order, in one shell, against the real broker, job, senders and API they start
themselves, in a throwaway data directory. Only what the README says are the defaults is moved
(the data directory and the checkpoints, the broker's and the REST API's ports through the
``DEDUP_*`` variables it names, the API's port 8080 in the text); everything else is the README's
own text. Each command must succeed, and each answer the README shows under a command (``# {...}``)
must match what came back. Then the SMS of the walk-through is in the outbox, one file, and its
status is sent with the outbox's id as its provider reference."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.ports import free_port
from senders.statuses import DeliveryStatus
from senders.store.status import open_store
from settings import REPO_ROOT
from tests.readme_blocks import MORE, Step, mismatches, parse_answer, steps, walkthrough_blocks

MARK = "@@readme-step"
#: the walk-throughs start a broker and the job twice: minutes on a busy 2-core machine
TIMEOUT_S = 1200


def localised(block: str, data_dir: Path, api_port: int) -> str:
    """The README's text with its default places moved: ``.data/`` (the data directory) and the
    API's port 8080."""
    return block.replace(".data/", f"{data_dir}/").replace("8080", str(api_port))


def script(all_steps: list[Step]) -> str:
    """One shell: each command, then a line with its number and exit status; the first failing
    command ends it."""
    lines = []
    for n, step in enumerate(all_steps):
        lines += [step.command, f"__rc=$?; printf '\\n{MARK} {n} %d\\n' \"$__rc\"; [ \"$__rc\" = 0 ] || exit 90"]
    return "\n".join(lines) + "\n"


def outputs(stdout: str) -> list[tuple[str, int]]:
    """(output, exit status) of each command that ran, in order."""
    out, start = [], 0
    for mark in re.finditer(rf"\n{MARK} (\d+) (\d+)\n", stdout):
        assert int(mark.group(1)) == len(out)
        out.append((stdout[start:mark.start()].strip("\n"), int(mark.group(2))))
        start = mark.end()
    return out


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(none)"


def test_the_answers_shown_are_matched_member_by_member() -> None:
    pattern = parse_answer('{"id": "n_...", "queued": ["sms"], "channels": {"sms": {"status": "sent", ...}}, ...}')
    assert MORE in pattern and MORE in pattern["channels"]["sms"]
    good = {"id": "n_5f0c", "queued": ["sms"], "channels": {"sms": {"status": "sent", "attempts": 1}}, "x": 1}
    assert mismatches(pattern, good) == []
    assert mismatches(pattern, {**good, "id": "m_5f0c"}) == ["id: 'm_5f0c', shown as 'n_...'"]
    assert mismatches(pattern, {**good, "queued": ["sms", "push"]}) == ["queued: 1 items shown, ['sms', 'push'] given"]
    assert mismatches(pattern, {**good, "channels": {"sms": {"status": "pending"}}}) == [
        "channels.sms.status: 'pending', shown as 'sent'"]
    exact = parse_answer('{"status": "ok", "checks": {"kafka": "ok"}}')
    assert mismatches(exact, {"status": "ok", "checks": {"kafka": "ok", "store": "ok"}}) == [
        "checks: 'store' is not shown in the README"]
    assert mismatches(parse_answer('{"n": 1}'), {"n": True}) == ["n: True, shown as 1"]
    assert parse_answer('{"text": "a ... b"}') == {"text": "a ... b"}  # inside a string: a wildcard, not a member


def test_a_blocks_answers_belong_to_the_command_above_them() -> None:
    block = (
        "# words before a command\n"
        "curl -s localhost:8080/a \\\n  -d '{}'\n"
        '# {"id": "n_...",\n'
        '#  "queued": ["sms"]}\n'
        "# more words\n"
        "dedupctl run > .data/job.log 2>&1 &   # the job\n"
        "\n"
        "# {\"not\": \"an answer: under a comment\"}\n"
        "ls\n"
    )
    found = steps(block)
    assert [s.command for s in found] == [
        "curl -s localhost:8080/a \\\n  -d '{}'", "dedupctl run > .data/job.log 2>&1 &   # the job", "ls"]
    assert found[0].expected == {"id": "n_...", "queued": ["sms"]}
    assert found[1].expected is None and found[2].expected is None
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    shown = [s for b in walkthrough_blocks(readme) for s in steps(b) if s.expected is not None]
    assert len(shown) >= 7  # consume, readyz, two profile writes, send, status, outbox


@pytest.mark.integration
def test_the_readmes_walk_throughs_run_as_written_and_the_sms_lands_in_the_outbox(tmp_path: Path) -> None:
    data = tmp_path / "data"
    api_port = free_port()
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    all_steps = [s for block in walkthrough_blocks(readme) for s in steps(localised(block, data, api_port))]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEDUP_")}
    kafka_port = free_port()
    env.update({  # the defaults the README names, moved
        "DEDUP_DATA_DIR": str(data),
        "DEDUP_FLINK_CHECKPOINT_DIR": str(data / "checkpoints"),
        "DEDUP_KAFKA_LOCAL_PORT": str(kafka_port),
        "DEDUP_KAFKA_LOCAL_CONTROLLER_PORT": str(free_port()),
        "DEDUP_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{kafka_port}",
        "DEDUP_FLINK_REST_PORT": str(free_port()),
        "PYTHONUNBUFFERED": "1",
    })
    (tmp_path / "walkthrough.sh").write_text(script(all_steps), encoding="utf-8")
    stdout_path, stderr_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        shell = subprocess.Popen(["bash", "--noprofile", "--norc", str(tmp_path / "walkthrough.sh")],
                                 cwd=REPO_ROOT, env=env, stdout=out, stderr=err, start_new_session=True)
        try:
            shell.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if shell.poll() is None:
                os.killpg(shell.pid, signal.SIGTERM)
                time.sleep(5)
                if shell.poll() is None:
                    os.killpg(shell.pid, signal.SIGKILL)
                shell.wait(30)
            subprocess.run([str(REPO_ROOT / ".venv" / "bin" / "dedupctl"), "kafka", "stop"], cwd=REPO_ROOT, env=env,
                           capture_output=True, timeout=120)
    ran = outputs(stdout_path.read_text(encoding="utf-8", errors="replace"))
    logs = "\n".join(f"--- {p.name}:\n{_tail(p)}" for p in sorted(data.glob("*.log")))
    story = f"stderr:\n{_tail(stderr_path)}\n{logs}"
    assert len(ran) == len(all_steps) and all(rc == 0 for _, rc in ran), (
        f"ran {len(ran)} of {len(all_steps)} commands; the last: {all_steps[len(ran) - 1 if ran else 0].command!r}"
        f" -> {ran[-1] if ran else None}; the next: "
        f"{all_steps[len(ran)].command if len(ran) < len(all_steps) else None!r}\n{story}")
    for step, (output, _) in zip(all_steps, ran, strict=True):
        if step.expected is None:
            continue
        try:
            answer = json.loads(output)
        except ValueError:
            pytest.fail(f"{step.command!r} answered {output[:2000]!r}, not the JSON the README shows\n{story}")
        assert mismatches(step.expected, answer) == [], (step.command, step.shown, answer)

    # the notification reached `sent` on the channel with an address, and the outbox has its file
    files = {c: sorted((data / "outbox" / c).glob("*.json")) for c in ("push", "sms", "email")}
    assert [len(f) for f in files.values()] == [0, 1, 0], files
    record = json.loads(files["sms"][0].read_text(encoding="utf-8"))
    assert record["message_key"].startswith("shop/evt-2:sms:") and record["to"] == "+8801711000001"
    store = open_store(str(data / "senders" / "status.sqlite3"))
    try:
        row = store.get(record["message_key"])
    finally:
        store.close()
    assert row is not None and (row.status, row.provider, row.provider_ref) == (
        DeliveryStatus.SENT, "outbox", record["id"])
