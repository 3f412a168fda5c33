"""Who calls the API (pure): a caller has a unique name, its scopes, the categories and templates
it may send, its rate, and the shared dedup namespaces it was granted. Tokens belong to a
caller (``api.tokens``): a caller may hold several live ones, to rotate them.

Names (of callers and of namespaces) are ``[a-z0-9][a-z0-9_.-]{0,63}``: never a ``/`` nor a
``:``, so ``<caller>/<Idempotency-Key>`` (a caller's own key space) and ``ns:<namespace>/<key>``
(a shared one) can never be produced by another caller.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from api.scopes import Scope
from operators.records import Category

NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
NAME_RULE = "[a-z0-9][a-z0-9_.-]{0,63} (lower case, no / or :)"


@dataclass(frozen=True, slots=True)
class Caller:
    """A caller and what it may do.

    :param scopes: what it may do (``api.scopes``)
    :param categories: the kinds of template it may send (send, campaigns)
    :param templates: the templates it may send; empty: every template of its categories
    :param rate_per_sec: its notifications per second, and the most a campaign of it may run
        at; None: ``api.default_rate_per_sec``
    :param namespaces: shared dedup namespaces it may send in (``Dedup-Namespace``)
    """

    name: str
    scopes: frozenset[Scope]
    categories: frozenset[Category] = frozenset({Category.TRANSACTIONAL})
    templates: frozenset[str] = frozenset()
    rate_per_sec: float | None = None
    namespaces: frozenset[str] = frozenset()

    def may(self, scope: Scope) -> bool:
        return scope in self.scopes

    def may_send_kind(self, kind: Category) -> bool:
        return kind in self.categories

    def may_send_template(self, template: str) -> bool:
        return not self.templates or template in self.templates

    def rate(self, default: float) -> float:
        return self.rate_per_sec if self.rate_per_sec is not None else default

    def key_space(self, key: str) -> str:
        """The caller's own space of an Idempotency-Key (and of its dedup key)."""
        return f"{self.name}/{key}"


def shared_key(namespace: str, key: str) -> str:
    """A dedup key in a shared namespace: no caller's own space can produce it."""
    return f"ns:{namespace}/{key}"


def name_problem(name: str, what: str = "a caller name") -> str | None:
    if not NAME.fullmatch(name):
        return f"{what} is {NAME_RULE}"
    return None


def check_caller(caller: Caller) -> None:
    """Raises ValueError saying what is wrong with a new caller."""
    problem = name_problem(caller.name)
    if problem:
        raise ValueError(problem)
    if not caller.scopes:
        raise ValueError("a caller needs at least one scope")
    if not caller.categories:
        raise ValueError("a caller needs at least one category")
    if caller.rate_per_sec is not None and not caller.rate_per_sec > 0:
        raise ValueError("the rate must be positive")
    for ns in caller.namespaces:
        problem = name_problem(ns, "a namespace")
        if problem:
            raise ValueError(problem)


def parse_categories(text: str) -> frozenset[Category]:
    """``transactional,marketing`` -> the categories; raises ValueError naming a wrong one."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError("at least one category: transactional, marketing")
    known = {c.value for c in Category}
    for name in names:
        if name not in known:
            raise ValueError(f"unknown category {name!r}: transactional or marketing")
    return frozenset(Category(n) for n in names)


def parse_list(text: str | None) -> frozenset[str]:
    """``a,b`` -> {a, b} (templates, namespaces); None or empty -> none."""
    return frozenset(p.strip() for p in (text or "").split(",") if p.strip())


def joined(values: Iterable[str]) -> str:
    return ",".join(sorted(values))


def split(text: str | None) -> frozenset[str]:
    return frozenset(p for p in (text or "").split(",") if p)
