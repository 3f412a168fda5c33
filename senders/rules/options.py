"""The rules' settings."""

from __future__ import annotations

from dataclasses import dataclass

from operators.errors import ConfigError


@dataclass(frozen=True, slots=True)
class RuleOptions:
    """Limits and waits of the send-time rules.

    :param marketing_per_day: marketing notifications a user receives per local day (0: no limit)
    :param one_time_codes_per_window: one-time codes a recipient receives per window (0: no limit)
    :param one_time_code_window_ms: that window, in fixed slots since the epoch
    :param preferences_retry_ms: a marketing message whose recipient's preferences cannot be read
        waits this long before it is checked again (fail closed)
    """

    marketing_per_day: int = 1
    one_time_codes_per_window: int = 5
    one_time_code_window_ms: int = 3_600_000
    preferences_retry_ms: int = 60_000

    def __post_init__(self) -> None:
        if self.marketing_per_day < 0 or self.one_time_codes_per_window < 0:
            raise ConfigError("a limit must be 0 (none) or positive")
        if self.one_time_code_window_ms <= 0:
            raise ConfigError("one_time_code_window_ms must be positive")
        if self.preferences_retry_ms <= 0:
            raise ConfigError("preferences_retry_ms must be positive")
