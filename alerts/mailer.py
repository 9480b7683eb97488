"""SMTP delivery of the daily report: building the MIME message and sending it with retries.

The message is ``multipart/alternative``: a ``text/plain`` part and a ``multipart/related``
part holding the ``text/html`` body and the chart as an inline ``image/png`` referenced by
``cid:``. Delivery uses :mod:`smtplib` over plain SMTP, STARTTLS or implicit TLS (SSL), with a
password from ``$PREFIXSCOPE_SMTP_PASSWORD``, the file named by
``$PREFIXSCOPE_SMTP_PASSWORD_FILE``, or ``[alerts] smtp_password_file`` (in that order).

Transient failures (connection refused, timeout, disconnect, 4xx replies) are retried with
exponential backoff (``smtp_backoff_s`` x 2^k, k = 0, 1, ...) up to ``smtp_attempts`` attempts;
permanent ones (5xx replies, authentication refused, certificate not trusted, STARTTLS not
offered) stop at once. See ``docs/alerts.md#delivery``.
"""

from __future__ import annotations

import os
import smtplib
import socket
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

from prefixscope.core.config import AlertsConfig
from prefixscope.core.errors import ConfigError, SourceUnavailable

PASSWORD_ENV = "PREFIXSCOPE_SMTP_PASSWORD"
PASSWORD_FILE_ENV = "PREFIXSCOPE_SMTP_PASSWORD_FILE"


class SmtpUnavailable(SourceUnavailable):
    """The SMTP server could not take a report email after every retry (names host, port,
    recipients and the last error). Nothing was recorded as sent."""


@dataclass(frozen=True, slots=True)
class SmtpSettings:
    """Where and how to send (resolved from ``[alerts]`` and the environment).

    Attributes:
        host, port: the SMTP server.
        security: ``none``, ``starttls`` or ``ssl`` (implicit TLS, e.g. port 465).
        user: login name, or None for no AUTH.
        password: the secret (never printed: excluded from ``repr``).
        timeout_s: socket timeout per attempt, seconds.
        ca_file: PEM file of CA certificates to trust instead of the system store, or None.
        attempts: total delivery attempts (>= 1).
        backoff_s: wait before the 2nd attempt, doubled before each later one, seconds.
    """

    host: str
    port: int
    security: str = "none"
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout_s: float = 30.0
    ca_file: str | None = None
    attempts: int = 5
    backoff_s: float = 2.0

    @property
    def where(self) -> str:
        """``host:port`` (no credentials), for logs and the sends log."""
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Delivery:
    """Outcome of :func:`deliver`.

    Attributes:
        ok: the server accepted the message for at least one recipient.
        attempts: attempts made (1 = first try worked or failed permanently).
        error: the last error (None when ok with every recipient accepted); for an ok delivery,
            the recipients the server refused.
        refused: recipient -> SMTP reply for recipients refused while others were accepted.
    """

    ok: bool
    attempts: int
    error: str | None = None
    refused: Mapping[str, str] = field(default_factory=dict)


def smtp_settings(cfg: AlertsConfig, *, env: Mapping[str, str] | None = None) -> SmtpSettings:
    """Resolve :class:`SmtpSettings` from ``[alerts]`` and the environment.

    Raises:
        ConfigError: ``smtp_user`` is set but no password is found, the password file cannot be
            read, or credentials would be sent over an unencrypted connection
            (``smtp_security = "none"``).
    """
    env = os.environ if env is None else env
    password: str | None = env.get(PASSWORD_ENV) or None
    password_file = env.get(PASSWORD_FILE_ENV) or cfg.smtp_password_file
    if password is None and password_file:
        try:
            with open(password_file, encoding="utf-8") as fh:
                password = fh.read().strip() or None
        except OSError as exc:
            raise ConfigError(
                f"alerts.smtp_password_file: cannot read {password_file}: {exc.strerror}") from exc
    if cfg.smtp_user:
        if password is None:
            raise ConfigError(
                f"alerts.smtp_user is set but no password: set ${PASSWORD_ENV}, "
                f"${PASSWORD_FILE_ENV} or alerts.smtp_password_file")
        if cfg.smtp_security == "none":
            raise ConfigError(
                "alerts.smtp_security is 'none' but alerts.smtp_user is set: the password would "
                "travel unencrypted; use 'starttls' or 'ssl'")
    return SmtpSettings(
        host=cfg.smtp_host, port=cfg.smtp_port, security=cfg.smtp_security, user=cfg.smtp_user,
        password=password if cfg.smtp_user else None, timeout_s=cfg.smtp_timeout_s,
        ca_file=cfg.smtp_ca_file, attempts=cfg.smtp_attempts, backoff_s=cfg.smtp_backoff_s)


def new_message_id(mail_from: str, day: str) -> str:
    """A fresh RFC 5322 Message-ID, ``<...daily-YYYY-MM-DD@domain-of-mail_from>``."""
    domain = mail_from.rsplit("@", 1)[-1].strip(" >") if "@" in mail_from else "prefixscope.local"
    return make_msgid(idstring=f"prefixscope-daily-{day}", domain=domain or "prefixscope.local")


def build_message(*, subject: str, mail_from: str, to: Sequence[str], text: str, html: str,
                  png: bytes | None, chart_cid: str | None, message_id: str,
                  headers: Mapping[str, str] | None = None,
                  date_unix_s: float | None = None) -> EmailMessage:
    """Assemble the report email.

    Args:
        subject, mail_from, to: the envelope-visible headers (``to`` in the order given).
        text: the ``text/plain`` body.
        html: the ``text/html`` body; refers to the chart as ``<img src="cid:{chart_cid}">``.
        png: the chart image, or None for no chart.
        chart_cid: Content-ID of the chart without angle brackets (from :func:`make_msgid`
            stripped of ``<>``); required with ``png``.
        message_id: the Message-ID header (with angle brackets).
        headers: extra headers, e.g. ``X-Prefixscope-Status``.
        date_unix_s: the Date header (default now).

    Returns:
        The message: multipart/alternative (text/plain, multipart/related (text/html,
        image/png inline)).
    """
    msg = EmailMessage()
    msg["Subject"] = subject
    msg["From"] = mail_from
    msg["To"] = ", ".join(to)
    msg["Date"] = formatdate(date_unix_s, localtime=False)
    msg["Message-ID"] = message_id
    msg["Auto-Submitted"] = "auto-generated"  # RFC 3834: no vacation replies
    for key, value in (headers or {}).items():
        msg[key] = value
    msg.set_content(text, subtype="plain", charset="utf-8")
    msg.add_alternative(html, subtype="html", charset="utf-8")
    if png is not None:
        assert chart_cid, "a chart needs a Content-ID"
        html_part = msg.get_payload()[1]
        html_part.add_related(png, maintype="image", subtype="png", cid=f"<{chart_cid}>",
                              disposition="inline", filename="hit-rate.png")
    return msg


def _permanent(exc: BaseException) -> bool:
    if isinstance(exc, (smtplib.SMTPAuthenticationError, smtplib.SMTPNotSupportedError,
                        ssl.SSLCertVerificationError)):
        return True
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        return all(code >= 500 for code, _ in exc.recipients.values())
    if isinstance(exc, smtplib.SMTPResponseException):
        return exc.smtp_code >= 500
    return False


def _describe(exc: BaseException) -> str:
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        return "all recipients refused: " + "; ".join(
            f"{rcpt}: {code} {msg.decode(errors='replace') if isinstance(msg, bytes) else msg}"
            for rcpt, (code, msg) in sorted(exc.recipients.items()))
    if isinstance(exc, smtplib.SMTPResponseException):
        text = exc.smtp_error.decode(errors="replace") if isinstance(exc.smtp_error, bytes) \
            else str(exc.smtp_error)
        return f"{type(exc).__name__}: {exc.smtp_code} {text}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"


def _tls_context(smtp: SmtpSettings) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=smtp.ca_file)


def _send_once(msg: EmailMessage, smtp: SmtpSettings) -> dict[str, str]:
    if smtp.security == "ssl":
        client: smtplib.SMTP = smtplib.SMTP_SSL(smtp.host, smtp.port, timeout=smtp.timeout_s,
                                                context=_tls_context(smtp))
    else:
        client = smtplib.SMTP(smtp.host, smtp.port, timeout=smtp.timeout_s)
    try:
        client.ehlo()
        if smtp.security == "starttls":
            client.starttls(context=_tls_context(smtp))
            client.ehlo()
        if smtp.user:
            client.login(smtp.user, smtp.password or "")
        refused = client.send_message(msg)
    finally:
        try:
            client.quit()
        except (smtplib.SMTPException, OSError):
            client.close()
    return {rcpt: f"{code} {text.decode(errors='replace') if isinstance(text, bytes) else text}"
            for rcpt, (code, text) in refused.items()}


def deliver(msg: EmailMessage, smtp: SmtpSettings, *,
            sleep: Callable[[float], None] = time.sleep) -> Delivery:
    """Send ``msg`` to its To addresses, retrying transient failures with backoff.

    Never raises for an SMTP or network failure: the outcome, attempts and last error come back
    in the :class:`Delivery` so that the caller can record a failed attempt as failed.

    Args:
        msg: a message from :func:`build_message`.
        smtp: server, security, credentials, retry policy.
        sleep: the wait between attempts (tests pass a recorder).

    Returns:
        A :class:`Delivery`: ``ok`` when the server accepted the message.
    """
    attempts = 0
    last: BaseException | None = None
    for k in range(max(1, smtp.attempts)):
        if k:
            sleep(smtp.backoff_s * (2 ** (k - 1)))
        attempts += 1
        try:
            refused = _send_once(msg, smtp)
        except (smtplib.SMTPException, OSError) as exc:
            last = exc
            if _permanent(exc):
                break
            continue
        error = None if not refused else "refused: " + "; ".join(
            f"{r}: {t}" for r, t in sorted(refused.items()))
        return Delivery(ok=True, attempts=attempts, error=error, refused=refused)
    assert last is not None
    return Delivery(ok=False, attempts=attempts, error=_describe(last))
