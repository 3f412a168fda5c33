"""The templates' settings."""

from __future__ import annotations

from dataclasses import dataclass

from operators.errors import ConfigError


@dataclass(frozen=True, slots=True)
class TemplateOptions:
    """Where the templates are and how they are rendered.

    :param directory: the templates directory (a relative path is taken from the working directory)
    :param default_locale: the locale used when a version has no body in the user's; every
        version must have bodies in it
    :param max_sms_segments: an SMS text that needs more segments is rejected (``sms_too_long``)
    """

    directory: str = "templates"
    default_locale: str = "en"
    max_sms_segments: int = 3

    def __post_init__(self) -> None:
        if self.max_sms_segments < 1:
            raise ConfigError("max_sms_segments must be at least 1")
        if not self.default_locale:
            raise ConfigError("default_locale must not be empty")
