"""The whole configuration, and ``load_settings``: defaults < TOML file < ``DEDUP_*`` variables,
then flags through ``with_overrides``."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from operators.contract import Topics
from operators.errors import ConfigError
from settings.api import ApiSettings
from settings.base import ENV_PREFIX, config_error
from settings.dedup import DedupSettings
from settings.flink import FlinkSettings
from settings.kafka import KafkaSettings
from settings.senders import SendersSettings
from settings.sources import Layers, current_layers, layered, section_fields
from settings.telemetry import TelemetrySettings
from settings.topics import TopicNames


class Settings(BaseSettings):
    """One frozen configuration.

    ``Settings()`` is the defaults (and the sections it is given); ``load_settings`` layers a file
    and the environment under them.

    :param kafka: the ``[kafka]`` section
    :param topics: the ``[topics]`` section: topic names by contract role
    :param dedup: the ``[dedup]`` section
    :param flink: the ``[flink]`` section
    :param senders: the ``[senders]`` section
    :param api: the ``[api]`` section
    :param telemetry: the ``[telemetry]`` section: traces
    :param data_dir: local state of the tools (the local broker, the senders' store)
    """

    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    topics: TopicNames = Field(default_factory=Topics)
    dedup: DedupSettings = Field(default_factory=DedupSettings)
    flink: FlinkSettings = Field(default_factory=FlinkSettings)
    senders: SendersSettings = Field(default_factory=SendersSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    data_dir: str = ".data"

    def __init__(self, **values: Any) -> None:
        layers = current_layers()
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise config_error(exc, layers.where() if layers is not None else "the settings") from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        layers = current_layers()
        if layers is None:
            return (init_settings,)
        return (init_settings, *layers.sources(settings_cls))

    def data_path(self) -> Path:
        return Path(self.data_dir).resolve()

    def with_overrides(self, **sections: Mapping[str, Any] | None) -> Settings:
        """A copy with some fields of some sections replaced, validated again (values coerced as
        the environment's are); a None value leaves its field alone."""
        known = section_fields(type(self))
        unknown = sorted(set(sections) - set(known))
        if unknown:
            raise ConfigError(f"unknown section(s) in the overrides: {', '.join(unknown)}")
        data = self._as_input()
        for name, values in sections.items():
            if values:
                data[name] = {**data[name], **{k: v for k, v in values.items() if v is not None}}
        try:
            return type(self).model_validate(data)
        except ValidationError as exc:
            raise config_error(exc, "the overrides") from None

    def _as_input(self) -> dict[str, Any]:
        """Every section as the mapping it was validated from (secrets stay secret types): the
        settings it was given, so that what a section derives (``kafka.bootstrap_servers`` from
        the local cluster's ports) is derived again from the overrides."""
        data: dict[str, Any] = {name: getattr(self, name) for name in type(self).model_fields}
        for name in section_fields(type(self)):
            section = data[name]
            if isinstance(section, Topics):
                data[name] = section.by_role()
            else:
                data[name] = {k: getattr(section, k) for k in section.model_fields_set}
        return data


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Defaults < file (``config_file`` or ``$DEDUP_CONFIG``) < ``DEDUP_<SECTION>_<FIELD>``."""
    env = os.environ if env is None else env
    named = config_file or env.get(f"{ENV_PREFIX}CONFIG")
    path = Path(named) if named else None
    if path is not None and not path.is_file():
        raise ConfigError(f"cannot read config file {path}: no such file")
    try:
        with layered(Layers(path, env)):
            return Settings()
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
