"""An email's bytes (senders.providers.mime) parsed back with the standard library's default
policy: every header and both bodies as given, in lines SMTP carries, for ASCII and Bengali,
short and long lines, and text that holds the boundary or CRs."""

from __future__ import annotations

import base64
import email.policy
import re
from email import message_from_bytes
from email.message import EmailMessage

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from senders.providers import mime

LONG = "word " * 300  # one line of 1,500 characters: longer than SMTP carries


def _build(*, subject: str = "Hi", text: str = "Hello\n", html: str = "<p>Hello</p>\n", to: str = "ann@example.com",
           sender: str = "Notify <noreply@example.com>") -> bytes:
    headers = [
        mime.mailbox("From", sender).header,
        mime.mailbox("To", to).header,
        mime.subject(subject),
        mime.date(1_796_115_600),
        mime.header("Message-ID", "<abc@notify-dedup>"),
        mime.header("X-Notify-Message-Key", "k" * 120 + ":email:1796115600000"),
        mime.header("List-Unsubscribe", f"<https://notify.example.com/unsubscribe?u=user-1&t={'T' * 200}>"),
        mime.header("List-Unsubscribe-Post", "List-Unsubscribe=One-Click"),
        mime.header("Content-Language", "bn"),
    ]
    return mime.alternative(headers, text, html)


def _parse(data: bytes) -> EmailMessage:
    msg = message_from_bytes(data, policy=email.policy.default)
    assert isinstance(msg, EmailMessage)
    return msg


def _lines_carried(data: bytes) -> None:
    """CRLF line ends only, every line within 998 octets."""
    assert b"\r" not in data.replace(b"\r\n", b"") and b"\n" not in data.replace(b"\r\n", b"")
    assert max(len(line) for line in data.split(b"\r\n")) <= mime.MAX_LINE


def _words_whole(data: bytes) -> None:
    """Each RFC 2047 encoded word of the headers is at most 75 characters and decodes to whole
    characters by itself (RFC 2047 section 5: a word never splits a character)."""
    head = data.split(b"\r\n\r\n", 1)[0].decode("utf-8")
    for word in re.findall(r"=\?utf-8\?b\?([^?]*)\?=", head):
        assert len(word) + 12 <= 75
        base64.b64decode(word, validate=True).decode("utf-8")  # strict: raises on a split character


def _content(part: EmailMessage) -> str:
    content = part.get_content()
    assert isinstance(content, str)
    return content.replace("\r\n", "\n")


def _normal(text: str) -> str:
    """What a body reads as: line breaks as LF, and one at the end."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text if text.endswith("\n") else text + "\n"


def _bodies(msg: EmailMessage) -> tuple[EmailMessage, EmailMessage]:
    assert msg.get_content_type() == "multipart/alternative"
    text, html = msg.iter_parts()
    assert isinstance(text, EmailMessage) and isinstance(html, EmailMessage)
    assert (text.get_content_type(), html.get_content_type()) == ("text/plain", "text/html")
    assert text.get_content_charset() == html.get_content_charset() == "utf-8"
    return text, html


def test_every_header_and_both_bodies_read_back_as_given() -> None:
    data = _build(subject="Eid sale: 20% off", text="Eid Mubarak!\n\nEverything is 20% off.\n",
                  html="<h1>Eid Mubarak!</h1>\n<p>20% off</p>\n")
    _lines_carried(data)
    msg = _parse(data)
    assert not msg.defects
    assert msg["From"] == "Notify <noreply@example.com>" and msg["From"].addresses[0].addr_spec == "noreply@example.com"
    assert msg["To"] == "ann@example.com"
    assert msg["Subject"] == "Eid sale: 20% off"
    assert msg["Date"].datetime.timestamp() == 1_796_115_600 and msg["Date"].datetime.utcoffset().total_seconds() == 0
    assert msg["Message-ID"] == "<abc@notify-dedup>"
    assert msg["X-Notify-Message-Key"] == "k" * 120 + ":email:1796115600000"
    assert msg["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert msg["Content-Language"] == "bn" and msg["MIME-Version"] == "1.0"
    text, html = _bodies(msg)
    assert _content(text) == "Eid Mubarak!\n\nEverything is 20% off.\n"
    assert _content(html) == "<h1>Eid Mubarak!</h1>\n<p>20% off</p>\n"
    assert text["Content-Transfer-Encoding"] == html["Content-Transfer-Encoding"] == "7bit"
    for name in ("From", "To", "Subject", "Date", "Message-ID", "X-Notify-Message-Key", "List-Unsubscribe",
                 "List-Unsubscribe-Post", "MIME-Version", "Content-Type", "Content-Language"):
        assert len(msg.get_all(name, [])) == 1, name


def test_the_unsubscribe_link_and_the_key_are_each_on_one_line_as_they_are() -> None:
    data = _build()
    link = f"<https://notify.example.com/unsubscribe?u=user-1&t={'T' * 200}>"
    assert f"\r\nList-Unsubscribe: {link}\r\n".encode() in data  # no RFC 2047 words: a client reads the URL
    assert b"\r\nList-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n" in data
    assert f"\r\nX-Notify-Message-Key: {'k' * 120}:email:1796115600000\r\n".encode() in data
    assert _parse(data)["List-Unsubscribe"] == link


def test_bengali_subject_and_bodies_are_encoded_and_read_back() -> None:
    subject = "ঈদ সেল: 20% ছাড় — " * 8  # non-ASCII, longer than a line: several encoded words
    text = "ঈদ মোবারক!\n\nএই সপ্তাহে সবকিছুতে 20% ছাড়।\n"
    html = "<h1>ঈদ মোবারক!</h1>\n<p>এই সপ্তাহে সবকিছুতে <strong>20% ছাড়</strong>।</p>\n"
    data = _build(subject=subject.strip(), text=text, html=html)
    data.decode("ascii")  # 7-bit clean: no 8BITMIME needed
    _lines_carried(data)
    _words_whole(data)
    head = data.split(b"\r\n\r\n", 1)[0].decode("ascii")
    assert all(len(line) <= 78 for line in head.split("\r\n") if "=?utf-8?" in line)
    msg = _parse(data)
    assert not msg.defects
    assert msg["Subject"] == subject.strip()
    text_part, html_part = _bodies(msg)
    assert (_content(text_part), _content(html_part)) == (text, html)
    assert text_part["Content-Transfer-Encoding"] == "base64"  # shorter than quoted-printable for Bengali


def test_long_lines_are_wrapped_by_the_encoding_and_read_back_whole() -> None:
    html = f"<p>{LONG}</p>"  # ASCII, one line of 1,500, no final line break
    text = f"café {LONG}\n"
    data = _build(text=text, html=html)
    _lines_carried(data)
    text_part, html_part = _bodies(_parse(data))
    assert html_part["Content-Transfer-Encoding"] == "quoted-printable"  # mostly ASCII: shorter than base64
    assert (_content(text_part), _content(html_part)) == (text, html + "\n")


def test_a_long_ascii_subject_is_encoded_rather_than_cut() -> None:
    subject = "x" * 1200
    data = _build(subject=subject)
    _lines_carried(data)
    assert _parse(data)["Subject"] == subject


def test_a_body_holding_the_boundary_or_crs_reads_back_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mime.secrets, "token_hex", lambda n: "0" * (2 * n))
    boundary = "=_" + "0" * 24
    text = f"line one\r\n--{boundary}\r\nline three\rline four"
    data = _build(text=text, html=f"--{boundary}--\n")
    _lines_carried(data)
    text_part, html_part = _bodies(_parse(data))
    assert text_part["Content-Transfer-Encoding"] == "quoted-printable"
    assert _content(text_part) == "line one\n--" + boundary + "\nline three\nline four\n"
    assert _content(html_part) == f"--{boundary}--\n"


def test_a_mailbox_other_than_a_bare_address_goes_through_the_standard_library() -> None:
    named = mime.mailbox("From", "Nöti Fy <noreply@example.com>")
    assert named.addresses == ("noreply@example.com",) and not named.utf8
    assert named.header.isascii() and _parse((named.header + "\r\n").encode())["From"] == "Nöti Fy <noreply@example.com>"
    bare = mime.mailbox("To", "ann@example.com")
    assert bare == mime.Mailbox("To: ann@example.com\r\n", ("ann@example.com",), False)
    wide = mime.mailbox("To", "অনু@example.com")
    assert wide.utf8 and wide.addresses == ("অনু@example.com",) and wide.header == "To: অনু@example.com\r\n"
    listed = mime.mailbox("To", "ann@example.com, bob@example.com")
    assert listed.addresses == ("ann@example.com", "bob@example.com")


@pytest.mark.parametrize("value", ["evil\r\nBcc: x@example.com", "evil\nBcc: x@example.com"])
def test_a_line_break_in_a_header_value_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="linefeed"):
        mime.header("X-Notify-Message-Key", value)
    with pytest.raises(ValueError, match="linefeed"):
        mime.subject(value + " ঈদ")
    with pytest.raises(ValueError):
        mime.mailbox("To", "ann@example.com" + value)


_SUBJECTS = st.text(st.characters(exclude_categories=["Cs", "Cc", "Zl", "Zp"]), max_size=300).map(
    lambda s: " ".join(s.split()))  # what rendering leaves of a subject: one line, single spaces
_BODIES = st.text(st.characters(exclude_categories=["Cs"]), max_size=2000)


@settings(max_examples=200, deadline=None)
@given(subject=_SUBJECTS, text=_BODIES, html=_BODIES)
def test_any_subject_and_bodies_read_back_as_given(subject: str, text: str, html: str) -> None:
    data = _build(subject=subject, text=text, html=html)
    _lines_carried(data)
    _words_whole(data)
    msg = _parse(data)
    assert msg["Subject"] == subject
    text_part, html_part = _bodies(msg)
    assert (_content(text_part), _content(html_part)) == (_normal(text), _normal(html))
    assert re.fullmatch(r"7bit|quoted-printable|base64", str(text_part["Content-Transfer-Encoding"]))
