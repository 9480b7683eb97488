"""The report email against a real SMTP server on loopback (aiosmtpd): contents, headers,
recipients, idempotency, retries, STARTTLS / SSL with a self-signed certificate, and the sends
log in DuckDB."""

from __future__ import annotations

import re
import shutil
from datetime import date, timedelta

import pytest

from prefixscope.alerts.job import DRY_RUN, FAILED, SENT, SKIPPED, run_daily
from prefixscope.alerts.mailer import SmtpUnavailable
from prefixscope.core.config import AlertsConfig, Settings
from prefixscope.core.errors import ConfigError
from prefixscope.store import db as store_db
from prefixscope.store.queries.alerts import alert_sends
from tests.alerts_support import (
    CounterSource,
    free_port,
    ingest_usage_lines,
    local_ts,
    parts_by_type,
    recipients_of,
    requests_for,
    start_smtp,
)

DAY = date(2026, 11, 28)
NOW = local_ts(DAY, 30)


@pytest.fixture(scope="module")
def _report_db_template(tmp_path_factory):
    """Two models: ``tiny-llama`` ALERT (12%) from counters, ``qwen-small`` OK (94%), and a
    TENANT scope line for qwen-small (90%) from requests. Built once; tests get a copy."""
    tmp_path = tmp_path_factory.mktemp("alerts-mail-db")
    db_path = str(tmp_path / "template.duckdb")
    folder = tmp_path / "scrapes"
    folder.mkdir()
    with store_db.writer(db_path) as con:
        a = CounterSource(folder, "vllm-a:8000", "tiny-llama", local_ts(DAY - timedelta(days=3), 0))
        a.day(con, DAY - timedelta(days=1), queries=100_000, hits=95_000, every_h=6)
        a.day(con, DAY, queries=100_000, hits=12_000, every_h=2)
        b = CounterSource(folder, "vllm-b:8000", "qwen-small", local_ts(DAY - timedelta(days=3), 0))
        b.day(con, DAY - timedelta(days=1), queries=644_000, hits=600_000, every_h=6)
        b.day(con, DAY, queries=644_000, hits=608_000, every_h=2)
        ingest_usage_lines(con, tmp_path / "u.jsonl", requests_for(
            DAY, model="qwen-small", n=4, prompt_tokens=1_000, cached_tokens=900, scope="TENANT",
            tenant_digest="abcd1234"))
        con.execute("CHECKPOINT")
    return db_path


@pytest.fixture
def report_db(_report_db_template, db_path):
    """A fresh copy of the module's report database."""
    shutil.copyfile(_report_db_template, db_path)
    return db_path


@pytest.fixture
def smtp():
    server = start_smtp()
    yield server
    server.stop()


def _settings(server=None, **alerts) -> Settings:
    base = dict(recipients=["oncall@example.com"], mail_from="prefixscope@example.com",
                dashboard_url="https://dash.example.com/", smtp_attempts=3, smtp_backoff_s=0.5,
                smtp_timeout_s=5)
    if server is not None:
        base.update(smtp_host=server.host, smtp_port=server.port)
    base.update(alerts)
    return Settings(alerts=AlertsConfig(**base))


def _run(db, settings, **kw):
    kw.setdefault("sleep", lambda s: None)
    kw.setdefault("env", {})
    return run_daily(db, settings=settings, day=DAY, tz="UTC", now_unix_s=NOW, **kw)


def _sends(db):
    with store_db.reader(db) as con:
        return alert_sends(con)


# --- contents and headers -----------------------------------------------------------------


def test_email_has_text_html_inline_chart_subject_and_link(report_db, smtp):
    run = _run(report_db, _settings(smtp), send=True)
    assert [o.status for o in run.outcomes] == [SENT]
    (got,) = smtp.received
    msg = got.message
    assert msg["Subject"] == "[prefixscope] ALERT tiny-llama 12.0% hit rate 2026-11-28"
    assert msg["From"] == "prefixscope@example.com"
    assert msg["To"] == "oncall@example.com"
    assert got.rcpt_tos == ["oncall@example.com"] and got.mail_from == "prefixscope@example.com"
    assert msg["Auto-Submitted"] == "auto-generated"
    assert msg["X-Prefixscope-Status"] == "ALERT"
    assert msg["X-Prefixscope-Day"] == "2026-11-28" and msg["X-Prefixscope-TZ"] == "UTC"
    assert re.fullmatch(r"<[^@>]+@example\.com>", msg["Message-ID"])
    assert msg["Date"]

    assert msg.get_content_type() == "multipart/alternative"
    parts = parts_by_type(msg)
    text = parts["text/plain"][0].get_content()
    html = parts["text/html"][0].get_content()
    assert "12,000 of 100,000 prompt tokens from cache (12.0%): ALERT: check the top of the prompt" in text
    assert "608,000 of 644,000 prompt tokens from cache (94.4%): OK" in text
    assert "previous day 95.0% (-83.0 pp)" in text
    link = "https://dash.example.com/alerts?day=2026-11-28&tz=UTC"
    assert f"Dashboard: {link}" in text
    assert f'href="{link.replace("&", "&amp;")}"' in html
    assert "12,000 of 100,000 prompt tokens from cache (12.0%): ALERT" in html

    (related,) = parts["multipart/related"]
    (png,) = parts["image/png"]
    assert png.get_content_disposition() == "inline"
    cid = png["Content-ID"].strip("<>")
    assert f'src="cid:{cid}"' in html
    data = png.get_content()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    # the HTML part and its image are siblings in multipart/related
    assert [p.get_content_type() for p in related.iter_parts()] == ["text/html", "image/png"]


def test_every_send_is_recorded_with_its_message_id(report_db, smtp):
    run = _run(report_db, _settings(smtp), send=True)
    df = _sends(report_db)
    assert len(df) == 1
    row = df.iloc[0]
    assert row["status"] == "sent" and row["attempts"] == 1 and row["error"] is None
    assert row["day"] == "2026-11-28" and row["tz"] == "UTC"
    assert row["recipients"] == "oncall@example.com"
    assert row["subject"] == smtp.received[0].message["Subject"]
    assert row["message_id"] == smtp.received[0].message["Message-ID"] == run.outcomes[0].message_id
    assert row["report_status"] == "ALERT" and not row["resend"]
    assert row["smtp_host"] == f"127.0.0.1:{smtp.port}"
    assert '"tiny-llama"' in row["lines_json"]


def test_recipients_per_model_and_scope(report_db, smtp):
    settings = _settings(smtp, recipients=["oncall@example.com"],
                         recipients_by_model={"qwen-small": ["qwen-team@example.com"]},
                         recipients_by_scope={"TENANT": ["tenancy@example.com"]})
    run = _run(report_db, settings, send=True)
    assert sorted(o.status for o in run.outcomes) == [SENT, SENT, SENT]
    assert recipients_of(smtp.received) == [["oncall@example.com"], ["qwen-team@example.com"],
                                            ["tenancy@example.com"]]
    by_rcpt = {r.rcpt_tos[0]: r.message for r in smtp.received}
    qwen = parts_by_type(by_rcpt["qwen-team@example.com"])["text/plain"][0].get_content()
    assert "qwen-small" in qwen and "tiny-llama" not in qwen and "TENANT" in qwen
    assert by_rcpt["qwen-team@example.com"]["Subject"] == \
        "[prefixscope] OK qwen-small 94.4% hit rate 2026-11-28"
    tenancy = parts_by_type(by_rcpt["tenancy@example.com"])["text/plain"][0].get_content()
    assert "qwen-small TENANT" in tenancy and "608,000" not in tenancy
    assert by_rcpt["oncall@example.com"]["X-Prefixscope-Status"] == "ALERT"


def test_addresses_with_the_same_lines_share_one_email(report_db, smtp):
    settings = _settings(smtp, recipients=["b@example.com", "a@example.com"],
                         recipients_by_model={"tiny-llama": ["a@example.com"]})
    _run(report_db, settings, send=True)
    assert recipients_of(smtp.received) == [["a@example.com", "b@example.com"]]
    assert _sends(report_db)["recipients"].tolist() == ["a@example.com,b@example.com"]


# --- idempotency ---------------------------------------------------------------------------


def test_second_run_sends_nothing_and_resend_sends_again(report_db, smtp):
    settings = _settings(smtp)
    first = _run(report_db, settings, send=True)
    second = _run(report_db, settings, send=True)
    assert [o.status for o in first.outcomes] == [SENT]
    assert [o.status for o in second.outcomes] == [SKIPPED]
    assert "already sent for 2026-11-28 (UTC): use --resend" in second.outcomes[0].error
    assert len(smtp.received) == 1
    third = _run(report_db, settings, resend=True)
    assert [o.status for o in third.outcomes] == [SENT]
    assert len(smtp.received) == 2
    assert smtp.received[0].message["Message-ID"] != smtp.received[1].message["Message-ID"]
    df = _sends(report_db)
    assert sorted(df["status"]) == ["sent", "sent"] and sorted(df["resend"]) == [False, True]


def test_another_day_or_zone_is_a_different_email(report_db, smtp):
    settings = _settings(smtp)
    _run(report_db, settings, send=True)
    run_daily(report_db, settings=settings, day=DAY - timedelta(days=1), tz="UTC",
              now_unix_s=NOW, send=True, env={}, sleep=lambda s: None)
    run_daily(report_db, settings=settings, day=DAY, tz="Asia/Kolkata", now_unix_s=NOW,
              send=True, env={}, sleep=lambda s: None)
    assert len(smtp.received) == 3


def test_a_new_recipient_gets_the_day_that_others_already_got(report_db, smtp):
    _run(report_db, _settings(smtp), send=True)
    run = _run(report_db, _settings(smtp, recipients_by_model={"tiny-llama": ["new@example.com"]}),
               send=True)
    assert sorted(o.status for o in run.outcomes) == [SENT, SKIPPED]
    assert recipients_of(smtp.received) == [["new@example.com"], ["oncall@example.com"]]


def test_dry_run_connects_to_nothing_and_records_nothing(report_db, tmp_path):
    port = free_port()  # nothing listens here: a connection attempt would fail
    eml = tmp_path / "eml"
    run = _run(report_db, _settings(smtp_host="127.0.0.1", smtp_port=port), dry_run=True,
               eml_dir=str(eml))
    assert [o.status for o in run.outcomes] == [DRY_RUN]
    assert _sends(report_db).empty
    (path,) = eml.glob("*.eml")
    assert b"Subject: [prefixscope] ALERT tiny-llama 12.0% hit rate 2026-11-28" in path.read_bytes()


def test_no_recipients_is_a_config_error(report_db):
    with pytest.raises(ConfigError, match="no recipients"):
        _run(report_db, _settings(recipients=[]), send=True)


# --- SMTP down, temporary failures -------------------------------------------------------------


def test_smtp_down_retries_with_backoff_then_clear_error_and_nothing_sent(report_db):
    port = free_port()
    waits: list[float] = []
    run = _run(report_db, _settings(smtp_host="127.0.0.1", smtp_port=port, smtp_attempts=4,
                                    smtp_backoff_s=1.5), send=True, sleep=waits.append)
    (o,) = run.outcomes
    assert o.status == FAILED and o.attempts == 4 and o.error == "connection refused"
    assert waits == [1.5, 3.0, 6.0]
    with pytest.raises(SmtpUnavailable) as exc:
        run.raise_for_failures()
    msg = str(exc.value)
    assert f"SMTP 127.0.0.1:{port}" in msg and "oncall@example.com" in msg
    assert "connection refused after 4 attempt(s)" in msg and "not sent" in msg
    df = _sends(report_db)
    assert df["status"].tolist() == ["failed"] and df["attempts"].tolist() == [4]
    assert df["error"].tolist() == ["connection refused"]
    assert "sent" not in set(df["status"])


def test_failed_day_is_sent_by_the_next_run(report_db):
    port = free_port()
    settings = _settings(smtp_host="127.0.0.1", smtp_port=port, smtp_attempts=1)
    assert _run(report_db, settings, send=True).outcomes[0].status == FAILED
    from aiosmtpd.controller import Controller

    from tests.alerts_support import RecordingHandler

    handler = RecordingHandler()
    controller = Controller(handler, hostname="127.0.0.1", port=port, ready_timeout=10)
    controller.start()
    try:
        assert _run(report_db, settings, send=True).outcomes[0].status == SENT
    finally:
        controller.stop()
    assert len(handler.received) == 1
    assert sorted(_sends(report_db)["status"]) == ["failed", "sent"]


def test_temporary_4xx_is_retried_and_then_sent(report_db, smtp):
    smtp.handler.fail_next = ["451 4.3.0 mailbox busy, try later"]
    waits: list[float] = []
    run = _run(report_db, _settings(smtp), send=True, sleep=waits.append)
    (o,) = run.outcomes
    assert o.status == SENT and o.attempts == 2 and waits == [0.5]
    assert smtp.handler.data_attempts == 2 and len(smtp.received) == 1
    assert _sends(report_db)["attempts"].tolist() == [2]


def test_permanent_5xx_is_not_retried(report_db, smtp):
    smtp.handler.fail_next = ["554 5.7.1 rejected by policy"]
    waits: list[float] = []
    run = _run(report_db, _settings(smtp), send=True, sleep=waits.append)
    (o,) = run.outcomes
    assert o.status == FAILED and o.attempts == 1 and waits == []
    assert o.error == "SMTPDataError: 554 5.7.1 rejected by policy"
    with pytest.raises(SmtpUnavailable):
        run.raise_for_failures()


# --- TLS and credentials ---------------------------------------------------------------------


@pytest.fixture
def tls_smtp(request, tmp_path):
    server = start_smtp(security=request.param, folder=tmp_path,
                        users={"alerts": "s3cret-pw"})
    yield request.param, server
    server.stop()


@pytest.mark.parametrize("tls_smtp", ["starttls", "ssl"], indirect=True)
def test_tls_with_login_from_environment(report_db, tls_smtp):
    security, server = tls_smtp
    settings = _settings(server, smtp_security=security, smtp_user="alerts",
                         smtp_ca_file=str(server.cert))
    run = _run(report_db, settings, send=True, env={"PREFIXSCOPE_SMTP_PASSWORD": "s3cret-pw"})
    assert [o.status for o in run.outcomes] == [SENT]
    (got,) = server.received
    assert got.tls and got.auth_user == "alerts"
    assert "s3cret-pw" not in _sends(report_db).to_string()


@pytest.mark.parametrize("tls_smtp", ["starttls"], indirect=True)
def test_password_from_a_secret_file(report_db, tls_smtp, tmp_path):
    _, server = tls_smtp
    secret = tmp_path / "smtp-password"
    secret.write_text("s3cret-pw\n")
    settings = _settings(server, smtp_security="starttls", smtp_user="alerts",
                         smtp_ca_file=str(server.cert), smtp_password_file=str(secret))
    assert _run(report_db, settings, send=True).outcomes[0].status == SENT
    other = tmp_path / "other"
    other.write_text("s3cret-pw")
    settings = _settings(server, smtp_security="starttls", smtp_user="alerts",
                         smtp_ca_file=str(server.cert))
    run = _run(report_db, settings, resend=True, env={"PREFIXSCOPE_SMTP_PASSWORD_FILE": str(other)})
    assert run.outcomes[0].status == SENT and len(server.received) == 2


@pytest.mark.parametrize("tls_smtp", ["starttls"], indirect=True)
def test_wrong_password_fails_at_once(report_db, tls_smtp):
    _, server = tls_smtp
    settings = _settings(server, smtp_security="starttls", smtp_user="alerts",
                         smtp_ca_file=str(server.cert))
    run = _run(report_db, settings, send=True, env={"PREFIXSCOPE_SMTP_PASSWORD": "wrong"})
    (o,) = run.outcomes
    assert o.status == FAILED and o.attempts == 1 and o.error.startswith("SMTPAuthenticationError: 535")
    assert server.received == []


@pytest.mark.parametrize("tls_smtp", ["starttls"], indirect=True)
def test_untrusted_certificate_fails_without_retry(report_db, tls_smtp):
    _, server = tls_smtp
    settings = _settings(server, smtp_security="starttls", smtp_user="alerts")
    run = _run(report_db, settings, send=True, env={"PREFIXSCOPE_SMTP_PASSWORD": "s3cret-pw"})
    (o,) = run.outcomes
    assert o.status == FAILED and o.attempts == 1 and "certificate verify failed" in o.error


@pytest.mark.parametrize("tls_smtp", ["starttls"], indirect=True)
def test_plain_connection_to_a_starttls_only_server_is_refused(report_db, tls_smtp):
    _, server = tls_smtp
    run = _run(report_db, _settings(server), send=True)
    (o,) = run.outcomes
    assert o.status == FAILED and o.attempts == 1 and "530" in o.error


def test_credentials_over_plain_smtp_are_refused(report_db):
    with pytest.raises(ConfigError, match="unencrypted"):
        _run(report_db, _settings(smtp_user="alerts"), send=True,
             env={"PREFIXSCOPE_SMTP_PASSWORD": "x"})


def test_user_without_password_is_a_config_error(report_db):
    with pytest.raises(ConfigError, match="no password"):
        _run(report_db, _settings(smtp_user="alerts", smtp_security="starttls"), send=True)
