"""The daily job: compute the report, split it per recipient group, send each email once, and
record every send in ``alert_sends``.

Idempotency (``docs/alerts.md#idempotency``): an email is identified by (day, tz, sorted
recipient list). Before sending, the job *claims* it in one transaction (a ``sending`` row),
which fails when a ``sent`` row exists or another process claimed it less than
:data:`CLAIM_TIMEOUT_S` ago; after SMTP it marks the row ``sent`` or ``failed``. So a second run
for the same day sends nothing, ``--resend`` sends again, a failed send is retried by the next
run, and a failed attempt is never recorded as sent. The DuckDB write lock is held only for the
claim and the update, never during SMTP.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from dataclasses import dataclass, field
from datetime import date
from email.message import EmailMessage
from email.utils import make_msgid
from pathlib import Path

from prefixscope.alerts.daily import DailyReport, ReportLine, build_daily_report, default_day, line_dict, resolve_tz
from prefixscope.alerts.mailer import SmtpSettings, SmtpUnavailable, build_message, deliver, new_message_id, smtp_settings
from prefixscope.alerts.render import render_chart_png, render_html, render_text, subject, worst_line
from prefixscope.alerts.webhook import Webhook, WebhookUnavailable, post, webhooks
from prefixscope.alerts.webhook import body as webhook_body
from prefixscope.core.config import AlertsConfig, Settings
from prefixscope.core.errors import ConfigError
from prefixscope.store import db as store_db
from prefixscope.store.queries import alerts as q

#: A ``sending`` claim older than this (seconds) belongs to a process that died: the next run
#: may send again.
CLAIM_TIMEOUT_S = 900.0

SENT = "sent"
FAILED = "failed"
#: The ``error`` recorded on a claim whose process died during SMTP (found by a later run).
DIED = ("the run that claimed this send (pid {pid}) died before recording an SMTP attempt "
        "(killed or crashed during SMTP); retried by pid {me}")


def claimer() -> str:
    """``host:pid`` of this process (stored in ``alert_sends.claimed_by``)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def claim_is_dead(claimed_by: object) -> int | None:
    """The pid of a claim made on this host by a process that no longer runs, else None
    (another host's claim, a live process or an unknown claimer: the claim timeout decides)."""
    if not isinstance(claimed_by, str) or ":" not in claimed_by:
        return None
    host, _, pid_s = claimed_by.rpartition(":")
    if host != socket.gethostname() or not pid_s.isdigit():
        return None
    pid = int(pid_s)
    if pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return pid
    except PermissionError:
        return None
    return None


def release_dead_claims(db: str, *, day: str, tz: str, lock_timeout_s: float) -> list[str]:
    """Close the ``sending`` claims of (day, tz) whose process died on this host as ``failed``
    (with :data:`DIED`), so this run sends them again. Returns one note per released claim."""
    with store_db.reader(db, lock_timeout_s=lock_timeout_s) as con:
        claims = q.open_claims(con, day=day, tz=tz)
    dead = [(r.send_id, r.recipients, pid, int(r.attempts)) for r in claims.itertuples()
            if (pid := claim_is_dead(r.claimed_by)) is not None]
    notes = []
    if not dead:
        return notes
    with store_db.writer(db, lock_timeout_s=lock_timeout_s) as con:
        for send_id, recipients, pid, attempts in dead:
            q.finish_send(con, send_id=send_id, status=FAILED, attempts=attempts,
                          error=DIED.format(pid=pid, me=os.getpid()), now_unix_s=time.time())
            notes.append(f"the send to {recipients} claimed by pid {pid} was never finished "
                         f"({attempts} SMTP attempts recorded): that run died; sending again")
    return notes
SKIPPED = "skipped"
DRY_RUN = "dry-run"

#: The ``error`` of a dry run's outcome when no recipient is configured.
NO_RECIPIENTS = ("no recipients configured ([alerts] recipients, recipients_by_model or "
                 "recipients_by_scope): nothing would be sent")


@dataclass(frozen=True, slots=True)
class PlannedEmail:
    """One email of the day: who gets it and which report lines it holds.

    Attributes:
        recipients: addresses, sorted.
        lines: the report lines for them (all lines for ``[alerts] recipients``; a model's
            lines for ``recipients_by_model``; a scope's lines for ``recipients_by_scope``).
        subject: from :func:`prefixscope.alerts.render.subject`.
        report_status: the worst status among ``lines`` (NO DATA when empty).
    """

    recipients: tuple[str, ...]
    lines: tuple[ReportLine, ...]
    subject: str
    report_status: str

    @property
    def key(self) -> str:
        """The recipients as stored in ``alert_sends.recipients`` (comma-separated, sorted)."""
        return ",".join(self.recipients)


@dataclass(frozen=True, slots=True)
class SendOutcome:
    """What happened to one planned email.

    Attributes:
        recipients, subject, report_status: as planned.
        status: ``sent``, ``failed``, ``skipped`` (already sent / being sent) or ``dry-run``.
        attempts: SMTP attempts made (0 when nothing was sent).
        message_id: Message-ID header (None when skipped).
        error: SMTP error (failed), refused recipients (sent), why it was skipped, or
            :data:`NO_RECIPIENTS` (a dry run with ``recipients`` empty).
        send_id: the ``alert_sends`` row (None when nothing was recorded).
        eml_path: where the message was written with ``eml_dir``.
    """

    recipients: tuple[str, ...]
    subject: str
    report_status: str
    status: str
    attempts: int = 0
    message_id: str | None = None
    error: str | None = None
    send_id: str | None = None
    eml_path: str | None = None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready dict."""
        return {"recipients": list(self.recipients), "subject": self.subject,
                "report_status": self.report_status, "status": self.status,
                "attempts": self.attempts, "message_id": self.message_id, "error": self.error,
                "send_id": self.send_id, "eml_path": self.eml_path}


@dataclass
class DailyRun:
    """Result of :func:`run_daily`: the report and one outcome per planned email."""

    report: DailyReport
    outcomes: list[SendOutcome] = field(default_factory=list)
    #: One outcome per configured webhook (``recipients`` is ``("webhook:NAME",)``).
    webhook_outcomes: list[SendOutcome] = field(default_factory=list)
    smtp_where: str | None = None
    #: What the run found and did before sending (e.g. a claim left by a run that died).
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[SendOutcome]:
        """Outcomes with status ``failed``."""
        return [o for o in self.outcomes if o.status == FAILED]

    def as_dict(self) -> dict[str, object]:
        """The report and the emails, JSON-ready (``--json``)."""
        d = self.report.as_dict()
        d["emails"] = [o.as_dict() for o in self.outcomes]
        d["webhooks"] = [o.as_dict() for o in self.webhook_outcomes]
        d["notes"] = list(self.notes)
        return d

    def raise_for_failures(self) -> None:
        """Raise :class:`~alerts.mailer.SmtpUnavailable` when any email failed, else
        :class:`~alerts.webhook.WebhookUnavailable` when any webhook failed (after every other
        email and webhook was tried and every outcome recorded); both exit 3."""
        hooks = [o for o in self.webhook_outcomes if o.status == FAILED]
        if not self.failed and hooks:
            raise WebhookUnavailable(
                f"{len(hooks)} report webhook(s) not delivered ("
                + "; ".join(f"{o.recipients[0]}: {o.error} after {o.attempts} attempt(s)"
                            for o in hooks)
                + "); recorded as failed, not sent: the next run retries them")
        if not self.failed:
            return
        parts = [f"to {', '.join(o.recipients)}: {o.error} after {o.attempts} attempt(s)"
                 for o in self.failed]
        raise SmtpUnavailable(
            f"SMTP {self.smtp_where}: {len(self.failed)} report email(s) not sent ("
            + "; ".join(parts) + "); recorded as failed, not sent: the next run retries them")


def has_recipients(cfg: AlertsConfig) -> bool:
    """Whether any address is configured in ``[alerts] recipients``, ``recipients_by_model``
    or ``recipients_by_scope`` (blank strings do not count)."""
    addrs = [*cfg.recipients, *(a for v in cfg.recipients_by_model.values() for a in v),
             *(a for v in cfg.recipients_by_scope.values() for a in v)]
    return any(a.strip() for a in addrs)


def preview_email(report: DailyReport) -> PlannedEmail:
    """The email ``[alerts] recipients`` would get (every line), addressed to nobody: what a
    dry run composes when no recipient is configured, so the report can be previewed before
    the configuration exists."""
    top = worst_line(report.lines)
    return PlannedEmail(recipients=(), lines=tuple(report.lines),
                        subject=subject(report, report.lines),
                        report_status=top.status if top else "NO DATA")


def plan_emails(report: DailyReport, cfg: AlertsConfig) -> list[PlannedEmail]:
    """Split the report per recipient: who gets which lines; addresses with the same lines get
    one email together. Ordered by recipient list.

    Raises:
        ConfigError: no recipient configured at all.
    """
    wanted: dict[str, set[tuple[str, str]]] = {}
    all_keys = {ln.key for ln in report.lines}
    for addr in cfg.recipients:
        wanted.setdefault(addr.strip(), set()).update(all_keys)
    for model, addrs in cfg.recipients_by_model.items():
        keys = {ln.key for ln in report.lines if ln.model == model}
        for addr in addrs:
            wanted.setdefault(addr.strip(), set()).update(keys)
    for scope, addrs in cfg.recipients_by_scope.items():
        keys = {ln.key for ln in report.lines if ln.scope == scope}
        for addr in addrs:
            wanted.setdefault(addr.strip(), set()).update(keys)
    wanted.pop("", None)
    if not wanted:
        raise ConfigError("alerts: no recipients: set [alerts] recipients, recipients_by_model "
                          "or recipients_by_scope to send the daily report")
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    order = {ln.key: i for i, ln in enumerate(report.lines)}
    for addr, keys in wanted.items():
        groups.setdefault(tuple(sorted(keys, key=order.__getitem__)), []).append(addr)
    emails = []
    for keys, addrs in groups.items():
        lines = tuple(ln for ln in report.lines if ln.key in set(keys))
        top = worst_line(lines)
        emails.append(PlannedEmail(recipients=tuple(sorted(set(addrs))), lines=lines,
                                   subject=subject(report, lines),
                                   report_status=top.status if top else "NO DATA"))
    return sorted(emails, key=lambda e: e.key)


def compose(report: DailyReport, email: PlannedEmail, cfg: AlertsConfig, *,
            now_unix_s: float | None = None, dashboard_url: str | None = None) -> EmailMessage:
    """The MIME message of one planned email (text, HTML, inline chart, headers).

    ``dashboard_url``: the served dashboard the email links to
    (:func:`prefixscope.core.config.dashboard_url`; default ``[alerts] dashboard_url``)."""
    day = report.window.day.isoformat()
    url = dashboard_url or cfg.dashboard_url
    png = render_chart_png(report, email.lines)
    cid = make_msgid(idstring="chart", domain="prefixscope.local")[1:-1] if png else None
    return build_message(
        subject=email.subject, mail_from=cfg.mail_from, to=email.recipients,
        text=render_text(report, email.lines, dashboard_url=url),
        html=render_html(report, email.lines, dashboard_url=url, chart_cid=cid),
        png=png, chart_cid=cid, message_id=new_message_id(cfg.mail_from, day),
        headers={"X-Prefixscope-Day": day, "X-Prefixscope-TZ": report.window.tz,
                 "X-Prefixscope-Status": email.report_status},
        date_unix_s=now_unix_s)


def _write_eml(msg: EmailMessage, eml_dir: str, day: str, index: int) -> str:
    path = Path(eml_dir)
    path.mkdir(parents=True, exist_ok=True)
    target = path / f"prefixscope-daily-{day}-{index + 1}.eml"
    target.write_bytes(msg.as_bytes())
    return str(target)


def link_url(settings: Settings, override: str | None = None) -> str:
    """The dashboard URL of the emails: :func:`prefixscope.core.config.dashboard_url`."""
    from prefixscope.core.config import dashboard_url

    return dashboard_url(settings, override)


def run_daily(db: str, *, settings: Settings, day: date | None = None, tz: str | None = None,
              send: bool = False, resend: bool = False, dry_run: bool = False,
              eml_dir: str | None = None, now_unix_s: float | None = None,
              env: Mapping[str, str] | None = None,
              sleep: Callable[[float], None] = time.sleep,
              dashboard_url: str | None = None) -> DailyRun:
    """Compute the daily report of ``day`` and, with ``send``, email it once per recipient
    group and record each send.

    Args:
        db: the DuckDB file (read for the report; written only for the sends log).
        settings: configuration (``[alerts]``, ``[store] lock_timeout_s``).
        day: the local date (default: yesterday in ``tz``).
        tz: IANA zone (default ``[alerts] timezone``).
        send: deliver the emails. ``resend`` and ``dry_run`` imply it.
        resend: send again even when already sent for this day.
        dry_run: plan and compose the emails (and write them to ``eml_dir``) but neither connect
            to SMTP nor write the database. Needs no recipients: without any, the one email
            composed is :func:`preview_email` (every line, addressed to nobody) and its
            outcome says that nothing would be sent.
        eml_dir: also write each composed message there as ``.eml``.
        now_unix_s: "now" (default wall clock): default day and STALE cutoff.
        env: environment for the SMTP password (default ``os.environ``).
        sleep: wait between SMTP retries (tests pass a recorder).
        dashboard_url: the served dashboard the emails link to (default
            :func:`prefixscope.core.config.dashboard_url` of ``settings``).

    Returns:
        A :class:`DailyRun`. SMTP failures do not raise here: call
        :meth:`DailyRun.raise_for_failures` after printing.

    Raises:
        UsageError: unknown zone. ConfigError: no recipients (``send``/``resend`` without
        ``dry_run``), bad SMTP credentials setup.
        SourceUnavailable, SchemaMismatch, StoreLocked: the database (see ``store/db.py``).
    """
    cfg = settings.alerts
    now = time.time() if now_unix_s is None else now_unix_s
    tz = tz or cfg.timezone
    resolve_tz(tz, key="--tz" if tz != cfg.timezone else "alerts.timezone")
    day = day or default_day(tz, now_unix_s=now)
    send = send or resend or dry_run
    lock_s = settings.store.lock_timeout_s
    released = (release_dead_claims(db, day=day.isoformat(), tz=tz, lock_timeout_s=lock_s)
                if send and not dry_run else [])
    with store_db.reader(db, lock_timeout_s=lock_s) as con:
        report = build_daily_report(con, day=day, tz=tz, cfg=cfg, now_unix_s=now)
        active = q.active_send_recipients(con, day=day.isoformat(), tz=tz, now_unix_s=now,
                                          claim_timeout_s=CLAIM_TIMEOUT_S) if send else set()
        claims = q.open_claims(con, day=day.isoformat(), tz=tz) if send else None
        sent_at = {key: q.last_sent(con, day=day.isoformat(), tz=tz, recipients=key)
                   for key in active}
    run = DailyRun(report=report, notes=released)
    if not send:
        return run
    hooks = webhooks(cfg, env=env)
    no_recipients = dry_run and not has_recipients(cfg)
    emails = ([preview_email(report)] if no_recipients
              else [] if hooks and not has_recipients(cfg) else plan_emails(report, cfg))
    smtp: SmtpSettings | None = None if dry_run or not emails else smtp_settings(cfg, env=env)
    run.smtp_where = smtp.where if smtp else f"{cfg.smtp_host}:{cfg.smtp_port}"
    day_s = day.isoformat()
    for i, email in enumerate(emails):
        base = dict(recipients=email.recipients, subject=email.subject,
                    report_status=email.report_status)
        if email.key in active and not resend:
            when = sent_at.get(email.key)
            if when is not None:
                why = (f"already sent for {day_s} ({tz}): use --resend to send again (sent "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(when))} UTC)")
            else:
                mine = claims[claims["recipients"] == email.key] if claims is not None else None
                who = (str(mine["claimed_by"].iloc[-1]) if mine is not None and not mine.empty
                       and isinstance(mine["claimed_by"].iloc[-1], str) else "another run")
                why = (f"being sent for {day_s} ({tz}) by {who} right now (claimed less than "
                       f"{CLAIM_TIMEOUT_S:g} s ago, no SMTP result recorded yet): not sent "
                       "twice; if that run died on another host, the next run after the claim "
                       "timeout sends it")
            run.outcomes.append(SendOutcome(**base, status=SKIPPED, error=why))
            continue
        msg = compose(report, email, cfg, now_unix_s=now,
                      dashboard_url=link_url(settings, dashboard_url))
        eml = _write_eml(msg, eml_dir, day_s, i) if eml_dir else None
        if dry_run:
            run.outcomes.append(SendOutcome(**base, status=DRY_RUN, message_id=msg["Message-ID"],
                                            error=NO_RECIPIENTS if no_recipients else None,
                                            eml_path=eml))
            continue
        assert smtp is not None
        send_id = uuid.uuid4().hex
        lines_json = json.dumps([line_dict(ln) for ln in email.lines], default=str)
        with store_db.writer(db, lock_timeout_s=lock_s) as con:
            claimed = q.claim_send(
                con, send_id=send_id, day=day_s, tz=tz, recipients=email.key,
                subject=email.subject, report_status=email.report_status,
                message_id=msg["Message-ID"], resend=resend, smtp_host=smtp.where,
                lines_json=lines_json, now_unix_s=time.time(), claim_timeout_s=CLAIM_TIMEOUT_S,
                claimed_by=claimer())
        if not claimed:
            run.outcomes.append(SendOutcome(
                **base, status=SKIPPED,
                error=f"already sent or being sent for {day_s} ({tz}) by another run"))
            continue
        status, result = _deliver_claimed(db, send_id, lock_s,
                                          lambda msg=msg: deliver(msg, smtp, sleep=sleep))
        run.outcomes.append(SendOutcome(**base, status=status, attempts=result.attempts,
                                        message_id=msg["Message-ID"], error=result.error,
                                        send_id=send_id, eml_path=eml))
    url = link_url(settings, dashboard_url)
    for hook in hooks:
        run.webhook_outcomes.append(_send_webhook(
            db, hook, report, cfg, day_s=day_s, tz=tz, active=active, sent_at=sent_at,
            resend=resend, dry_run=dry_run, dashboard_url=url, lock_s=lock_s, sleep=sleep))
    return run


def _deliver_claimed(db: str, send_id: str, lock_s: float,
                     attempt: Callable[[], Any]) -> tuple[str, Any]:
    """Run ``attempt`` (an email's SMTP delivery or a webhook's POST, both returning an object
    with ``ok``, ``attempts`` and ``error``) for the claimed send ``send_id`` and close the claim
    as ``sent`` or ``failed``; a bug or Ctrl-C during it closes the claim as ``failed``
    (``interrupted: ...``) and propagates: a claim never looks sent when it was not.
    Returns (status, the attempt's result)."""
    try:
        result = attempt()
    except BaseException as exc:
        with store_db.writer(db, lock_timeout_s=lock_s) as con:
            q.finish_send(con, send_id=send_id, status=FAILED, attempts=1,
                          error=f"interrupted: {type(exc).__name__}", now_unix_s=time.time())
        raise
    status = SENT if result.ok else FAILED
    with store_db.writer(db, lock_timeout_s=lock_s) as con:
        q.finish_send(con, send_id=send_id, status=status, attempts=result.attempts,
                      error=result.error, now_unix_s=time.time())
    return status, result


def _send_webhook(db: str, hook: Webhook, report: DailyReport, cfg: AlertsConfig, *, day_s: str,
                  tz: str, active: set[str], sent_at: Mapping[str, float | None], resend: bool,
                  dry_run: bool, dashboard_url: str, lock_s: float,
                  sleep: Callable[[float], None]) -> SendOutcome:
    """POST the day's report to one webhook once: the email's claim / deliver / finish steps
    (:func:`run_daily`) with ``webhook:NAME`` as the recipient set and the URL's host as the
    server recorded (never the URL: it is a secret)."""
    top = worst_line(report.lines)
    base = dict(recipients=(hook.key,), subject=subject(report, report.lines),
                report_status=top.status if top else "NO DATA")
    if hook.key in active and not resend:
        when = sent_at.get(hook.key)
        why = (f"already sent for {day_s} ({tz}) at "
               f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(when))} UTC: use --resend to "
               "send again" if when is not None else
               f"being sent for {day_s} ({tz}) by another run right now: not sent twice")
        return SendOutcome(**base, status=SKIPPED, error=why)
    payload = webhook_body(hook, report, dashboard_url=dashboard_url)
    if dry_run:
        return SendOutcome(**base, status=DRY_RUN)
    send_id = uuid.uuid4().hex
    lines_json = json.dumps([line_dict(ln) for ln in report.lines], default=str)
    with store_db.writer(db, lock_timeout_s=lock_s) as con:
        claimed = q.claim_send(
            con, send_id=send_id, day=day_s, tz=tz, recipients=hook.key,
            subject=base["subject"], report_status=base["report_status"],
            message_id=f"webhook-{send_id}", resend=resend, smtp_host=hook.host,
            lines_json=lines_json, now_unix_s=time.time(), claim_timeout_s=CLAIM_TIMEOUT_S,
            claimed_by=claimer())
    if not claimed:
        return SendOutcome(**base, status=SKIPPED,
                           error=f"already sent or being sent for {day_s} ({tz}) by another run")
    w = next(c for c in cfg.webhooks if c.name == hook.name)
    status, result = _deliver_claimed(db, send_id, lock_s, lambda: post(
        hook, payload, attempts=w.attempts or cfg.smtp_attempts,
        backoff_s=cfg.smtp_backoff_s if w.backoff_s is None else w.backoff_s,
        timeout_s=w.timeout_s or cfg.smtp_timeout_s, sleep=sleep))
    return SendOutcome(**base, status=status, attempts=result.attempts,
                       message_id=f"webhook-{send_id}", error=result.error, send_id=send_id)


def describe_outcomes(outcomes: Sequence[SendOutcome]) -> list[str]:
    """One human line per outcome (what the CLI prints after the report)."""
    out = []
    for o in outcomes:
        to = ", ".join(o.recipients)
        if o.status == SENT:
            extra = f"; {o.error}" if o.error else ""
            out.append(f"sent to {to}: {o.subject} ({o.message_id}, {o.attempts} attempt(s)){extra}")
        elif o.status == FAILED:
            out.append(f"FAILED to {to}: {o.error} after {o.attempts} attempt(s)")
        elif o.status == SKIPPED:
            out.append(f"skipped {to}: {o.error}")
        elif not o.recipients:
            where = f", written to {o.eml_path}" if o.eml_path else ""
            out.append(f"dry run, {o.error}; the email would be: {o.subject}{where}")
        else:
            where = f", written to {o.eml_path}" if o.eml_path else ""
            out.append(f"dry run, would send to {to}: {o.subject}{where}")
    return out
