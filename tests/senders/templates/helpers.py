"""Writing small template directories for the tests."""

from __future__ import annotations

from pathlib import Path

META = 'kind = "{kind}"\nchannels = [{channels}]\n'

PARTS = {
    "push": '[{loc}.push]\ntitle = "{title}"\nbody = "{body}"\n',
    "sms": '[{loc}.sms]\ntext = "{text}"\n',
    "email": "[{loc}.email]\nsubject = \"{subject}\"\ntext = '''{text}'''\nhtml = '''{html}'''\n",
}


def write_template(
    root: Path,
    name: str,
    *,
    kind: str = "marketing",
    channels: tuple[str, ...] = ("push", "sms", "email"),
    extra_meta: str = "",
    versions: dict[int, str] | None = None,
) -> Path:
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    listed = ", ".join(f'"{c}"' for c in channels)
    (directory / "template.toml").write_text(META.format(kind=kind, channels=listed) + extra_meta, encoding="utf-8")
    for number, text in (versions or {}).items():
        (directory / f"v{number}.toml").write_text(text, encoding="utf-8")
    return directory


def version(published: str, bodies: dict[str, dict[str, dict[str, str]]]) -> str:
    """A version file: ``bodies`` is locale -> channel -> part -> source."""
    out = [f"published_at = {published}\n"]
    for loc, channels in bodies.items():
        for channel, parts in channels.items():
            out.append(PARTS[channel].format(loc=loc, **parts))
    return "\n".join(out)


def all_channels(word: str, param: str = "pct") -> dict[str, dict[str, str]]:
    ref = "{{ " + param + " }}"
    return {
        "push": {"title": f"{word} title", "body": f"{word}: {ref}% off"},
        "sms": {"text": f"{word}: {ref}% off"},
        "email": {"subject": f"{word}: {ref}% off", "text": f"{word}\n{ref}% off", "html": f"<p>{word}: <b>{ref}</b>% off</p>"},
    }
