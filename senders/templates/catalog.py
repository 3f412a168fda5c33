"""Loading and validating the templates directory.

One directory per template, named by the template id (``[a-z0-9][a-z0-9_.-]*``)::

    templates/
      eid_sale/
        template.toml      kind, channels, one-time-code flag
        v1.toml            version 1: published_at, then bodies per locale and channel
        v2.toml            version 2 ...

``template.toml``::

    kind = "marketing"                    # or "transactional"
    channels = ["push", "sms", "email"]   # the channels it has bodies for
    one_time_code = false                 # optional; true only for a transactional template
    allow_unverified = false              # optional; true only for a transactional template that
                                          # verifies the address itself (a one-time code)
    description = "..."                   # optional

``v<N>.toml``, N = 1, 2, ... (a higher number is a newer version, published later)::

    published_at = 2026-03-01T00:00:00Z   # a TOML date-time with an offset

    [en.push]
    title = "Eid sale"
    body = "Eid sale: {{ pct }}% off"
    [en.sms]
    text = "Eid sale: {{ pct }}% off"
    [en.email]
    subject = "Eid sale: {{ pct }}% off"
    text = "..."
    html = "..."

    [bn.push]
    ...

Every locale of a version has a body for every channel of the template, each part present and
not blank, and every version has the default locale. The parts are Jinja2 templates; the
parameters a body uses are its undeclared variables (``jinja2.meta``), what the version needs
is their union. Any other file in a template's directory (hidden files aside), key or value is
an error; ``scan`` lists them all. Files at the top of the directory (a README) are ignored.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta

from operators.records import Category, Channel
from senders.profiles.model import canonical_locale
from senders.templates.errors import NoVersion, TemplateConfigError, UnknownTemplate
from senders.templates.options import TemplateOptions

PARTS: Mapping[Channel, tuple[str, ...]] = {
    Channel.PUSH: ("title", "body"),
    Channel.SMS: ("text",),
    Channel.EMAIL: ("subject", "text", "html"),
}
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_VERSION_FILE = re.compile(r"v([1-9]\d{0,5})\.toml")
_TEMPLATE_KEYS = {"kind", "channels", "one_time_code", "allow_unverified", "description"}

TEXT_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
HTML_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=True)


@dataclass(frozen=True, slots=True)
class Body:
    """One channel's parts in one locale, compiled, and the parameters they use."""

    parts: Mapping[str, jinja2.Template]
    parameters: frozenset[str]


@dataclass(frozen=True, slots=True)
class Version:
    number: int
    published_at_ms: int
    bodies: Mapping[str, Mapping[Channel, Body]]  # locale -> channel -> body
    parameters: frozenset[str]

    @property
    def locales(self) -> tuple[str, ...]:
        return tuple(sorted(self.bodies))


@dataclass(frozen=True, slots=True)
class Template:
    """A template. ``allow_unverified``: its messages may go to addresses the profile does not
    mark verified (a transactional template whose message verifies the address, such as a
    one-time code); otherwise only to verified ones, and marketing never to others."""

    name: str
    kind: Category
    one_time_code: bool
    channels: tuple[Channel, ...]
    versions: tuple[Version, ...]  # ascending
    description: str = ""
    allow_unverified: bool = False

    def version_at(self, event_time_ms: int) -> Version:
        """The newest version published at or before the event time; raises NoVersion."""
        published = [v for v in self.versions if v.published_at_ms <= event_time_ms]
        if not published:
            raise NoVersion(self.name)
        return published[-1]


@dataclass(frozen=True, slots=True)
class Catalog:
    templates: Mapping[str, Template]

    def get(self, name: str) -> Template:
        """The template of a message's ``template_id``; raises UnknownTemplate."""
        template = self.templates.get(name)
        if template is None:
            raise UnknownTemplate(name)
        return template


def _read_toml(path: Path, where: str, problems: list[str]) -> dict[str, Any] | None:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        problems.append(f"{where}: {exc}")
        return None


def _compile(
    source: object, env: jinja2.Environment, where: str, problems: list[str]
) -> tuple[jinja2.Template, frozenset[str]] | None:
    if not isinstance(source, str) or not source.strip():
        problems.append(f"{where}: must be a non-blank string")
        return None
    try:
        template = env.from_string(source)
        # a plain dict of the (never changed) environment's globals in place of Jinja's ChainMap:
        # every render copies them into its context, and iterating a ChainMap made that copy
        # nine tenths of a render's CPU
        template.globals = dict(template.globals)
        return template, frozenset(meta.find_undeclared_variables(env.parse(source)))
    except jinja2.TemplateSyntaxError as exc:
        problems.append(f"{where}: line {exc.lineno}: {exc.message}")
        return None


def _body(table: object, channel: Channel, where: str, problems: list[str]) -> Body | None:
    if not isinstance(table, dict):
        problems.append(f"{where}: must be a table of {', '.join(PARTS[channel])}")
        return None
    extra = sorted(set(table) - set(PARTS[channel]))
    if extra:
        problems.append(f"{where}: unknown part(s) {', '.join(extra)}")
    parts: dict[str, jinja2.Template] = {}
    parameters: set[str] = set()
    for part in PARTS[channel]:
        if part not in table:
            problems.append(f"{where}.{part}: missing")
            continue
        env = HTML_ENV if part == "html" else TEXT_ENV
        compiled = _compile(table[part], env, f"{where}.{part}", problems)
        if compiled is not None:
            parts[part] = compiled[0]
            parameters |= compiled[1]
    return Body(parts, frozenset(parameters)) if len(parts) == len(PARTS[channel]) else None


def _version(
    path: Path, number: int, channels: tuple[Channel, ...], default_locale: str, problems: list[str]
) -> Version | None:
    where = f"{path.parent.name}/{path.name}"
    data = _read_toml(path, where, problems)
    if data is None:
        return None
    before = len(problems)
    published = data.pop("published_at", None)
    if not isinstance(published, datetime) or published.utcoffset() is None:
        problems.append(f"{where}: published_at must be a date-time with an offset, like 2026-03-01T00:00:00Z")
    bodies: dict[str, dict[Channel, Body]] = {}
    for locale, table in data.items():
        try:
            if canonical_locale(locale) != locale:
                raise ValueError
        except ValueError:
            problems.append(f"{where}: {locale!r} is not a locale in canonical form (bn, en, en-US)")
            continue
        if not isinstance(table, dict):
            problems.append(f"{where}: {locale} must be a table of channels")
            continue
        extra = sorted(set(table) - {c.value for c in channels})
        if extra:
            problems.append(f"{where}: {locale}: channel(s) {', '.join(extra)} not in the template's channels")
        bodies[locale] = {}
        for channel in channels:
            if channel.value not in table:
                problems.append(f"{where}: {locale}.{channel.value}: missing")
                continue
            body = _body(table[channel.value], channel, f"{where}: {locale}.{channel.value}", problems)
            if body is not None:
                bodies[locale][channel] = body
    if default_locale not in bodies:
        problems.append(f"{where}: no bodies in the default locale {default_locale}")
    if len(problems) > before or not isinstance(published, datetime):
        return None
    parameters = frozenset().union(*(b.parameters for by_channel in bodies.values() for b in by_channel.values()))
    return Version(number, int(published.timestamp() * 1000), bodies, parameters)


def _channels(value: object, where: str, problems: list[str]) -> tuple[Channel, ...]:
    known = [c.value for c in Channel]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v in known for v in value):
        problems.append(f"{where}: channels must be a non-empty list of {', '.join(known)}")
        return ()
    if len(set(value)) != len(value):
        problems.append(f"{where}: a channel is listed twice")
        return ()
    return tuple(Channel(v) for v in value)


def load_template(directory: Path, options: TemplateOptions) -> tuple[Template | None, list[str]]:
    """One template directory: the template, or None and the problems that prevent it."""
    problems: list[str] = []
    name = directory.name
    if not _NAME.fullmatch(name):
        return None, [f"{name}: a template name is [a-z0-9][a-z0-9_.-]*, at most 64 characters"]
    meta_path = directory / "template.toml"
    if not meta_path.is_file():
        return None, [f"{name}: no template.toml"]
    data = _read_toml(meta_path, f"{name}/template.toml", problems)
    if data is None:
        return None, problems
    where = f"{name}/template.toml"
    for key in sorted(set(data) - _TEMPLATE_KEYS):
        problems.append(f"{where}: unknown key {key}")
    kind = data.get("kind")
    if kind not in {c.value for c in Category}:
        problems.append(f"{where}: kind must be transactional or marketing")
    one_time_code = data.get("one_time_code", False)
    if not isinstance(one_time_code, bool):
        problems.append(f"{where}: one_time_code must be true or false")
    elif one_time_code and kind == Category.MARKETING.value:
        problems.append(f"{where}: a one-time code is transactional, not marketing")
    allow_unverified = data.get("allow_unverified", False)
    if not isinstance(allow_unverified, bool):
        problems.append(f"{where}: allow_unverified must be true or false")
    elif allow_unverified and kind == Category.MARKETING.value:
        problems.append(
            f"{where}: marketing never goes to an unverified address (allow_unverified is for transactional templates)"
        )
    description = data.get("description", "")
    if not isinstance(description, str):
        problems.append(f"{where}: description must be a string")
    channels = _channels(data.get("channels"), where, problems)
    numbered: dict[int, Path] = {}
    for path in sorted(directory.iterdir()):
        match = _VERSION_FILE.fullmatch(path.name)
        if match and path.is_file():
            numbered[int(match.group(1))] = path
        elif path.name != "template.toml" and not path.name.startswith("."):
            problems.append(f"{name}/{path.name}: unexpected (versions are v1.toml, v2.toml, ...)")
    if not numbered:
        problems.append(f"{name}: no versions (v1.toml, v2.toml, ...)")
    versions = [_version(numbered[n], n, channels, options.default_locale, problems) for n in sorted(numbered)]
    loaded = [v for v in versions if v is not None]
    for older, newer in zip(loaded, loaded[1:], strict=False):
        if newer.published_at_ms <= older.published_at_ms:
            problems.append(f"{name}/v{newer.number}.toml: published_at must be later than v{older.number}'s")
    if problems:
        return None, problems
    template = Template(
        name,
        Category(str(kind)),
        bool(one_time_code),
        channels,
        tuple(loaded),
        str(description),
        bool(allow_unverified),
    )
    return template, []


def scan(root: Path, options: TemplateOptions) -> tuple[dict[str, Template], list[str]]:
    """Every template under ``root`` that loads, and the problems of those that do not."""
    if not root.is_dir():
        return {}, [f"{root}: not a directory"]
    templates: dict[str, Template] = {}
    problems: list[str] = []
    for directory in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        template, found = load_template(directory, options)
        problems += found
        if template is not None:
            templates[template.name] = template
    return templates, problems


def load_catalog(options: TemplateOptions, root: Path | None = None) -> Catalog:
    """All templates of ``root`` (default: the options' directory); raises TemplateConfigError."""
    templates, problems = scan(root if root is not None else Path(options.directory), options)
    if problems:
        raise TemplateConfigError(problems)
    return Catalog(templates)
