"""The project's exceptions: one base, one class per area."""

from __future__ import annotations


class DedupError(Exception):
    """Base of every error this project raises on purpose."""


class ConfigError(DedupError):
    """The configuration is missing, malformed or inconsistent."""


class InvalidRecordError(DedupError):
    """An input record cannot be used; ``reason`` says why, in words fit for the invalid topic."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
