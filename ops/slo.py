"""``dedupctl slo``: the design's SLOs (deploy/prometheus/slos.yml) from the services' own
``/metrics``, by pure functions on parsed samples.

The counters a process exports count from its start: one scrape gives each SLI since the
services started; two scrapes ``interval`` apart (``deltas``) give it over that interval. The
same SLIs and objectives as the recording rules: accepts without a 5xx (99.99%), one-time codes
(the priority lane) at the provider within 5 s (99%), transactional messages (normal lane) within
a minute (99%), dead letters under 0.1% of the messages that ended (sent or dead-lettered).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from operators import metric_names as names

Labels = tuple[tuple[str, str], ...]

API = "api"
SENDERS = "senders"


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Labels
    value: float

    def label(self, key: str) -> str:
        return dict(self.labels).get(key, "")


def parse_samples(text: str) -> list[Sample]:
    """The samples of a Prometheus text exposition, by ``prometheus_client``'s parser; a malformed
    exposition raises ``ValueError`` (the service that sent it is named by the caller)."""
    return [
        Sample(s.name, tuple(sorted(s.labels.items())), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def deltas(before: Iterable[Sample], after: Iterable[Sample]) -> list[Sample]:
    """Counters over an interval: ``after`` less ``before`` per series; a series that went down
    (its process restarted) counts from zero, as Prometheus's ``increase`` does."""
    first = {(s.name, s.labels): s.value for s in before}
    out = []
    for s in after:
        was = first.get((s.name, s.labels), 0.0)
        out.append(Sample(s.name, s.labels, s.value - was if s.value >= was else s.value))
    return out


def _sum(samples: Iterable[Sample], name: str, **want: str) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.label(k) == v for k, v in want.items()))


def _within(samples: Iterable[Sample], histogram: str, bound: float, **want: str) -> float:
    """Observations of a histogram at or below ``bound`` (its bucket of that bound)."""
    def le(s: Sample) -> float:
        try:
            return float(s.label("le"))
        except ValueError:
            return math.nan
    return sum(s.value for s in samples if s.name == f"{histogram}_bucket" and math.isclose(le(s), bound)
               and all(s.label(k) == v for k, v in want.items()))


@dataclass(frozen=True, slots=True)
class Slo:
    """:param objective: the share of good events promised (``at_most``: the share of bad ones
    allowed)"""

    name: str
    service: str
    objective: float
    at_most: bool = False

    @property
    def budget(self) -> float:
        """The share of events allowed to be bad."""
        return self.objective if self.at_most else 1 - self.objective


ACCEPTS = Slo("accepts succeed (no 5xx)", API, 0.9999)
ONE_TIME_CODES = Slo("one-time codes at the provider within 5 s", SENDERS, 0.99)
TRANSACTIONAL = Slo("transactional at the provider within 1 minute", SENDERS, 0.99)
DEAD_LETTERS = Slo("dead-lettered, share of the messages ended", SENDERS, 0.001, at_most=True)
SLOS = (ACCEPTS, ONE_TIME_CODES, TRANSACTIONAL, DEAD_LETTERS)


@dataclass(frozen=True, slots=True)
class SloResult:
    """:param bad: events that missed the objective's bar, of ``total``
    :param budget_left: the share of the error budget not spent (below 0: overspent); None
        without events"""

    slo: Slo
    bad: float
    total: float

    @property
    def value(self) -> float | None:
        """The SLI: the share of good events (of bad ones for an ``at_most`` SLO)."""
        if self.total <= 0:
            return None
        bad = self.bad / self.total
        return bad if self.slo.at_most else 1 - bad

    @property
    def budget_left(self) -> float | None:
        if self.total <= 0:
            return None
        return 1 - (self.bad / self.total) / self.slo.budget

    @property
    def met(self) -> bool | None:
        left = self.budget_left
        return None if left is None else left >= -1e-9  # the budget spent exactly is met


def evaluate(samples: Mapping[str, Sequence[Sample]]) -> list[SloResult]:
    """Each SLO whose service's samples are given (``API``, ``SENDERS``)."""
    out: list[SloResult] = []
    api = samples.get(API)
    if api is not None:
        count = f"{names.API_ACCEPT_SECONDS}_count"
        total = _sum(api, count)
        failed = sum(s.value for s in api if s.name == count and s.label("status").startswith("5"))
        out.append(SloResult(ACCEPTS, failed, total))
    senders = samples.get(SENDERS)
    if senders is not None:
        hist = names.SENDER_ACCEPT_TO_PROVIDER
        otp = _sum(senders, f"{hist}_count", lane="priority")
        out.append(SloResult(ONE_TIME_CODES, otp - _within(senders, hist, 5.0, lane="priority"), otp))
        tx = _sum(senders, f"{hist}_count", lane="normal", category="transactional")
        fast = _within(senders, hist, 60.0, lane="normal", category="transactional")
        out.append(SloResult(TRANSACTIONAL, tx - fast, tx))
        dead = _sum(senders, names.SENDER_DEAD_LETTERS)
        sent = _sum(senders, names.SENDER_DELIVERIES, outcome="sent")
        out.append(SloResult(DEAD_LETTERS, dead, sent + dead))
    return out


def costs(senders: Iterable[Sample]) -> dict[tuple[str, str], float]:
    """Cost units per (channel, provider)."""
    out: dict[tuple[str, str], float] = {}
    for s in senders:
        if s.name == names.SENDER_COST:
            key = (s.label("channel"), s.label("provider"))
            out[key] = out.get(key, 0.0) + s.value
    return out


def _pct(x: float) -> str:
    return f"{x * 100:.3f}%"


def render(
    results: Sequence[SloResult],
    unreachable: Mapping[str, str],
    cost: Mapping[tuple[str, str], float],
    *,
    over: str,
) -> str:
    """The report: each SLO with its value and the budget left, or why it is unknown (``unreachable``:
    service -> what went wrong), then the cost; ``over``: the span the counters cover."""
    lines = [f"SLOs over {over}:"]
    by_slo = {r.slo: r for r in results}
    for slo in SLOS:
        bar = f"{'at most' if slo.at_most else 'objective'} {_pct(slo.objective)}"
        r = by_slo.get(slo)
        if r is None:
            lines.append(f"  {slo.name:<48} unknown: {slo.service} not read, see below  ({bar})")
        elif r.value is None or r.budget_left is None:
            lines.append(f"  {slo.name:<48} no events yet  ({bar})")
        else:
            verdict = "met" if r.met else "MISSED"
            lines.append(f"  {slo.name:<48} {_pct(r.value):>9}  {verdict:<6} ({bar}; {r.bad:g} of {r.total:g} "
                         f"bad; error budget left {_pct(r.budget_left)})")
    if cost:
        lines.append("cost units (senders.provider_prices):")
        lines += [f"  {channel:<6} {provider:<30} {units:g}" for (channel, provider), units in sorted(cost.items())]
    for service, why in sorted(unreachable.items()):
        lines.append(f"{service}: {why}")
    return "\n".join(lines) + "\n"
