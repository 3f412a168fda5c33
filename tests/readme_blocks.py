"""The README's shell walk-throughs as steps a test can run (pure): the shell blocks of "A session
by hand" and of "The HTTP API", each split into commands (a line, with its ``\\`` continuations)
and the answer the README shows under a command (``# {...}`` lines, JSON with ``...`` for what it
leaves out: another member of an object, or any text inside a string).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

FENCE = re.compile(r"^```bash\n(.*?)^```$", re.S | re.M)
#: what stands for the members of an object the README leaves out
MORE = "\u2026more"


@dataclass(frozen=True, slots=True)
class Step:
    """One command of a block, and the answer the README shows under it (None: none shown)."""

    command: str
    expected: Any = None
    shown: str = ""  # the answer as the README writes it


def walkthrough_blocks(readme: str) -> list[str]:
    """The shell blocks of the walk-throughs, in their order: the one after "A session by hand",
    then those of the section "The HTTP API". Raises ValueError when the README has none of them
    (a test must not pass on a README it cannot read)."""
    blocks: list[str] = []
    by_hand = readme.find("A session by hand")
    if by_hand >= 0:
        first = FENCE.search(readme, by_hand)
        if first is not None:
            blocks.append(first.group(1))
    section = re.search(r"^## The HTTP API.*?(?=^## )", readme, re.S | re.M)
    if section is not None:
        blocks += [m.group(1) for m in FENCE.finditer(section.group(0))]
    if len(blocks) < 2:
        raise ValueError("the README's walk-throughs (A session by hand, The HTTP API) have no shell blocks")
    return blocks


def _without_ellipses(text: str) -> str:
    """``...`` outside a string (an object's left-out members) as a member the matcher knows."""
    out, in_string, escaped, i = [], False, False, 0
    while i < len(text):
        c = text[i]
        if in_string:
            escaped = c == "\\" and not escaped
            in_string = not (c == '"' and not escaped)
            out.append(c)
        elif text.startswith("...", i):
            out.append(json.dumps(MORE) + ": null")
            i += 3
            continue
        else:
            in_string = c == '"'
            out.append(c)
        i += 1
    return "".join(out)


def parse_answer(text: str) -> Any:
    """The answer a README shows, as a pattern for ``mismatches``; raises ValueError."""
    return json.loads(_without_ellipses(text))


def steps(block: str) -> list[Step]:
    """The commands of a block with the answers shown under them. A comment line that starts with
    ``{`` or ``[`` right under a command begins its answer, which runs over the comment lines
    after it until it parses; other comments are the README's words."""
    out: list[Step] = []
    lines = block.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        i += 1
        if not stripped:
            continue
        if stripped.startswith("#"):
            body = stripped[1:].strip()
            if out and out[-1].expected is None and body.startswith(("{", "[")) and _follows_command(lines, i - 1):
                shown = body
                while True:
                    try:
                        pattern = parse_answer(shown)
                        break
                    except ValueError:
                        if i >= len(lines) or not lines[i].strip().startswith("#"):
                            raise ValueError(f"the answer shown under {out[-1].command!r} is not JSON: {shown}") from None
                        shown += " " + lines[i].strip()[1:].strip()
                        i += 1
                out[-1] = Step(out[-1].command, pattern, shown)
            continue
        command = line
        while command.endswith("\\") and i < len(lines):
            command += "\n" + lines[i]
            i += 1
        out.append(Step(command))
    return out


def _follows_command(lines: list[str], index: int) -> bool:
    """Whether the line at ``index`` comes right under a command (not under a comment or a blank)."""
    before = lines[index - 1].strip() if index > 0 else ""
    return bool(before) and not before.startswith("#")


def _text_matches(pattern: str, value: str) -> bool:
    if "..." not in pattern:
        return pattern == value
    return re.fullmatch(".*".join(re.escape(part) for part in pattern.split("...")), value, re.S) is not None


def mismatches(pattern: Any, value: Any, where: str = "") -> list[str]:
    """How ``value`` (an answer) differs from ``pattern`` (what the README shows): every member
    shown is there with what it shows; an object without ``...`` has no other members; a string
    with ``...`` matches any text there. Empty: it matches."""
    here = where or "the answer"
    if isinstance(pattern, dict):
        if not isinstance(value, dict):
            return [f"{here}: an object shown, {type(value).__name__} given"]
        problems = []
        for key, wanted in pattern.items():
            if key == MORE:
                continue
            if key not in value:
                problems.append(f"{here}: no {key!r}")
            else:
                problems += mismatches(wanted, value[key], f"{where}.{key}" if where else key)
        if MORE not in pattern:
            problems += [f"{here}: {key!r} is not shown in the README" for key in value if key not in pattern]
        return problems
    if isinstance(pattern, list):
        if not isinstance(value, list) or len(value) != len(pattern):
            return [f"{here}: {len(pattern)} items shown, {value!r} given"]
        return [p for n, (a, b) in enumerate(zip(pattern, value, strict=True)) for p in mismatches(a, b, f"{here}[{n}]")]
    if isinstance(pattern, str) and isinstance(value, str):
        return [] if _text_matches(pattern, value) else [f"{here}: {value!r}, shown as {pattern!r}"]
    return [] if pattern == value and type(pattern) is type(value) else [f"{here}: {value!r}, shown as {pattern!r}"]
