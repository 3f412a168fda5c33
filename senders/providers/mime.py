"""An email's bytes as SMTP carries them (pure): headers, then multipart/alternative with the
plain text and the HTML, each in UTF-8, every line CRLF-ended and within SMTP's 998 octets.

Built from parts rather than with ``email.message.EmailMessage``: building and flattening one
took 1.8-3 ms of CPU per email (header objects parsed and re-parsed, the generator's boundary
scan), far over the senders' budget of 250 us per message for everything. What needs encoding
goes through the standard library (a header that is not printable ASCII on one line is folded
by ``email.policy.SMTP``; bodies are encoded by ``binascii`` and ``base64``) but for the one such
header of most messages, a non-ASCII subject: ``subject`` writes its RFC 2047 words itself.
``tests/senders/test_mime.py`` parses the results back with ``email.policy.default``.
"""

from __future__ import annotations

import base64
import binascii
import email.policy
import functools
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.headerregistry import AddressHeader, BaseHeader
from email.utils import format_datetime

CRLF = b"\r\n"
#: the longest line SMTP carries (RFC 5321), CRLF excluded
MAX_LINE = 998
#: written as it is: printable ASCII (no CR, LF or other control character)
_PLAIN = re.compile(r"[\x20-\x7e]*")
#: an address written as it is: a dot-atom local part and domain (no display name, no comma)
_ADDR_SPEC = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@[A-Za-z0-9.-]+")
#: the bytes of one encoded word: 56 characters of base64, 68 with its frame, "Subject: " and
#: one such word within a line of 78 (RFC 2047 allows 75 per word)
_WORD_BYTES = 42
#: a line longer than SMTP carries
_LONG_LINE = re.compile(rb"[^\n]{%d}" % (MAX_LINE + 1))


def header(name: str, value: str) -> str:
    """``Name: value`` and CRLF. Printable ASCII that fits a line is written as it is, on one
    line (so a long ``<https://...>`` List-Unsubscribe stays a URL: folded, it would become
    encoded words that no mail client reads as one); anything else is folded and encoded by the
    standard library. A value with a CR or LF raises ValueError, as the standard library does."""
    if len(name) + 2 + len(value) <= MAX_LINE and _PLAIN.fullmatch(value):
        return f"{name}: {value}\r\n"
    parsed = email.policy.SMTP.header_store_parse(name, value)[1]  # ValueError for a CR or LF
    if not isinstance(parsed, BaseHeader):
        raise TypeError(f"{name}: not a header object")
    return parsed.fold(policy=email.policy.SMTP)


def subject(value: str) -> str:
    """The Subject header: as it is if it is printable ASCII that fits a line, else RFC 2047
    "B" encoded words of its UTF-8, one per line, each cut before a character's first byte (the
    standard library's folding took 140-940 us for one, ``email.header.Header`` 24-2,900)."""
    if len(value) <= MAX_LINE - len("Subject: ") and _PLAIN.fullmatch(value):
        return f"Subject: {value}\r\n"
    if "\r" in value or "\n" in value:
        raise ValueError("Header values may not contain linefeed or carriage return characters")
    data, words, start = value.encode("utf-8"), [], 0
    while start < len(data):
        end = min(start + _WORD_BYTES, len(data))
        while end < len(data) and 0x80 <= data[end] < 0xC0:  # a continuation byte: not a character's start
            end -= 1
        words.append(f"=?utf-8?b?{base64.b64encode(data[start:end]).decode('ascii')}?=")
        start = end
    return "Subject: " + "\r\n ".join(words) + "\r\n"


@functools.lru_cache(maxsize=2)
def date(second: int) -> str:
    """The Date header of a time (seconds since the epoch), in UTC."""
    return header("Date", format_datetime(datetime.fromtimestamp(second, UTC)))


@dataclass(frozen=True, slots=True)
class Mailbox:
    """An address header and the envelope's addresses it names.

    :param header: the folded header line(s), CRLF-ended
    :param addresses: the addresses for the envelope (MAIL FROM, RCPT TO)
    :param utf8: an address is not ASCII: the message needs the SMTPUTF8 extension
    """

    header: str
    addresses: tuple[str, ...]
    utf8: bool


def mailbox(name: str, value: str) -> Mailbox:
    """From or To: a bare ASCII address as it is; anything else (a display name, a non-ASCII
    address) parsed and folded by the standard library, its addresses taken from the parse as
    ``aiosmtplib``'s ``send_message`` takes them. Raises ValueError for a CR or LF."""
    if len(name) + 2 + len(value) <= MAX_LINE and _ADDR_SPEC.fullmatch(value):
        return Mailbox(f"{name}: {value}\r\n", (value,), False)
    parsed = email.policy.SMTP.header_store_parse(name, value)[1]
    if not isinstance(parsed, AddressHeader) or not isinstance(parsed, BaseHeader):
        raise TypeError(f"{name} is not an address header")
    addresses = tuple(a.addr_spec for a in parsed.addresses)
    if not addresses:
        raise ValueError(f"no address in {name}")
    utf8 = not all(a.isascii() for a in addresses)  # a display name is encoded: no SMTPUTF8 for it
    policy = email.policy.SMTPUTF8 if utf8 else email.policy.SMTP
    return Mailbox(parsed.fold(policy=policy), addresses, utf8)


def _encoded(text: str, boundary: bytes) -> tuple[str, bytes]:
    """A text part's Content-Transfer-Encoding and body (UTF-8, CRLF lines, ending with one):
    7bit for ASCII without NUL in lines SMTP carries that never holds the boundary; else the
    shorter of quoted-printable and base64 (lines of at most 76), as the standard library's
    ``set_content`` chooses between them."""
    data = text.replace("\r\n", "\n").replace("\r", "\n").encode("utf-8")
    if not data.endswith(b"\n"):
        data += b"\n"
    if data.isascii() and b"\0" not in data and boundary not in data and not _LONG_LINE.search(data):
        return "7bit", data.replace(b"\n", CRLF)
    qp = binascii.b2a_qp(data, istext=True)  # "\n" stays a line break; "=" and trailing spaces escaped
    b64 = base64.encodebytes(data)
    cte, body = ("quoted-printable", qp) if len(qp) <= len(b64) else ("base64", b64)
    return cte, body.replace(b"\n", CRLF)


def _part(subtype: str, text: str, boundary: bytes) -> bytes:
    cte, body = _encoded(text, boundary)
    head = f'Content-Type: text/{subtype}; charset="utf-8"\r\nContent-Transfer-Encoding: {cte}\r\n\r\n'
    return head.encode("ascii") + body


def alternative(headers: Iterable[str], text: str, html: str) -> bytes:
    """The whole message: ``headers`` (each a CRLF-ended line from ``header`` or ``mailbox``),
    MIME-Version, then multipart/alternative of the plain text and the HTML. The boundary is
    random, starts with ``=_`` (never in quoted-printable or base64) and is checked against
    the 7bit bodies. Each body ends with a line break of its own: the CRLF before a boundary
    belongs to the boundary (RFC 2046)."""
    token = "=_" + secrets.token_hex(12)
    boundary = token.encode("ascii")
    head = "".join(headers).encode("utf-8")  # ASCII but for raw UTF-8 addresses (SMTPUTF8)
    return b"".join((
        head,
        b'MIME-Version: 1.0\r\nContent-Type: multipart/alternative; boundary="', boundary, b'"\r\n\r\n',
        b"--", boundary, CRLF, _part("plain", text, boundary),
        CRLF, b"--", boundary, CRLF, _part("html", html, boundary),
        CRLF, b"--", boundary, b"--", CRLF,
    ))
