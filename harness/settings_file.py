"""Settings as a TOML file, for a process started with ``dedupctl --config`` (tests, benchmarks)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, SecretStr

from settings import Settings


def _value(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return repr(value)
    text = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
    return json.dumps(text)


def _table(header: str, part: BaseModel, lines: list[str]) -> None:
    """``[header]`` with the model's values, then its own tables (``[senders.fcm]``)."""
    lines.append(f"[{header}]")
    tables: list[tuple[str, BaseModel]] = []
    for name in type(part).model_fields:
        value = getattr(part, name)
        if isinstance(value, BaseModel):
            tables.append((name, value))
        elif value is not None:
            lines.append(f"{name} = {_value(value)}")
    for name, table in tables:
        _table(f"{header}.{name}", table, lines)


def write_settings(cfg: Settings, path: Path) -> Path:
    """Every section of ``cfg`` as a TOML file, for ``dedupctl --config`` (secrets in the clear)."""
    lines: list[str] = [f"data_dir = {json.dumps(cfg.data_dir)}"]
    for section in ("kafka", "topics", "dedup", "flink", "senders", "api", "telemetry"):
        part = getattr(cfg, section)
        if section == "topics":
            lines.append(f"[{section}]")
            lines += [f"{name} = {_value(value)}" for name, value in part.by_role().items() if value is not None]
        else:
            _table(section, part, lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
