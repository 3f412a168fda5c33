"""SMS segments: GSM-7 with its extension table, UCS-2 in UTF-16 code units."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from senders.templates.sms import SmsEncoding, SmsLength, sms_length

GSM = SmsEncoding.GSM7
UCS = SmsEncoding.UCS2
BASIC_SAMPLE = "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?¡AZÄÖÑÜ§¿azäöñüà"


@pytest.mark.parametrize(("text", "expected"), [
    ("", SmsLength(GSM, 0, 1)),
    ("a" * 160, SmsLength(GSM, 160, 1)),
    ("a" * 161, SmsLength(GSM, 161, 2)),
    ("a" * 306, SmsLength(GSM, 306, 2)),
    ("a" * 307, SmsLength(GSM, 307, 3)),
    (BASIC_SAMPLE, SmsLength(GSM, len(BASIC_SAMPLE), 1)),
])
def test_gsm7(text: str, expected: SmsLength) -> None:
    assert sms_length(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("€" * 80, SmsLength(GSM, 160, 1)),
    ("€" * 81, SmsLength(GSM, 162, 2)),
    ("{}[]~^|\\\f€", SmsLength(GSM, 20, 1)),
    ("a" * 159 + "€", SmsLength(GSM, 161, 2)),
    # 306 septets would fit two segments, but the escape and its character are never split
    ("a" * 152 + "€" + "a" * 152, SmsLength(GSM, 306, 3)),
])
def test_extension_characters_cost_two_septets(text: str, expected: SmsLength) -> None:
    assert sms_length(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("অ" * 70, SmsLength(UCS, 70, 1)),
    ("অ" * 71, SmsLength(UCS, 71, 2)),
    ("অ" * 134, SmsLength(UCS, 134, 2)),
    ("অ" * 135, SmsLength(UCS, 135, 3)),
    ("a" * 100 + "ç", SmsLength(UCS, 101, 2)),  # one character outside GSM-7 makes it all UCS-2
    ("`", SmsLength(UCS, 1, 1)),
    ("\t", SmsLength(UCS, 1, 1)),
    ("😀" * 35, SmsLength(UCS, 70, 1)),
    ("😀" * 36, SmsLength(UCS, 72, 2)),
    # 134 units would fit two segments, but a surrogate pair is never split
    ("অ" * 66 + "😀" * 34, SmsLength(UCS, 134, 3)),
    ("আপনার কোড 123456।", SmsLength(UCS, 17, 1)),
])
def test_ucs2_counts_utf16_code_units(text: str, expected: SmsLength) -> None:
    assert sms_length(text) == expected


@given(st.text(alphabet=BASIC_SAMPLE, max_size=1000))
def test_basic_gsm7_against_the_formula(text: str) -> None:
    n = len(text)
    assert sms_length(text) == SmsLength(GSM, n, 1 if n <= 160 else math.ceil(n / 153))


@given(st.text(alphabet=st.characters(min_codepoint=0x0980, max_codepoint=0x09FF), min_size=1, max_size=500))
def test_bmp_ucs2_against_the_formula(text: str) -> None:
    n = len(text)
    assert sms_length(text) == SmsLength(UCS, n, 1 if n <= 70 else math.ceil(n / 67))


@given(st.text(max_size=400))
def test_segments_hold_every_unit(text: str) -> None:
    length = sms_length(text)
    single, per = (160, 153) if length.encoding is GSM else (70, 67)
    if length.units <= single:
        assert length.segments == 1
    else:
        assert math.ceil(length.units / per) <= length.segments <= math.ceil(length.units / (per - 1))
    if length.encoding is UCS:
        assert length.units == len(text.encode("utf-16-le")) // 2
    else:
        assert length.units == len(text) + sum(c in "\f^{}\\[~]|€" for c in text)
