"""Errors of the templates: a message that cannot be rendered (``reason`` is the short machine
string its ``rejected`` status carries), and a templates directory that is not valid."""

from __future__ import annotations

from collections.abc import Iterable

from operators.errors import ConfigError
from operators.records import Channel
from senders.errors import SenderError


class TemplateError(SenderError):
    """A message cannot be rendered. Messages name templates and parameters, never their values."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class UnknownTemplate(TemplateError):
    def __init__(self, name: str) -> None:
        super().__init__("unknown_template", f"no template {name!r}")


class NoVersion(TemplateError):
    def __init__(self, name: str) -> None:
        super().__init__("no_version", f"template {name!r} has no version published at the request's event time")


class UnsupportedChannel(TemplateError):
    def __init__(self, name: str, channel: Channel) -> None:
        super().__init__(f"unsupported_channel: {channel.value}", f"template {name!r} has no {channel.value} body")


class MissingParameter(TemplateError):
    def __init__(self, name: str, version: int, parameters: Iterable[str]) -> None:
        self.parameters = tuple(sorted(parameters))
        listed = ", ".join(self.parameters)
        super().__init__(f"missing_parameter: {listed}", f"template {name!r} v{version} needs parameter(s) {listed}")


class SmsTooLong(TemplateError):
    def __init__(self, name: str, version: int, segments: int, maximum: int) -> None:
        self.segments = segments
        message = f"template {name!r} v{version}: the SMS needs {segments} segments, at most {maximum}"
        super().__init__("sms_too_long", message)


class RenderFailed(TemplateError):
    def __init__(self, name: str, version: int, what: str) -> None:
        super().__init__("render_failed", f"template {name!r} v{version} failed to render: {what}")


class TemplateConfigError(ConfigError):
    """The templates directory is not valid; ``problems`` has one line per problem."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("invalid templates: " + "; ".join(self.problems))
