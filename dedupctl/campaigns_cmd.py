"""``dedupctl api campaigns``: start, watch, pause and resume campaigns through the running API
(``/v1/campaigns``), with a caller's token that has the ``campaigns`` scope; ``watch`` prints the
campaign's progress until it is done."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import httpx

from operators.errors import ConfigError
from settings import Settings

#: where the token comes from when ``--token`` is not given (a token never goes on a command line
#: that others can read in the process list unless the operator puts it there)
TOKEN_ENV = "DEDUP_API_TOKEN"


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def progress_line(c: Mapping[str, Any], seen_rate: float | None) -> str:
    """One line of a campaign's progress (``GET /v1/campaigns/{id}``'s answer); ``seen_rate``:
    requests per second written since the previous look, None on the first."""
    total, written = int(c["total"]), int(c["written"])
    pct = 100.0 * written / total if total else 100.0
    head = f"{c['campaign_id']}  {c['state']:<9}  {written:,} / {total:,} written ({pct:.1f}%)"
    if c["state"] == "scheduled":
        at = datetime.fromtimestamp(int(c["send_at"]) / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"{head}  starts at {at}"
    if c["state"] != "running" or seen_rate is None:
        return head
    if seen_rate <= 0:
        return f"{head}  0/s (limit {float(c['rate']):g}/s)"
    return f"{head}  {seen_rate:,.0f}/s (limit {float(c['rate']):g}/s)  eta {_duration((total - written) / seen_rate)}"


class Refused(Exception):
    """The API answered with an error: the command says so and exits 1."""


class CampaignsClient:
    """The API's campaign routes, as one caller (its bearer token)."""

    def __init__(self, url: str, token: str, timeout_s: float = 10.0) -> None:
        self._http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s,
                                  headers={"Authorization": f"Bearer {token}"})

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        try:
            reply = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise ConfigError(f"api campaigns: the API at {self._http.base_url} did not answer ({exc})") from None
        if reply.status_code >= 400:
            raise Refused(f"{method} {path} answered {reply.status_code}: {_problem(reply)}")
        answer: dict[str, Any] = reply.json()
        return answer

    def close(self) -> None:
        self._http.close()


def _problem(reply: httpx.Response) -> str:
    """The API's error (``{"error": code, "message": ..., "problems": [...]}``) as one line."""
    try:
        body = reply.json()
    except ValueError:
        return reply.text[:200]
    if not isinstance(body, dict) or "message" not in body:
        return json.dumps(body)[:500]
    problems = body.get("problems") or []
    return f"{body.get('error')}: {body['message']}" + "".join(f"; {p}" for p in problems)


def watch(client: CampaignsClient, campaign_id: str, interval_s: float, prefix: str = "/v1/campaigns") -> int:
    """Print the campaign's progress every ``interval_s`` while it changes, until it is done (0)
    or paused (3)."""
    before: tuple[float, int] | None = None
    last = ""
    while True:
        c = client.call("GET", f"{prefix}/{campaign_id}")
        now = time.monotonic()
        rate = None if before is None else (int(c["written"]) - before[1]) / max(now - before[0], 1e-6)
        line = progress_line(c, rate)
        if line != last:
            _out(line)
            last = line
        if c["state"] == "done":
            return 0
        if c["state"] == "paused":
            _out(f"paused: dedupctl api campaigns resume {campaign_id} goes on from {int(c['written']):,}")
            return 3
        before = (now, int(c["written"]))
        time.sleep(interval_s)


def _client(cfg: Settings, args: argparse.Namespace) -> CampaignsClient:
    token = args.token or os.environ.get(TOKEN_ENV)
    if not token:
        raise ConfigError(f"api campaigns: give the caller's token in ${TOKEN_ENV} (or --token); it needs the"
                          " campaigns scope (support:read for --support)")
    return CampaignsClient(args.url or cfg.api.local_url(), token)


def _params(pairs: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ConfigError(f"api campaigns create: --param is NAME=VALUE, not {pair!r}")
        out[name] = value
    return out


Command = Callable[[Settings, argparse.Namespace], int]


def _refusals_exit_1(command: Command) -> Command:
    def run(cfg: Settings, args: argparse.Namespace) -> int:
        try:
            return command(cfg, args)
        except Refused as exc:
            sys.stderr.write(f"dedupctl api campaigns: {exc}\n")
            return 1

    return run


@_refusals_exit_1
def cmd_create(cfg: Settings, args: argparse.Namespace) -> int:
    if (args.segment is None) == (args.segment_file is None):
        raise ConfigError("api campaigns create: give --segment USERS or --segment-file NAME, one of them")
    body: dict[str, Any] = {"template": args.template, "params": _params(args.param), "rate": args.rate}
    if args.segment is not None:
        body["segment"] = [u for u in args.segment.split(",") if u]
    else:
        body["segment_file"] = args.segment_file
    if args.channels:
        body["channels"] = args.channels.split(",")
    if args.send_at:
        body["send_at"] = args.send_at
    client = _client(cfg, args)
    try:
        created = client.call("POST", "/v1/campaigns", body)
        _out(f"campaign {created['campaign_id']} created ({created['status_url']})")
        return watch(client, created["campaign_id"], args.interval) if args.watch else 0
    finally:
        client.close()


@_refusals_exit_1
def cmd_watch(cfg: Settings, args: argparse.Namespace) -> int:
    client = _client(cfg, args)
    try:
        return watch(client, args.campaign_id, args.interval, _prefix(args))
    finally:
        client.close()


def _prefix(args: argparse.Namespace) -> str:
    return "/v1/support/campaigns" if args.support else "/v1/campaigns"


@_refusals_exit_1
def cmd_change(cfg: Settings, args: argparse.Namespace) -> int:
    client = _client(cfg, args)
    try:
        _out(progress_line(client.call("POST", f"{_prefix(args)}/{args.campaign_id}/{args.action}"), None))
        return 0
    finally:
        client.close()


def register(api_sub: Any) -> None:
    p = api_sub.add_parser("campaigns", help="start, watch, pause and resume campaigns through the running API")
    sub = p.add_subparsers(dest="campaigns_command", required=True)

    def common(q: argparse.ArgumentParser, support: bool = True) -> None:
        q.add_argument("--url", help="the API (default: http://<api.host>:<api.port>)")
        q.add_argument("--token", help=f"the caller's token (default: ${TOKEN_ENV})")
        if support:
            q.add_argument("--support", action="store_true",
                           help="through the support routes (a support:read token: any caller's campaign)")

    q = sub.add_parser("create", help="start a campaign (POST /v1/campaigns) and print its id")
    q.add_argument("--template", required=True, help="a marketing template")
    q.add_argument("--segment", help="the user ids, comma-separated")
    q.add_argument("--segment-file", help="a file of user ids, one a line, in api.segments_dir")
    q.add_argument("--param", action="append", metavar="NAME=VALUE", help="a template parameter (repeatable)")
    q.add_argument("--channels", help="comma-separated (default: the template's)")
    q.add_argument("--rate", type=float, default=100.0, help="requests per second (default: 100)")
    q.add_argument("--send-at", help="ISO-8601 or epoch ms (default: now)")
    q.add_argument("--watch", action="store_true", help="then print its progress until it is done")
    q.add_argument("--interval", type=float, default=2.0, help="seconds between looks with --watch (default: 2)")
    common(q, support=False)
    q.set_defaults(func=cmd_create)
    q = sub.add_parser("watch", help="print a campaign's progress (written, rate, time left) until it is done;"
                       " exit 3 when it is paused")
    q.add_argument("campaign_id")
    q.add_argument("--interval", type=float, default=2.0, help="seconds between looks (default: 2)")
    common(q)
    q.set_defaults(func=cmd_watch)
    for action in ("pause", "resume"):
        q = sub.add_parser(action, help=f"{action} a campaign")
        q.add_argument("campaign_id")
        common(q)
        q.set_defaults(func=cmd_change, action=action)
