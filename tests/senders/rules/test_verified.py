"""A contact's ``verified`` flag at send time (issue 20: the senders never read it): marketing
never goes to an unverified address; a transactional template goes to verified ones only, unless
it says ``allow_unverified = true`` (the one-time code, which verifies the address itself); a
channel with only unverified addresses is skipped with ``no_verified_address``."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from operators.records import Category, Channel
from senders.profiles.model import Profile, parse_profile
from senders.rules.decision import Decision, RuleMessage, decide, deliverable, limit_claims
from senders.rules.options import RuleOptions
from senders.rules.reasons import Outcome, Reason
from senders.templates.catalog import load_catalog, load_template
from senders.templates.options import TemplateOptions
from settings import REPO_ROOT

OPTS = RuleOptions()
CATALOG = load_catalog(TemplateOptions(), REPO_ROOT / "templates")
DAY = int(datetime.fromisoformat("2026-12-02T10:00:00+06:00").timestamp() * 1000)


def recipient(channel: Channel, address: str) -> str:
    return f"h({address[-4:]})"


@pytest.fixture
def user() -> Profile:
    return parse_profile({
        "tz": "Asia/Dhaka",
        "contacts": {
            "sms": [{"address": "+8801711000001", "verified": False}, "+8801711000002",
                    {"address": "+8801711000003", "verified": True, "active": False}],
            "email": [{"address": "new@example.com", "verified": False}],
            "push": ["tok-1"],
        },
    })


def msg(template: str, channel: Channel) -> RuleMessage:
    return RuleMessage.of(CATALOG.get(template), channel=channel, user_id="u1", notification_id="n1",
                          message_key=f"n1:{channel.value}")


def run(m: RuleMessage, user: Profile) -> Decision:
    return decide(m, user, user.contacts, {}, DAY, OPTS, recipient)


def to(d: Decision) -> list[str]:
    return [c.address for c in d.addresses]


def test_the_short_form_is_verified_and_the_long_form_says_so() -> None:
    contacts = parse_profile({"contacts": {"sms": ["+8801711000002", {"address": "+8801711000001",
                                                                         "verified": False}]}}).contacts
    assert [(c.address, c.verified) for c in contacts.sms] == [("+8801711000002", True), ("+8801711000001", False)]


def test_marketing_goes_to_verified_addresses_only(user: Profile) -> None:
    d = run(msg("eid_sale", Channel.SMS), user)
    assert (d.outcome, to(d)) == (Outcome.SEND, ["+8801711000002"])
    assert run(msg("eid_sale", Channel.EMAIL), user) == Decision(Outcome.SKIPPED, Reason.NO_VERIFIED_ADDRESS)
    assert run(msg("weekly_digest", Channel.EMAIL), user) == Decision(Outcome.SKIPPED, Reason.NO_VERIFIED_ADDRESS)


def test_a_transactional_template_goes_to_verified_addresses_only(user: Profile) -> None:
    d = run(msg("order_shipped", Channel.SMS), user)
    assert (d.outcome, to(d)) == (Outcome.SEND, ["+8801711000002"])
    assert run(msg("payment_update", Channel.EMAIL), user) == Decision(Outcome.SKIPPED, Reason.NO_VERIFIED_ADDRESS)
    assert run(msg("order_shipped", Channel.PUSH), user).outcome is Outcome.SEND


def test_the_one_time_code_verifies_the_address_itself_so_it_may_go_to_an_unverified_one(user: Profile) -> None:
    assert CATALOG.get("otp").allow_unverified is True
    m = msg("otp", Channel.SMS)
    d = run(m, user)
    assert (d.outcome, to(d)) == (Outcome.SEND, ["+8801711000001", "+8801711000002"])  # never the inactive one
    # its abuse limit counts every recipient it goes to, the unverified one included
    assert [c.key.split(":")[1] for c in limit_claims(m, user, user.contacts, DAY, OPTS, recipient)] == [
        "h(0001)", "h(0002)"]


def test_no_active_address_is_still_no_address(user: Profile) -> None:
    only_inactive = parse_profile({"contacts": {"sms": [{"address": "+8801711000003", "active": False}]}})
    assert run(msg("order_shipped", Channel.SMS), only_inactive) == Decision(Outcome.SKIPPED, Reason.NO_ADDRESS)
    assert run(msg("otp", Channel.SMS), only_inactive) == Decision(Outcome.SKIPPED, Reason.NO_ADDRESS)


def test_marketing_never_goes_unverified_even_if_asked() -> None:
    contacts = parse_profile({"contacts": {"sms": [{"address": "+8801711000001", "verified": False}]}}).contacts
    assert deliverable(contacts, Channel.SMS, Category.MARKETING, allow_unverified=True) == ()
    assert [c.address for c in deliverable(contacts, Channel.SMS, Category.TRANSACTIONAL, True)] == ["+8801711000001"]


def _template(root: Path, meta: str) -> tuple[object, list[str]]:
    d = root / "t"
    d.mkdir()
    (d / "template.toml").write_text(meta, encoding="utf-8")
    (d / "v1.toml").write_text('published_at = 2025-01-01T00:00:00Z\n[en.sms]\ntext = "hi"\n', encoding="utf-8")
    return load_template(d, TemplateOptions())


def test_allow_unverified_is_for_transactional_templates_only(tmp_path: Path) -> None:
    template, problems = _template(tmp_path, 'kind = "marketing"\nchannels = ["sms"]\nallow_unverified = true\n')
    assert template is None and problems == [
        "t/template.toml: marketing never goes to an unverified address (allow_unverified is for transactional"
        " templates)"]


def test_allow_unverified_must_be_a_boolean(tmp_path: Path) -> None:
    _, problems = _template(tmp_path, 'kind = "transactional"\nchannels = ["sms"]\nallow_unverified = "yes"\n')
    assert problems == ["t/template.toml: allow_unverified must be true or false"]
