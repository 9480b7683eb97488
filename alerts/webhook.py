"""The daily report as a webhook: a Slack-compatible message or a plain JSON document, POSTed
once per day per webhook, with the email's retry policy and idempotency.

Where on-call lives (issue 29 item 5): a Slack incoming webhook (or anything that takes its
``{"text": ...}`` body: Mattermost, Rocket.Chat, Google Chat), or any HTTP endpoint that takes
JSON (an incident tool, a relay to PagerDuty). Configured as ``[[alerts.webhooks]]`` tables
(``docs/alerts.md#webhooks``); the URL is a secret (a Slack URL carries its token), so it is read
from a file or an environment variable, never stored, never printed: the sends log records the
webhook's ``name`` and the URL's host only.

Idempotency is the email's (``alerts/job.py``): a webhook is one "recipient set",
``webhook:NAME``, in ``alert_sends``; the job claims it before the POST and marks it ``sent``
or ``failed`` after, so a second run of the same day posts nothing, ``--resend`` posts again and
a failed post is retried by the next run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from prefixscope.alerts.daily import DailyReport, ReportLine, line_dict
from prefixscope.alerts.render import dashboard_link, render_text, subject, worst_line
from prefixscope.core.bounds import escape_line
from prefixscope.core.config import AlertsConfig, WebhookConfig
from prefixscope.core.documents import DocumentError, read_document
from prefixscope.core.errors import ConfigError, SourceUnavailable

#: The ``recipients`` key of a webhook in ``alert_sends``: ``webhook:NAME``.
KEY_PREFIX = "webhook:"
#: Formats a webhook body can take.
FORMATS = ("slack", "json")
#: The longest body text sent to Slack (its ``text`` field is cut past 40,000 characters).
SLACK_TEXT_MAX = 39_000
#: The largest ``url_file`` read, bytes (a URL is far shorter; anything larger is not one).
MAX_URL_FILE_BYTES = 4096
#: The longest answer body kept for an error message, characters.
ERROR_BODY_MAX = 200


class WebhookUnavailable(SourceUnavailable):
    """A webhook did not take the daily report after every retry (names the webhook, never
    its URL, and the last error). Nothing was recorded as sent; exit code 3."""


@dataclass(frozen=True, slots=True)
class Webhook:
    """One configured webhook, its URL resolved.

    Attributes:
        name: the name in the config and the sends log (``webhook:NAME``).
        url: where to POST (a secret: never logged, never stored).
        format: ``slack`` (``{"text": ...}``) or ``json`` (:func:`json_body`).
    """

    name: str
    url: str
    format: str

    @property
    def key(self) -> str:
        """The ``alert_sends.recipients`` value of this webhook."""
        return KEY_PREFIX + self.name

    @property
    def host(self) -> str:
        """``host:port`` of the URL (what the sends log records; no path, no token)."""
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{parts.hostname}:{port}"


@dataclass(frozen=True, slots=True)
class WebhookDelivery:
    """Outcome of :func:`post`: ``ok`` when the endpoint answered 2xx; ``attempts`` made;
    ``error`` the last failure (status and the start of the answer, or the network error)."""

    ok: bool
    attempts: int
    error: str | None = None


def resolve(cfg: WebhookConfig, *, env: Mapping[str, str] | None = None) -> Webhook:
    """The :class:`Webhook` of one ``[[alerts.webhooks]]`` table: its URL from ``url``,
    ``url_file`` (first line of the file) or ``url_env`` (an environment variable).

    Raises:
        ConfigError: no URL source, or more than one; the file or variable is missing or empty;
            the URL is not http(s) with a host (named by the config key, never shown whole).
    """
    env = os.environ if env is None else env
    where = f"alerts.webhooks[{cfg.name!r}]"
    sources = [s for s in (cfg.url, cfg.url_file, cfg.url_env) if s]
    if len(sources) != 1:
        raise ConfigError(f"{where}: set exactly one of url, url_file, url_env "
                          f"({len(sources)} set)")
    if cfg.url:
        url, key = cfg.url, f"{where}.url"
    elif cfg.url_file:
        key = f"{where}.url_file"
        try:  # a regular file of at most 4 KiB (a FIFO or a device is named, never read)
            text = read_document(cfg.url_file, limit=MAX_URL_FILE_BYTES)
        except DocumentError as exc:
            raise ConfigError(f"{key}: cannot read {escape_line(cfg.url_file)}: {exc}") from None
        url = text.strip().splitlines()[0].strip() if text.strip() else ""
    else:
        key = f"{where}.url_env"
        url = env.get(cfg.url_env or "", "").strip()
        if not url:
            raise ConfigError(f"{key}: environment variable {cfg.url_env} is not set")
    if not url:
        raise ConfigError(f"{key}: the URL is empty")
    try:
        parts = urlsplit(url)
        ok = (parts.scheme in ("http", "https") and bool(parts.hostname)
              and not any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url))
        _ = parts.port  # ValueError: a port that is not a number
    except ValueError:
        ok = False
    if not ok:
        # the URL is a secret (a Slack URL holds its token): name where it came from, not it
        raise ConfigError(f"{key}: not an http(s) URL with a host (and no spaces or control "
                          "characters)")
    return Webhook(name=cfg.name, url=url, format=cfg.format)


def webhooks(cfg: AlertsConfig, *, env: Mapping[str, str] | None = None) -> list[Webhook]:
    """Every configured webhook, resolved, in config order (:func:`resolve` for each)."""
    return [resolve(w, env=env) for w in cfg.webhooks]


def _slack_escape(text: str) -> str:
    """Slack's three control characters as its entities, so text from the data (model names,
    labels) is shown as written and never becomes a link or a mention
    (api.slack.com "Formatting text for app surfaces": escape ``&``, ``<``, ``>``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(report: DailyReport, lines: Sequence[ReportLine], *,
               dashboard_url: str | None) -> dict[str, Any]:
    """A Slack-compatible body: ``{"text": subject + the plain-text report in a code block}``.

    The report is the email's text part (:func:`prefixscope.alerts.render.render_text`), inside
    a ``` block so Slack keeps its columns and renders nothing in it as markup; the dashboard
    link stays outside the block so it is clickable. Cut at :data:`SLACK_TEXT_MAX` characters.
    """
    text = render_text(report, lines)
    if len(text) > SLACK_TEXT_MAX:
        text = text[:SLACK_TEXT_MAX] + "\n... (cut: the full report is on the dashboard)\n"
    text = text.replace("```", "'''")
    body = f"*{_slack_escape(subject(report, lines))}*\n```\n{_slack_escape(text)}```"
    if dashboard_url:
        body += f"\n<{dashboard_link(dashboard_url, report)}|Open the dashboard>"
    return {"text": body}


def json_body(report: DailyReport, lines: Sequence[ReportLine], *,
              dashboard_url: str | None) -> dict[str, Any]:
    """A plain JSON body: ``day``, ``tz``, ``status`` (the worst line's: OK, ALERT, NO DATA,
    STALE), ``subject``, ``dashboard_url`` (with the day's page) and ``lines`` (each
    :func:`prefixscope.alerts.daily.line_dict`: model, scope, status, figures as fractions and
    token counts), the same figures as ``report daily --json``."""
    top = worst_line(lines)
    return {
        "source": "prefixscope",
        "day": report.window.day.isoformat(),
        "tz": report.window.tz,
        "status": top.status if top else "NO DATA",
        "subject": subject(report, lines),
        "dashboard_url": dashboard_link(dashboard_url, report) if dashboard_url else None,
        "lines": [line_dict(ln) for ln in lines],
    }


def body(hook: Webhook, report: DailyReport, *, dashboard_url: str | None) -> dict[str, Any]:
    """The body ``hook`` gets for ``report`` (every line): :func:`slack_body` or
    :func:`json_body` by its format."""
    lines = list(report.lines)
    make = slack_body if hook.format == "slack" else json_body
    return make(report, lines, dashboard_url=dashboard_url)


def _permanent(status: int) -> bool:
    """A 4xx answer other than 408 (timeout) and 429 (rate limited) will not change on retry."""
    return 400 <= status < 500 and status not in (408, 429)


def post(hook: Webhook, payload: Mapping[str, Any], *, attempts: int, backoff_s: float,
         timeout_s: float, sleep: Callable[[float], None] = time.sleep) -> WebhookDelivery:
    """POST ``payload`` as JSON to ``hook``, retrying network errors, 5xx, 408 and 429 up to
    ``attempts`` times, waiting ``backoff_s`` doubled each time (the email's policy,
    ``[alerts] smtp_attempts``/``smtp_backoff_s`` unless the webhook sets its own).

    Never raises for an HTTP or network failure: the outcome comes back so the caller records
    a failed post as failed. The error names the status and the answer's first
    :data:`ERROR_BODY_MAX` characters, or the network error; never the URL (a secret).
    """
    import httpx

    last = "no attempt made"
    made = 0
    for k in range(max(1, attempts)):
        if k:
            sleep(backoff_s * (2 ** (k - 1)))
        made += 1
        try:
            resp = httpx.post(hook.url, json=payload, timeout=timeout_s,
                              headers={"User-Agent": "prefixscope-daily-report"},
                              follow_redirects=False)
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {str(exc)[:ERROR_BODY_MAX] or 'no answer'}"
            last = last.replace(hook.url, hook.host)
            continue
        if 200 <= resp.status_code < 300:
            return WebhookDelivery(ok=True, attempts=made)
        answer = " ".join(resp.text[:ERROR_BODY_MAX].split())
        last = f"HTTP {resp.status_code}" + (f": {answer}" if answer else "")
        if _permanent(resp.status_code):
            break
    return WebhookDelivery(ok=False, attempts=made, error=last)
