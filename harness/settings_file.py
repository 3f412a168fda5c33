"""Settings as a TOML file, for a process started with ``dedupctl --config`` (tests, benchmarks)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import SecretStr

from settings import Settings


def write_settings(cfg: Settings, path: Path) -> Path:
    """Every section of ``cfg`` as a TOML file, for ``dedupctl --config`` (secrets in the clear)."""
    lines: list[str] = [f"data_dir = {json.dumps(cfg.data_dir)}"]
    for section in ("kafka", "topics", "dedup", "senders", "api"):
        lines.append(f"[{section}]")
        part = getattr(cfg, section)
        if section == "topics":
            items = part.by_role().items()
        else:
            items = ((n, getattr(part, n)) for n in type(part).model_fields)
        for name, value in items:
            if value is None:
                continue
            if isinstance(value, bool):
                lines.append(f"{name} = {str(value).lower()}")
            elif isinstance(value, int | float):
                lines.append(f"{name} = {value!r}")
            else:
                text = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
                lines.append(f"{name} = {json.dumps(text)}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
