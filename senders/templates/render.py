"""Rendering one channel message: the version of its event time, the user's locale (or the
default one), the channel's parts rendered strictly.

Every parameter a body uses (what ``templates check`` prints) is required: one the request lacks
is ``missing_parameter: <name>`` before anything is rendered, never a blank, and there are no
optional parameters (``default`` or ``is defined`` do not make one). ``StrictUndefined`` still
fails on anything else undefined (an attribute of a parameter): ``render_failed``. Email HTML
autoescapes the parameters; the text parts take them as they are. An SMS text longer than the
configured segments is ``sms_too_long``. A subject or push title is kept to one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import jinja2

from operators.records import Category, Channel
from senders.statuses import Lane
from senders.templates.catalog import Catalog, Template, Version
from senders.templates.errors import MissingParameter, RenderFailed, SmsTooLong, UnsupportedChannel
from senders.templates.options import TemplateOptions
from senders.templates.sms import SmsEncoding, sms_length


@dataclass(frozen=True, slots=True)
class PushContent:
    title: str = field(repr=False)
    body: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class SmsContent:
    text: str = field(repr=False)
    encoding: SmsEncoding
    segments: int


@dataclass(frozen=True, slots=True)
class EmailContent:
    subject: str = field(repr=False)
    text: str = field(repr=False)
    html: str = field(repr=False)


Content = PushContent | SmsContent | EmailContent


@dataclass(frozen=True, slots=True)
class MessageContext:
    """What a provider may need to know of a message besides its content (push providers: the
    urgency of ``android.priority`` / ``apns-priority``, the expiry of ``android.ttl`` /
    ``apns-expiration``). The defaults are a transactional message of the normal lane with no
    event time, so a provider given none still sends as before.

    :param kind: the template's kind (transactional or marketing)
    :param one_time_code: the template sends a one-time code
    :param lane: the lane the message came through (a request of high priority: the priority lane)
    :param event_time_ms: the accepted request's event time, where the message's time to live
        counts from; None: unknown (count from the send)
    """

    kind: Category = Category.TRANSACTIONAL
    one_time_code: bool = False
    lane: Lane = Lane.NORMAL
    event_time_ms: int | None = None

    @property
    def urgent(self) -> bool:
        """A one-time code, or anything of the priority lane: wanted on the device at once."""
        return self.one_time_code or self.lane is Lane.PRIORITY

    @classmethod
    def of(cls, template: Template, *, lane: Lane, event_time_ms: int | None) -> MessageContext:
        return cls(template.kind, template.one_time_code, lane, event_time_ms)


@dataclass(frozen=True, slots=True)
class Rendered:
    """A rendered message; template, version and locale are recorded with its status;
    ``context`` is what its provider may need besides the content."""

    template: str
    version: int
    locale: str
    channel: Channel
    content: Content
    context: MessageContext = MessageContext()

    def fields(self) -> dict[str, object]:
        """The content's parts by name (push: title, body; SMS: text, encoding, segments; email:
        subject, text, html), as a provider's payload carries them."""
        return {k: (str(v) if isinstance(v, SmsEncoding) else v) for k, v in asdict(self.content).items()}


def _one_line(text: str) -> str:
    """A subject or title is one line, whatever a parameter holds (no header injection)."""
    return " ".join(text.split())


def choose_locale(version: Version, locale: str | None, default_locale: str) -> str:
    """The user's locale if the version has it, else its language (``bn`` for ``bn-BD``), else
    the default locale."""
    for candidate in (locale, locale.split("-")[0] if locale else None):
        if candidate and candidate in version.bodies:
            return candidate
    return default_locale


def render(
    catalog: Catalog,
    template_id: str,
    channel: Channel,
    params: Mapping[str, str],
    *,
    event_time_ms: int,
    locale: str | None,
    options: TemplateOptions,
    lane: Lane = Lane.NORMAL,
) -> Rendered:
    """Render a message; raises a TemplateError whose ``reason`` goes on its ``rejected`` status.
    ``lane``: the lane it came through (for its ``context``)."""
    template = catalog.get(template_id)
    if channel not in template.channels:
        raise UnsupportedChannel(template.name, channel)
    version = template.version_at(event_time_ms)
    chosen = choose_locale(version, locale, options.default_locale)
    body = version.bodies[chosen][channel]
    values = dict(params)
    missing = body.parameters - values.keys()
    if missing:
        raise MissingParameter(template.name, version.number, missing)
    try:
        parts = {name: part.render(values) for name, part in body.parts.items()}
    except (jinja2.TemplateError, ArithmeticError, LookupError, TypeError, ValueError) as exc:
        raise RenderFailed(template.name, version.number, type(exc).__name__) from None
    content: Content
    if channel is Channel.PUSH:
        content = PushContent(title=_one_line(parts["title"]), body=parts["body"])
    elif channel is Channel.SMS:
        length = sms_length(parts["text"])
        if length.segments > options.max_sms_segments:
            raise SmsTooLong(template.name, version.number, length.segments, options.max_sms_segments)
        content = SmsContent(text=parts["text"], encoding=length.encoding, segments=length.segments)
    else:
        content = EmailContent(subject=_one_line(parts["subject"]), text=parts["text"], html=parts["html"])
    context = MessageContext.of(template, lane=lane, event_time_ms=event_time_ms)
    return Rendered(template.name, version.number, chosen, channel, content, context)
