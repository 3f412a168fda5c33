"""Where ``load_settings`` takes values from, besides the defaults: a TOML file (pydantic-settings'
``TomlConfigSettingsSource``) and ``DEDUP_<SECTION>_<FIELD>`` variables of a given mapping.

``Settings()`` alone is the defaults (and what it is given); only ``load_settings`` layers the file
and the environment under it, for the duration of one construction (a context variable says which
file and which mapping).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, TomlConfigSettingsSource

from settings.base import ENV_PREFIX
from settings.topics import topic_roles


@dataclass(frozen=True)
class Layers:
    """The file (if any) and the environment of one ``load_settings`` call."""

    file: Path | None
    env: Mapping[str, str]

    def where(self) -> str:
        """Where an unknown section can come from, for the error."""
        return str(self.file) if self.file is not None else "the environment"

    def sources(self, settings_cls: type[BaseSettings]) -> tuple[PydanticBaseSettingsSource, ...]:
        """Highest priority first: the environment, then the file."""
        env = EnvironmentSource(settings_cls, self.env)
        if self.file is None:
            return (env,)
        return env, TomlConfigSettingsSource(settings_cls, toml_file=self.file)


_LAYERS: ContextVar[Layers | None] = ContextVar("settings_layers", default=None)


def current_layers() -> Layers | None:
    return _LAYERS.get()


@contextmanager
def layered(layers: Layers) -> Iterator[None]:
    token = _LAYERS.set(layers)
    try:
        yield
    finally:
        _LAYERS.reset(token)


def _model(info: FieldInfo) -> type[BaseModel] | None:
    kind = info.annotation
    return kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None


def section_fields(settings_cls: type[BaseSettings]) -> dict[str, tuple[str, ...]]:
    """Section -> the names of its settings (the contract's roles for ``topics``); a table of a
    section (``[senders.fcm]``) is one of them."""
    out: dict[str, tuple[str, ...]] = {}
    for name, info in settings_cls.model_fields.items():
        kind = _model(info)
        if kind is not None:
            out[name] = tuple(kind.model_fields)
        elif name == "topics":
            out[name] = topic_roles()
    return out


def section_tables(settings_cls: type[BaseSettings]) -> dict[str, dict[str, tuple[str, ...]]]:
    """Section -> its tables (``senders`` -> ``fcm``, ``apns``) -> the names of their settings."""
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for name, info in settings_cls.model_fields.items():
        kind = _model(info)
        for table, table_info in (kind.model_fields.items() if kind is not None else ()):
            table_kind = _model(table_info)
            if table_kind is not None:
                out.setdefault(name, {})[table] = tuple(table_kind.model_fields)
    return out


class EnvironmentSource(PydanticBaseSettingsSource):
    """``DEDUP_<SECTION>_<FIELD>`` (``DEDUP_KAFKA_BOOTSTRAP_SERVERS``), a table's
    ``DEDUP_<SECTION>_<TABLE>_<FIELD>`` (``DEDUP_SENDERS_FCM_PROJECT_ID``) and ``DEDUP_DATA_DIR``.

    Only variables that name a setting are read: ``DEDUP_CONFIG``, ``DEDUP_SCHEMAS_DIR`` or a
    ``DEDUP_KAFKA`` are someone else's and left alone.
    """

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.env = env

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # everything is read at once, in __call__

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        sections = section_fields(self.settings_cls)
        tables = section_tables(self.settings_cls)
        for section, names in sections.items():
            prefix = f"{ENV_PREFIX}{section.upper()}_"
            for key, value in self.env.items():
                name = key[len(prefix):].lower()
                if not key.startswith(prefix):
                    continue
                if name in names and name not in tables.get(section, {}):
                    found.setdefault(section, {})[name] = value
                    continue
                for table, table_names in tables.get(section, {}).items():
                    inner = name.removeprefix(f"{table}_")
                    if inner != name and inner in table_names:
                        found.setdefault(section, {}).setdefault(table, {})[inner] = value
        for name in self.settings_cls.model_fields:
            key = f"{ENV_PREFIX}{name.upper()}"
            if name not in sections and key in self.env:
                found[name] = self.env[key]
        return found
