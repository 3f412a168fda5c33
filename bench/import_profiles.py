"""Profiles/s of ``dedupctl users import``: ``python -m bench.import_profiles [--lines 200000]``.

A file of ``--lines`` profiles (an address on every channel each, as ``bench.senders`` imports
them) imported into a fresh SQLite store and a fresh PostgreSQL database (a local server started
here, or ``--postgres``), then imported again (every profile replaced), each by the command
itself in its own process; the wall time of each, and what 50 million profiles would take at
that rate. Results: ``bench/results/profiles-import-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.measure import git_info, machine_info
from bench.senders_load import write_profiles
from harness.local_postgres import LocalPostgres
from harness.ports import free_port
from senders.profiles.crypto import generate_key
from settings import REPO_ROOT

DESIGN_USERS = 50_000_000


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _import(config: Path, source: Path, batch_size: int) -> dict[str, Any]:
    """One import by the command, timed: wall clock, and the CPU of its process (on a shared
    machine the CPU says what the command costs; the wall clock also says how busy the machine was)."""
    cpu0 = _children_cpu_s()
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "dedupctl.cli", "--config", str(config), "users", "import", str(source),
         "--batch-size", str(batch_size), "--progress-seconds", "0", "--progress-every", "0"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=7200,
    )
    seconds = time.monotonic() - started
    cpu_s = _children_cpu_s() - cpu0
    found = re.search(r"imported (\d+) profile", done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"users import failed ({done.returncode}): {done.stdout[-500:]} {done.stderr[-1500:]}")
    imported = int(found.group(1))
    rate = imported / seconds
    return {"profiles": imported, "seconds": round(seconds, 2), "profiles_per_s": round(rate, 1),
            "hours_for_50_million": round(DESIGN_USERS / rate / 3600, 2), "command_cpu_s": round(cpu_s, 2),
            "profiles_per_cpu_s": round(imported / cpu_s, 1) if cpu_s > 0 else None,
            "summary": done.stdout.strip()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.import_profiles", description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--stores", default="sqlite,postgresql")
    parser.add_argument("--postgres", help="a running server's DSN (one that may create databases)")
    parser.add_argument("--out", default=str(REPO_ROOT / "bench" / "results"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-import-"))
    keys = (generate_key(), generate_key())
    server: LocalPostgres | None = None
    results: list[dict[str, Any]] = []
    started = dt.datetime.now(dt.UTC)
    machine, git = machine_info(), git_info(REPO_ROOT)  # as it starts: the load, the code it ran
    try:
        source = write_profiles(work / "profiles.jsonl", args.lines)
        for store in args.stores.split(","):
            if store == "postgresql":
                dsn = args.postgres
                if dsn is None:
                    server = LocalPostgres(port=free_port()).start()
                    dsn = server.dsn
                name = f"import_{os.getpid()}"
                import psycopg

                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "{name}"')
                location = dsn.rsplit("/", 1)[0] + f"/{name}"
            else:
                location = str(work / "status.sqlite3")
            config = work / f"{store}.toml"
            config.write_text(f'data_dir = "{work}"\n[senders]\nstatus_store = "{location}"\n'
                              f'contact_encryption_keys = "{keys[0]}"\ncontact_lookup_keys = "{keys[1]}"\n')
            for attempt in ("new", "replacing"):
                figure = {"store": store, "import": attempt, **_import(config, source, args.batch_size)}
                results.append(figure)
                print(f"{store:<10} {attempt:<9} {figure['profiles']:,} profiles in {figure['seconds']} s:"
                      f" {figure['profiles_per_s']:,.0f}/s, 50 million in {figure['hours_for_50_million']} h;"
                      f" the command's CPU {figure['command_cpu_s']} s ({figure['profiles_per_cpu_s']:,.0f}"
                      " profiles per CPU second)", flush=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out) / f"profiles-import-{started.date().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "date": started.isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", "bench.import_profiles", *(argv if argv is not None else sys.argv[1:])]),
        "lines": args.lines, "batch_size": args.batch_size, "profile": "an address on each of push, sms, email",
        "machine": {**machine, "loadavg_at_end": os.getloadavg()}, "git": git,
        "results": results,
    }, indent=1) + "\n", encoding="utf-8")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
