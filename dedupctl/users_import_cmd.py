"""``dedupctl users import FILE|-``: bulk profiles from JSON lines (``senders.profiles.importer``).

Exit status: 0 when every line was imported (blank lines are skipped), 1 when some lines were
bad (each reported on stderr by its number; every other line was imported), 2 when the import
could not run or stopped (unreadable file, settings, the store unavailable: then it says up to
which line it got; importing again is safe, a line replaces its user's profile).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, BinaryIO

from senders.profiles.importer import (
    BadLine,
    ImportOptions,
    ImportStats,
    import_profiles,
    max_line_bytes,
    read_lines,
)
from senders.runtime.pool import open_profile_store, open_status_store
from settings import Settings


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def cmd_users_import(cfg: Settings, args: argparse.Namespace) -> int:
    name = "stdin" if args.file == "-" else args.file
    options = ImportOptions(
        batch_size=args.batch_size,
        max_user_id_bytes=cfg.dedup.max_field_bytes,
        progress_lines=args.progress_every,
        progress_s=args.progress_seconds,
    )
    try:
        source: BinaryIO = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")
    except OSError as exc:
        _err(f"dedupctl users import: cannot read {args.file}: {exc.strerror}")
        return 2
    store = open_status_store(cfg)
    try:
        profiles = open_profile_store(cfg, store)
        with source:
            stats = import_profiles(
                read_lines(source, max_line_bytes(options.max_user_id_bytes)),
                profiles,
                options,
                on_bad=lambda bad: _bad(name, bad),
                on_progress=lambda s: _err(f"dedupctl users import: {s.progress()}"),
            )
    finally:
        store.close()
    sys.stdout.write(_summary(name, stats) + "\n")
    return 1 if stats.bad else 0


def _bad(name: str, bad: BadLine) -> None:
    _err(f"{name}:{bad.number}: {bad.problem}")  # the problem only: a line can hold contacts


def _summary(name: str, stats: ImportStats) -> str:
    elapsed = stats.elapsed_s()
    rate = stats.imported / elapsed if elapsed > 0 else 0.0
    return (
        f"imported {stats.imported} profile(s) from {name}, {stats.bad} bad line(s)"
        f" ({stats.read} lines in {elapsed:.1f} s, {rate:,.0f} profiles/s)"
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def register(sub: Any) -> None:
    """Add ``users import`` to the ``users`` subcommands."""
    q = sub.add_parser(
        "import",
        help="import profiles from JSON lines ({\"user_id\": ..., <profile>}); bad lines are reported by number"
        " and skipped (exit 1 when there were any, 2 when the import could not run)",
    )
    q.add_argument("file", help="the JSON lines file, or - for stdin")
    q.add_argument("--batch-size", type=_positive, default=1000, help="profiles per store transaction (1000)")
    q.add_argument("--progress-every", type=int, default=100_000, metavar="LINES",
                   help="report progress on stderr every this many lines (100000; 0: never by lines)")
    q.add_argument("--progress-seconds", type=float, default=10.0, metavar="S",
                   help="and at least this often (10; 0: never by time)")
    q.set_defaults(func=cmd_users_import)
