"""SMS length in segments, as the networks count it.

GSM-7 when every character is in the GSM 03.38 default alphabet or its extension table (an
extension character, such as ``€`` or ``{``, costs two septets: the escape and itself): 160
septets in a single message, 153 per segment of a concatenated one. Otherwise UCS-2: 70 UTF-16
code units single, 67 per segment, a character outside the Basic Multilingual Plane (most emoji)
costing two. A two-unit character is never split across segments, as real encoders do.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

_BASIC = frozenset(
    "@£$¥èéùìòÇ\nØø\rÅå"
    "Δ_ΦΓΛΩΠΨΣΘΞÆæßÉ"  # 0x1B, the escape, is left out: it is not a character of the text
    " !\"#¤%&'()*+,-./"
    "0123456789:;<=>?"
    "¡ABCDEFGHIJKLMNO"
    "PQRSTUVWXYZÄÖÑÜ§"
    "¿abcdefghijklmno"
    "pqrstuvwxyzäöñüà"
)
_EXTENSION = frozenset("\f^{}\\[~]|€")
_GSM7 = _BASIC | _EXTENSION


class SmsEncoding(StrEnum):
    GSM7 = "gsm7"
    UCS2 = "ucs2"


@dataclass(frozen=True, slots=True)
class SmsLength:
    """:param units: septets (GSM-7) or UTF-16 code units (UCS-2) of the whole text"""

    encoding: SmsEncoding
    units: int
    segments: int


def sms_length(text: str) -> SmsLength:
    """The encoding, size and segments of an SMS text (an empty text is one segment). Counted
    per distinct character: a text's characters are few, and one test of each is cheaper than a
    test of every character (a send renders one of these per message)."""
    chars = set(text)
    if chars <= _GSM7:
        encoding, single, per_segment = SmsEncoding.GSM7, 160, 153
        double = chars & _EXTENSION
    else:
        encoding, single, per_segment = SmsEncoding.UCS2, 70, 67
        double = {c for c in chars if ord(c) > 0xFFFF}
    units = len(text) + sum(text.count(c) for c in double)
    if units <= single:
        return SmsLength(encoding, units, 1)
    segments, used = 1, 0
    for c in text:
        cost = 2 if c in double else 1
        if used + cost > per_segment:
            segments, used = segments + 1, 0
        used += cost
    return SmsLength(encoding, units, segments)
