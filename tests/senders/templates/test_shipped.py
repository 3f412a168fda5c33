"""The repository's templates (the demo's): they load, and render as the demo expects."""

from __future__ import annotations

from pathlib import Path

import pytest

from dedupctl.cli import main
from operators.records import Category, Channel
from senders.templates.catalog import load_catalog
from senders.templates.errors import MissingParameter
from senders.templates.options import TemplateOptions
from senders.templates.render import EmailContent, PushContent, SmsContent, render
from senders.templates.sms import SmsEncoding
from settings import REPO_ROOT
from tests.senders.templates.helpers import version, write_template

SHIPPED = REPO_ROOT / "templates"
OPTS = TemplateOptions()
CATALOG = load_catalog(OPTS, SHIPPED)
DEC_2026 = 1_796_083_200_000  # 2026-12-01T00:00:00Z
SAMPLE = {"order": "A-1001", "code": "482913", "amount": "৳1,250", "pct": "30", "count": "7", "name": "Rahim"}

EXPECTED = {
    "order_shipped": (Category.TRANSACTIONAL, False, (Channel.PUSH, Channel.SMS, Channel.EMAIL), [{"order"}, {"order"}]),
    "otp": (Category.TRANSACTIONAL, True, (Channel.SMS,), [{"code"}]),
    "payment_update": (Category.TRANSACTIONAL, False, (Channel.PUSH, Channel.SMS, Channel.EMAIL), [{"amount"}]),
    "eid_sale": (Category.MARKETING, False, (Channel.PUSH, Channel.SMS, Channel.EMAIL), [{"pct"}]),
    "weekly_digest": (Category.MARKETING, False, (Channel.EMAIL,), [{"count"}]),
    "welcome": (Category.TRANSACTIONAL, False, (Channel.PUSH, Channel.SMS, Channel.EMAIL), [{"name"}]),
}


def test_the_shipped_templates() -> None:
    assert sorted(CATALOG.templates) == sorted(EXPECTED)
    for name, (kind, otp, channels, params) in EXPECTED.items():
        t = CATALOG.get(name)
        assert (t.kind, t.one_time_code, t.channels) == (kind, otp, channels)
        assert [set(v.parameters) for v in t.versions] == params
        assert all(v.locales == ("bn", "en") for v in t.versions)


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("locale", ["bn", "en"])
def test_every_shipped_body_renders_within_bounds(name: str, locale: str) -> None:
    for channel in CATALOG.get(name).channels:
        rendered = render(CATALOG, name, channel, SAMPLE, event_time_ms=DEC_2026, locale=locale, options=OPTS)
        assert rendered.locale == locale
        if isinstance(rendered.content, SmsContent):
            assert rendered.content.segments <= 2


def test_the_demo_story_renders() -> None:
    eid = render(CATALOG, "eid_sale", Channel.PUSH, {"pct": "30"}, event_time_ms=DEC_2026, locale="en", options=OPTS)
    assert eid.content == PushContent(title="Eid sale", body="Eid sale: 30% off")
    with pytest.raises(MissingParameter) as info:
        render(CATALOG, "eid_sale", Channel.SMS, {}, event_time_ms=DEC_2026, locale="bn", options=OPTS)
    assert info.value.reason == "missing_parameter: pct"
    otp = render(CATALOG, "otp", Channel.SMS, {"code": "482913"}, event_time_ms=DEC_2026, locale="bn", options=OPTS)
    assert otp.content == SmsContent(text="আপনার কোড 482913। ১০ মিনিটে মেয়াদ শেষ হবে। কাউকে জানাবেন না।", encoding=SmsEncoding.UCS2, segments=1)
    mail = render(CATALOG, "order_shipped", Channel.EMAIL, {"order": "<A&1>"}, event_time_ms=DEC_2026, locale="en", options=OPTS)
    assert mail.content == EmailContent(
        subject="Your order <A&1> is on its way",
        text="Hello,\n\ngood news: your order <A&1> is on its way.",
        html="<p>Hello,</p>\n<p>good news: your order <strong>&lt;A&amp;1&gt;</strong> is on its way.</p>",
    )


def test_order_shipped_has_two_versions_chosen_by_event_time() -> None:
    def body(at: int) -> tuple[int, str]:
        r = render(CATALOG, "order_shipped", Channel.SMS, {"order": "A-1"}, event_time_ms=at, locale="en", options=OPTS)
        assert isinstance(r.content, SmsContent)
        return r.version, r.content.text

    v2_published = 1_772_323_200_000  # 2026-03-01T00:00:00Z
    assert body(v2_published - 1) == (1, "Order A-1 has shipped.")
    assert body(v2_published) == (2, "Your order A-1 is on its way.")


# -- dedupctl templates check ----------------------------------------------------------------------


def test_check_prints_every_version_and_what_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["templates", "check", str(SHIPPED)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        "eid_sale: marketing, channels push, sms, email",
        "  v1 published 2025-01-01T00:00:00Z: locales bn, en; needs pct",
        "order_shipped: transactional, channels push, sms, email",
        "  v1 published 2025-01-01T00:00:00Z: locales bn, en; needs order",
        "  v2 published 2026-03-01T00:00:00Z: locales bn, en; needs order",
        "otp: transactional, one-time code, channels sms",
        "  v1 published 2025-01-01T00:00:00Z: locales bn, en; needs code",
        "payment_update: transactional, channels push, sms, email",
        "  v1 published 2025-01-01T00:00:00Z: locales bn, en; needs amount",
        "weekly_digest: marketing, channels email",
        "  v1 published 2025-01-01T00:00:00Z: locales bn, en; needs count",
        "welcome: transactional, channels push, sms, email",
        "  v1 published 2025-01-01T00:00:00Z: locales bn, en; needs name",
        "6 template(s), 7 version(s): ok",
    ]


def test_check_fails_on_a_bad_template(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_template(tmp_path, "good", kind="transactional", channels=("sms",),
                   versions={1: version("2026-01-01T00:00:00Z", {"en": {"sms": {"text": "static"}}})})
    write_template(tmp_path, "bad", channels=("sms",), versions={1: "published_at = 2026-01-01T00:00:00Z\n[en.sms]\ntext = '{{ x'\n"})
    assert main(["templates", "check", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "good: transactional, channels sms",
        "  v1 published 2026-01-01T00:00:00Z: locales en; needs no parameters",
        "1 template(s), 1 version(s): 1 problem(s)",
    ]
    assert err == "error: bad/v1.toml: en.sms.text: line 1: unexpected end of template, expected 'end of print statement'.\n"


def test_check_an_empty_or_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["templates", "check", str(tmp_path)]) == 1
    assert capsys.readouterr().err == f"error: {tmp_path}: no templates (one directory per template)\n"
    assert main(["templates", "check", str(tmp_path / "nope")]) == 1
    assert capsys.readouterr().err == f"error: {tmp_path / 'nope'}: not a directory\n"


def test_check_with_another_default_locale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_template(tmp_path, "bn_only", kind="transactional", channels=("sms",),
                   versions={1: version("2026-01-01T00:00:00Z", {"bn": {"sms": {"text": "{{ code }}"}}})})
    assert main(["templates", "check", str(tmp_path)]) == 1
    assert capsys.readouterr().err == "error: bn_only/v1.toml: no bodies in the default locale en\n"
    assert main(["templates", "check", str(tmp_path), "--default-locale", "bn"]) == 0
