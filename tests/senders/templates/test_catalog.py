"""Loading a templates directory: the layout, every problem reported, what a version needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from operators.records import Category, Channel
from senders.templates.catalog import load_catalog, load_template, scan
from senders.templates.errors import NoVersion, TemplateConfigError, UnknownTemplate
from senders.templates.options import TemplateOptions
from tests.senders.templates.helpers import all_channels, version, write_template

OPTS = TemplateOptions()
V1 = version("2026-01-01T00:00:00Z", {"en": all_channels("Sale"), "bn": all_channels("সেল")})


def problems_of(directory: Path) -> list[str]:
    template, problems = load_template(directory, OPTS)
    assert template is None
    return problems


def test_a_valid_template(tmp_path: Path) -> None:
    v2 = version("2026-03-01T06:00:00+06:00", {"en": all_channels("Sale", "discount"), "bn": all_channels("সেল")})
    write_template(tmp_path, "sale", versions={1: V1, 2: v2}, extra_meta='description = "d"\n')
    template, problems = load_template(tmp_path / "sale", OPTS)
    assert problems == [] and template is not None
    assert (template.name, template.kind, template.one_time_code, template.channels, template.description) == (
        "sale", Category.MARKETING, False, (Channel.PUSH, Channel.SMS, Channel.EMAIL), "d",
    )
    assert [(v.number, v.published_at_ms, v.locales, v.parameters) for v in template.versions] == [
        (1, 1_767_225_600_000, ("bn", "en"), frozenset({"pct"})),
        (2, 1_772_323_200_000, ("bn", "en"), frozenset({"pct", "discount"})),
    ]
    assert template.versions[1].bodies["en"][Channel.EMAIL].parameters == frozenset({"discount"})
    assert set(template.versions[1].bodies["en"][Channel.EMAIL].parts) == {"subject", "text", "html"}


def test_the_version_of_an_event_time(tmp_path: Path) -> None:
    v2 = version("2026-03-01T00:00:00Z", {"en": all_channels("New")})
    write_template(tmp_path, "sale", versions={1: V1, 2: v2})
    catalog = load_catalog(OPTS, tmp_path)
    template = catalog.get("sale")
    published_v2 = 1_772_323_200_000
    assert template.version_at(published_v2 - 1).number == 1
    assert template.version_at(published_v2).number == 2
    assert template.version_at(10**13).number == 2
    with pytest.raises(NoVersion) as info:
        template.version_at(1_767_225_600_000 - 1)
    assert info.value.reason == "no_version"
    with pytest.raises(UnknownTemplate) as unknown:
        catalog.get("nope")
    assert (unknown.value.reason, str(unknown.value)) == ("unknown_template", "no template 'nope'")


def test_problems_of_template_toml(tmp_path: Path) -> None:
    d = write_template(tmp_path, "bad", kind="promo", channels=("push", "fax"), extra_meta="one_time_code = 1\nowner = 'x'\n",
                       versions={1: V1})
    assert problems_of(d) == [
        "bad/template.toml: unknown key owner",
        "bad/template.toml: kind must be transactional or marketing",
        "bad/template.toml: one_time_code must be true or false",
        "bad/template.toml: channels must be a non-empty list of push, sms, email",
        "bad/v1.toml: en: channel(s) email, push, sms not in the template's channels",
        "bad/v1.toml: bn: channel(s) email, push, sms not in the template's channels",
    ]


def test_a_one_time_code_is_transactional(tmp_path: Path) -> None:
    d = write_template(tmp_path, "code", kind="marketing", extra_meta="one_time_code = true\n", versions={1: V1})
    assert problems_of(d) == ["code/template.toml: a one-time code is transactional, not marketing"]
    d = write_template(tmp_path, "twice", channels=("sms", "sms"), versions={1: V1})
    assert problems_of(d)[0] == "twice/template.toml: a channel is listed twice"


def test_problems_of_the_directory(tmp_path: Path) -> None:
    (tmp_path / "Bad Name").mkdir()
    assert problems_of(tmp_path / "Bad Name") == ["Bad Name: a template name is [a-z0-9][a-z0-9_.-]*, at most 64 characters"]
    (tmp_path / "empty").mkdir()
    assert problems_of(tmp_path / "empty") == ["empty: no template.toml"]
    d = write_template(tmp_path, "noversions")
    (d / "v1.tml").write_text("x")
    (d / "v0.toml").write_text("x")
    (d / ".swp").write_text("ignored")
    assert problems_of(d) == [
        "noversions/v0.toml: unexpected (versions are v1.toml, v2.toml, ...)",
        "noversions/v1.tml: unexpected (versions are v1.toml, v2.toml, ...)",
        "noversions: no versions (v1.toml, v2.toml, ...)",
    ]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "template.toml").write_text("kind = ")
    assert problems_of(tmp_path / "broken") == ["broken/template.toml: Invalid value (at end of document)"]


def test_problems_of_a_version(tmp_path: Path) -> None:
    body = all_channels("Sale")
    bad = (
        "published_at = 2026-01-01T00:00:00\n"  # no offset
        "[en.push]\ntitle = 'x'\n"
        "[en.sms]\ntext = '{{ pct }'\nvoice = 'x'\n"
        "[en.email]\nsubject = '  '\ntext = 'x'\nhtml = 3\n"
        "[fr]\npush = 'x'\n"
        "[EN_us.push]\ntitle = 'x'\nbody = 'y'\n"
    )
    d = write_template(tmp_path, "sale", versions={1: bad, 2: version("2026-01-01T00:00:00Z", {"bn": body})})
    assert problems_of(d) == [
        "sale/v1.toml: published_at must be a date-time with an offset, like 2026-03-01T00:00:00Z",
        "sale/v1.toml: en.push.body: missing",
        "sale/v1.toml: en.sms: unknown part(s) voice",
        "sale/v1.toml: en.sms.text: line 1: unexpected '}'",
        "sale/v1.toml: en.email.subject: must be a non-blank string",
        "sale/v1.toml: en.email.html: must be a non-blank string",
        "sale/v1.toml: fr.push: must be a table of title, body",
        "sale/v1.toml: fr.sms: missing",
        "sale/v1.toml: fr.email: missing",
        "sale/v1.toml: 'EN_us' is not a locale in canonical form (bn, en, en-US)",
        "sale/v2.toml: no bodies in the default locale en",
    ]


def test_versions_are_published_in_order(tmp_path: Path) -> None:
    d = write_template(tmp_path, "sale", versions={1: V1, 2: version("2025-06-01T00:00:00Z", {"en": all_channels("Old")})})
    assert problems_of(d) == ["sale/v2.toml: published_at must be later than v1's"]


def test_scan_keeps_the_good_and_lists_the_bad(tmp_path: Path) -> None:
    write_template(tmp_path, "good", versions={1: V1})
    write_template(tmp_path, "bad", versions={1: V1.replace("title", "headline", 1)})
    (tmp_path / "README.md").write_text("not a template")
    templates, problems = scan(tmp_path, OPTS)
    assert list(templates) == ["good"]
    assert problems == ["bad/v1.toml: en.push: unknown part(s) headline", "bad/v1.toml: en.push.title: missing"]
    with pytest.raises(TemplateConfigError) as info:
        load_catalog(OPTS, tmp_path)
    assert info.value.problems == tuple(problems)
    assert scan(tmp_path / "nowhere", OPTS) == ({}, [f"{tmp_path / 'nowhere'}: not a directory"])


def test_the_default_locale_is_configurable(tmp_path: Path) -> None:
    write_template(tmp_path, "bn_only", versions={1: version("2026-01-01T00:00:00Z", {"bn": all_channels("সেল")})})
    assert scan(tmp_path, OPTS)[1] == ["bn_only/v1.toml: no bodies in the default locale en"]
    assert list(load_catalog(TemplateOptions(default_locale="bn"), tmp_path).templates) == ["bn_only"]


def test_the_directory_comes_from_the_options(tmp_path: Path) -> None:
    write_template(tmp_path / "tpl", "sale", versions={1: V1})
    assert list(load_catalog(TemplateOptions(directory=str(tmp_path / "tpl"))).templates) == ["sale"]
