"""Rendering: strict parameters, HTML escaping, SMS bounds, locale fallback, version by event time."""

from __future__ import annotations

from pathlib import Path

import pytest

from operators.records import Category, Channel
from senders.statuses import Lane
from senders.templates.catalog import Catalog, load_catalog
from senders.templates.errors import (
    MissingParameter,
    NoVersion,
    RenderFailed,
    SmsTooLong,
    TemplateError,
    UnknownTemplate,
    UnsupportedChannel,
)
from senders.templates.options import TemplateOptions
from senders.templates.render import EmailContent, MessageContext, PushContent, Rendered, SmsContent, render
from senders.templates.sms import SmsEncoding
from tests.senders.templates.helpers import all_channels, version, write_template

OPTS = TemplateOptions()
JAN, MAR = 1_767_225_600_000, 1_772_323_200_000  # 2026-01-01, 2026-03-01 UTC


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    write_template(tmp_path, "sale", versions={
        1: version("2026-01-01T00:00:00Z", {"en": all_channels("Sale"), "bn": all_channels("সেল")}),
        2: version("2026-03-01T00:00:00Z", {"en": all_channels("Eid sale"), "bn": all_channels("ঈদ সেল"), "bn-IN": all_channels("সেল IN")}),
    })
    write_template(tmp_path, "note", kind="transactional", channels=("sms",), versions={
        1: "published_at = 2026-01-01T00:00:00Z\n[en.sms]\ntext = '{{ a }} {{ b }}{% if c is defined %} {{ c }}{% endif %} {{ d | default(\"-\") }}'\n",
    })
    write_template(tmp_path, "calc", kind="transactional", channels=("sms",), versions={
        1: "published_at = 2026-01-01T00:00:00Z\n[en.sms]\ntext = '{{ (n | int) // 0 }} {{ a.b }}'\n",
    })
    return load_catalog(OPTS, tmp_path)


def sms_only_parameter(root: Path) -> Path:
    write_template(root, "split", kind="transactional", channels=("push", "sms"), versions={
        1: "published_at = 2026-01-01T00:00:00Z\n[en.push]\ntitle = 'Hi'\nbody = 'No params'\n[en.sms]\ntext = '{{ code }}'\n",
    })
    return root


def do(catalog: Catalog, template: str, channel: Channel, params: dict[str, str], *, at: int = MAR, locale: str | None = "en",
       options: TemplateOptions = OPTS) -> Rendered:
    return render(catalog, template, channel, params, event_time_ms=at, locale=locale, options=options)


def reason(catalog: Catalog, *args: object, **kwargs: object) -> str:
    with pytest.raises(TemplateError) as info:
        do(catalog, *args, **kwargs)  # type: ignore[arg-type]
    return info.value.reason


def test_every_channel_renders(catalog: Catalog) -> None:
    push = do(catalog, "sale", Channel.PUSH, {"pct": "30"})
    assert push == Rendered(
        "sale", 2, "en", Channel.PUSH, PushContent(title="Eid sale title", body="Eid sale: 30% off"),
        MessageContext(Category.MARKETING, one_time_code=False, lane=Lane.NORMAL, event_time_ms=MAR),
    )
    sms = do(catalog, "sale", Channel.SMS, {"pct": "30"})
    assert sms.content == SmsContent(text="Eid sale: 30% off", encoding=SmsEncoding.GSM7, segments=1)
    email = do(catalog, "sale", Channel.EMAIL, {"pct": "30", "unused": "x"})
    assert email.content == EmailContent(subject="Eid sale: 30% off", text="Eid sale\n30% off", html="<p>Eid sale: <b>30</b>% off</p>")


def test_a_missing_parameter_is_an_error_never_a_blank(catalog: Catalog) -> None:
    with pytest.raises(MissingParameter) as info:
        do(catalog, "sale", Channel.PUSH, {})
    assert (info.value.reason, info.value.parameters, str(info.value)) == (
        "missing_parameter: pct", ("pct",), "template 'sale' v2 needs parameter(s) pct",
    )
    assert reason(catalog, "sale", Channel.EMAIL, {"PCT": "30"}) == "missing_parameter: pct"
    assert reason(catalog, "note", Channel.SMS, {"b": "1", "c": "2", "d": "3"}) == "missing_parameter: a"
    assert reason(catalog, "note", Channel.SMS, {}) == "missing_parameter: a, b, c, d"


def test_every_parameter_a_body_uses_is_required(catalog: Catalog, tmp_path: Path) -> None:
    assert reason(catalog, "note", Channel.SMS, {"a": "A", "b": "B"}) == "missing_parameter: c, d"
    full = do(catalog, "note", Channel.SMS, {"a": "A", "b": "B", "c": "C", "d": "D"})
    assert isinstance(full.content, SmsContent) and full.content.text == "A B C D"
    # what one channel's body needs, not the whole version's
    only_sms = load_catalog(OPTS, sms_only_parameter(tmp_path / "other"))
    assert do(only_sms, "split", Channel.PUSH, {}).content == PushContent(title="Hi", body="No params")
    assert reason(only_sms, "split", Channel.SMS, {}) == "missing_parameter: code"


def test_html_escapes_parameters_and_text_parts_do_not(catalog: Catalog) -> None:
    hostile = '<script>alert("x")</script> & \'q\''
    email = do(catalog, "sale", Channel.EMAIL, {"pct": hostile}).content
    assert isinstance(email, EmailContent)
    assert email.html == "<p>Eid sale: <b>&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &#39;q&#39;</b>% off</p>"
    assert email.text == f"Eid sale\n{hostile}% off"
    assert email.subject == f"Eid sale: {hostile}% off"


def test_a_subject_or_title_stays_one_line(catalog: Catalog) -> None:
    email = do(catalog, "sale", Channel.EMAIL, {"pct": "30\r\nBcc: victim@example.com"}).content
    assert isinstance(email, EmailContent) and email.subject == "Eid sale: 30 Bcc: victim@example.com% off"
    assert email.text == "Eid sale\n30\r\nBcc: victim@example.com% off"


def test_sms_segments_and_the_bound(catalog: Catalog) -> None:
    long_gsm = "x" * 400
    sms = do(catalog, "sale", Channel.SMS, {"pct": long_gsm}).content
    assert isinstance(sms, SmsContent) and (sms.encoding, sms.segments) == (SmsEncoding.GSM7, 3)
    with pytest.raises(SmsTooLong) as info:
        do(catalog, "sale", Channel.SMS, {"pct": long_gsm + "x" * 60})
    assert (info.value.reason, info.value.segments, str(info.value)) == (
        "sms_too_long", 4, "template 'sale' v2: the SMS needs 4 segments, at most 3",
    )
    assert do(catalog, "sale", Channel.SMS, {"pct": long_gsm + "x" * 60}, options=TemplateOptions(max_sms_segments=4)).content == SmsContent(
        text=f"Eid sale: {long_gsm}{'x' * 60}% off", encoding=SmsEncoding.GSM7, segments=4)
    bn = do(catalog, "sale", Channel.SMS, {"pct": "৩০"}, locale="bn").content
    assert isinstance(bn, SmsContent) and (bn.encoding, bn.segments) == (SmsEncoding.UCS2, 1)
    assert reason(catalog, "sale", Channel.SMS, {"pct": "অ" * 200}, locale="bn") == "sms_too_long"
    assert reason(catalog, "sale", Channel.SMS, {"pct": "€" * 226}) == "sms_too_long"  # 452 + 18 septets


def test_the_locale_falls_back_to_its_language_then_the_default(catalog: Catalog) -> None:
    def locale_of(loc: str | None) -> str:
        return do(catalog, "sale", Channel.PUSH, {"pct": "1"}, locale=loc).locale

    assert [locale_of(x) for x in ("bn", "bn-BD", "bn-IN", "en-GB", "fr", "fr-FR", None)] == ["bn", "bn", "bn-IN", "en", "en", "en", "en"]
    assert do(catalog, "sale", Channel.PUSH, {"pct": "1"}, locale="bn-BD").content == PushContent(title="ঈদ সেল title", body="ঈদ সেল: 1% off")
    v1 = do(catalog, "sale", Channel.PUSH, {"pct": "1"}, locale="bn-IN", at=JAN)
    assert (v1.version, v1.locale) == (1, "bn")


def test_the_version_is_chosen_by_event_time(catalog: Catalog) -> None:
    assert [do(catalog, "sale", Channel.PUSH, {"pct": "1"}, at=t).version for t in (JAN, MAR - 1, MAR, MAR + 10**10)] == [1, 1, 2, 2]
    assert do(catalog, "sale", Channel.PUSH, {"pct": "1"}, at=JAN).content == PushContent(title="Sale title", body="Sale: 1% off")
    with pytest.raises(NoVersion):
        do(catalog, "sale", Channel.PUSH, {"pct": "1"}, at=JAN - 1)


def test_typed_errors_with_machine_reasons(catalog: Catalog) -> None:
    assert reason(catalog, "nope", Channel.PUSH, {}) == "unknown_template"
    assert reason(catalog, "sale", Channel.PUSH, {"pct": "1"}, at=0) == "no_version"
    assert reason(catalog, "note", Channel.PUSH, {"a": "1", "b": "2"}) == "unsupported_channel: push"
    with pytest.raises(RenderFailed) as info:
        do(catalog, "calc", Channel.SMS, {"n": "4", "a": "secret-value"})
    assert (info.value.reason, str(info.value)) == ("render_failed", "template 'calc' v1 failed to render: ZeroDivisionError")
    assert issubclass(UnknownTemplate, TemplateError) and issubclass(UnsupportedChannel, TemplateError)


def test_rendered_text_is_not_in_reprs(catalog: Catalog) -> None:
    for channel in Channel:
        rendered = do(catalog, "sale", channel, {"pct": "code-4711"})
        assert "4711" not in repr(rendered)
    assert repr(do(catalog, "sale", Channel.SMS, {"pct": "1"})) == (
        "Rendered(template='sale', version=2, locale='en', channel=<Channel.SMS: 'sms'>, "
        "content=SmsContent(encoding=<SmsEncoding.GSM7: 'gsm7'>, segments=1), "
        f"context=MessageContext(kind=<Category.MARKETING: 'marketing'>, one_time_code=False, "
        f"lane=<Lane.NORMAL: 'normal'>, event_time_ms={MAR}))"
    )


def test_the_context_says_what_a_provider_needs_besides_the_content(tmp_path: Path) -> None:
    """The template's kind and one-time-code flag, the lane, the event time: what a push
    provider's priority and expiry come from."""
    write_template(tmp_path, "otp", kind="transactional", channels=("push",), extra_meta="one_time_code = true\n",
                   versions={1: "published_at = 2026-01-01T00:00:00Z\n[en.push]\ntitle = 'Code'\nbody = '{{ code }}'\n"})
    write_template(tmp_path, "shipped", kind="transactional", channels=("push",),
                   versions={1: "published_at = 2026-01-01T00:00:00Z\n[en.push]\ntitle = 'Shipped'\nbody = 'On its way'\n"})
    catalog = load_catalog(OPTS, tmp_path)
    code = render(catalog, "otp", Channel.PUSH, {"code": "1"}, event_time_ms=MAR, locale=None, options=OPTS,
                  lane=Lane.PRIORITY)
    assert code.context == MessageContext(Category.TRANSACTIONAL, True, Lane.PRIORITY, MAR)
    assert code.context.urgent
    shipped = render(catalog, "shipped", Channel.PUSH, {}, event_time_ms=JAN + 1, locale=None, options=OPTS)
    assert shipped.context == MessageContext(Category.TRANSACTIONAL, False, Lane.NORMAL, JAN + 1)
    assert not shipped.context.urgent
    # a transactional message a caller sent with high priority is urgent too (it came by the priority lane)
    assert MessageContext(lane=Lane.PRIORITY).urgent
    # what a provider gets when nobody said: a transactional message of the normal lane, no event time
    assert Rendered("t", 1, "en", Channel.PUSH, PushContent("a", "b")).context == MessageContext(
        Category.TRANSACTIONAL, False, Lane.NORMAL, None)
