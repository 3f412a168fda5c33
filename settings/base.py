"""What every section of the settings shares: a frozen model that refuses unknown keys, the value
types the layers need (flags, optional values an empty variable clears), and the ConfigError a
failed validation becomes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, SecretStr, ValidationError

from operators.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent
#: environment variables are ``DEDUP_<SECTION>_<FIELD>``; ``DEDUP_CONFIG`` names the file
ENV_PREFIX = "DEDUP_"
#: the error type of a key that names no setting (pydantic's own, and ours for [topics])
UNKNOWN_SETTING = "extra_forbidden"


class Section(BaseModel):
    """One section (``[kafka]``, ``[dedup]``, ...): frozen, and an unknown key is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid", coerce_numbers_to_str=True)


def _flag(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _empty_is_none(value: object) -> object:
    return None if value == "" else value


#: a bool from a variable: 1, true, yes, on (any case) are true, anything else false
Flag = Annotated[bool, BeforeValidator(_flag)]
#: an optional string; an empty value (``DEDUP_KAFKA_SASL_MECHANISM=``) clears it
OptionalStr = Annotated[str | None, BeforeValidator(_empty_is_none)]
#: an optional integer; an empty value clears it
OptionalInt = Annotated[int | None, BeforeValidator(_empty_is_none)]
#: an optional secret: shown as ``**********`` everywhere, ``.get_secret_value()`` reveals it
OptionalSecret = Annotated[SecretStr | None, BeforeValidator(_empty_is_none)]


def config_error(exc: ValidationError, where: str) -> ConfigError:
    """The problems of a failed validation, each naming its setting; never the values given
    (one may be a secret)."""
    sections: list[str] = []
    unknown: dict[str, list[str]] = {}
    bad: list[str] = []
    for e in exc.errors(include_url=False, include_input=False, include_context=True):
        loc = [str(p) for p in e["loc"]]
        if e["type"] == UNKNOWN_SETTING and len(loc) == 1 and "names" not in e.get("ctx", {}):
            sections.append(loc[0])
        elif e["type"] == UNKNOWN_SETTING:
            names = e.get("ctx", {}).get("names")
            unknown.setdefault(loc[0], []).extend([names] if names else [".".join(loc[1:])])
        else:
            bad.append(f"{'.'.join(loc) or 'settings'}: {e['msg']}")
    problems = []
    if sections:
        problems.append(f"unknown section(s) in {where}: {', '.join(sorted(sections))}")
    problems += [f"unknown setting(s) in [{s}]: {', '.join(sorted(n))}" for s, n in unknown.items()]
    problems += bad
    return ConfigError("; ".join(problems))
