"""The one rule for a user id (pure), used wherever one comes in: the API's paths and bodies
(notifications, profiles, devices, campaign segments) and ``dedupctl users``.

A user id is 1 to ``max_bytes`` UTF-8 bytes (the job's ``dedup.max_field_bytes``, so every id
a profile can have fits a request), printable (no NUL, no control or separator characters but
the space), without surrounding whitespace, and without ``/``: a user id is a path segment of
the API (``/v1/users/{id}``), and a ``/`` (even sent as ``%2F``) would make it another path.
"""

from __future__ import annotations

RULE = "1 to {max} UTF-8 bytes of printable text, no surrounding spaces, no /"


def user_id_problem(user_id: str, max_bytes: int) -> str | None:
    """Why ``user_id`` is not a user id, or None."""
    if not user_id:
        return "a user id must not be empty"
    try:
        size = len(user_id.encode("utf-8"))
    except UnicodeEncodeError:
        return "a user id must be UTF-8 text"
    if size > max_bytes:
        return f"a user id has at most {max_bytes} UTF-8 bytes (dedup.max_field_bytes); this one has {size}"
    if not user_id.isprintable():
        return "a user id must be printable text (no NUL or control characters)"
    if user_id != user_id.strip():
        return "a user id has no surrounding spaces"
    if "/" in user_id:
        return "a user id has no /"
    return None
