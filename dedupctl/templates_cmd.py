"""``dedupctl templates check DIR``: validate a templates directory and show what each version needs."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from senders.templates.catalog import scan
from senders.templates.options import TemplateOptions
from settings import Settings


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")


def cmd_templates_check(cfg: Settings, args: argparse.Namespace) -> int:
    defaults = TemplateOptions()
    options = TemplateOptions(directory=args.directory or defaults.directory, default_locale=args.default_locale)
    root = Path(options.directory)
    templates, problems = scan(root, options)
    if not templates and not problems:
        problems = [f"{root}: no templates (one directory per template)"]
    versions = 0
    for template in templates.values():
        flags = ", one-time code" if template.one_time_code else ""
        _out(f"{template.name}: {template.kind.value}{flags}, channels {', '.join(c.value for c in template.channels)}")
        for version in template.versions:
            versions += 1
            published = datetime.fromtimestamp(version.published_at_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            needs = ", ".join(sorted(version.parameters)) or "no parameters"
            _out(f"  v{version.number} published {published}: locales {', '.join(version.locales)}; needs {needs}")
    for problem in problems:
        sys.stderr.write(f"error: {problem}\n")
    verdict = f"{len(problems)} problem(s)" if problems else "ok"
    _out(f"{len(templates)} template(s), {versions} version(s): {verdict}")
    return 1 if problems else 0


def register(subparsers: Any) -> None:
    """Add ``templates`` to the ``dedupctl`` parser."""
    p = subparsers.add_parser("templates", help="message templates")
    sub = p.add_subparsers(dest="templates_command", required=True)
    q = sub.add_parser("check", help="validate every template and print what each version needs")
    q.add_argument("directory", nargs="?", help=f"templates directory (default: {TemplateOptions().directory})")
    q.add_argument("--default-locale", default=TemplateOptions().default_locale,
                   help="the locale every version must have (default: %(default)s)")
    q.set_defaults(func=cmd_templates_check)
