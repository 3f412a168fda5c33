"""A message's price per provider (``senders.provider_prices``): what ``sender_cost_units_total``
counts for each message a provider took."""

from __future__ import annotations

import math
from collections.abc import Mapping

from operators.errors import ConfigError


def parse_prices(text: str) -> Mapping[str, float]:
    """``label=PRICE;label=PRICE`` (a provider's label: a URL's host[:port], ``smtp``, ``fake``)
    -> price per message; a provider not named costs 0."""
    out: dict[str, float] = {}
    for entry in text.split(";"):
        if not entry.strip():
            continue
        label, sep, price = entry.partition("=")
        try:
            value = float(price)
        except ValueError:
            value = math.nan
        if not sep or not label.strip() or not math.isfinite(value) or value < 0:
            raise ConfigError(f"provider_prices: expected label=PRICE (a number >= 0), got {entry.strip()!r}")
        if label.strip() in out:
            raise ConfigError(f"provider_prices: {label.strip()!r} is priced twice")
        out[label.strip()] = value
    return out
