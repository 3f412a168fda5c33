"""Which provider answers say the address itself is invalid: the only ones that deactivate it.

A rule is an HTTP status (``410``), an HTTP status and a code the reply's body must contain
(``400:invalid_recipient``, ``400:21211``), or an SMTP enhanced status, whole or as a class
(``5.1.1``, ``5.1``). Any other permanent failure (a wrong URL's 404, a rejected credential, a
relay's policy) is dead-lettered with the address kept active.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from operators.errors import ConfigError


@dataclass(frozen=True, slots=True)
class RecipientRules:
    http: tuple[tuple[int, str | None], ...] = ()
    smtp: tuple[tuple[int, ...], ...] = ()

    @classmethod
    def parse(cls, text: str) -> RecipientRules:
        http: list[tuple[int, str | None]] = []
        smtp: list[tuple[int, ...]] = []
        for raw in text.split(","):
            rule = raw.strip()
            if not rule:
                continue
            if "." in rule and ":" not in rule:
                parts = rule.split(".")
                if not all(p.isdigit() for p in parts) or len(parts) > 3 or parts[0] not in ("4", "5"):
                    raise ConfigError(f"invalid-recipient rule {rule!r}: an SMTP status is like 5.1 or 5.1.1")
                smtp.append(tuple(int(p) for p in parts))
                continue
            status, _, token = rule.partition(":")
            if not status.isdigit() or not 100 <= int(status) <= 599:
                raise ConfigError(f"invalid-recipient rule {rule!r}: expected STATUS or STATUS:CODE")
            http.append((int(status), token.strip() or None))
        return cls(tuple(http), tuple(smtp))

    def matches_http(self, status: int, body: bytes) -> bool:
        text = body.decode("utf-8", "replace")
        return any(s == status and (token is None or token in text) for s, token in self.http)

    def matches_code(self, status: int, code: str) -> bool:
        """For a provider whose error replies carry a code (Twilio's ``21211``): a rule of the
        status alone, or of the status and exactly this code."""
        return any(s == status and (token is None or token == code) for s, token in self.http)

    def matches_smtp(self, enhanced: str) -> bool:
        try:
            code = tuple(int(p) for p in enhanced.split("."))
        except ValueError:
            return False
        return len(code) == 3 and any(code[: len(rule)] == rule for rule in self.smtp)

    def __str__(self) -> str:
        http = [f"{s}:{t}" if t else str(s) for s, t in self.http]
        return ",".join(http + [".".join(map(str, r)) for r in self.smtp])


def rules_by_provider(text: str) -> Mapping[str, RecipientRules]:
    """``label=RULE,RULE;label=RULE``: the rules of named providers (their labels: a URL's
    host[:port], ``smtp``, ``fake``)."""
    out: dict[str, RecipientRules] = {}
    for entry in text.split(";"):
        if not entry.strip():
            continue
        label, sep, rules = entry.partition("=")
        if not sep or not label.strip():
            raise ConfigError(f"invalid_recipient_rules: expected label=RULES, got {entry.strip()!r}")
        out[label.strip()] = RecipientRules.parse(rules)
    return out
