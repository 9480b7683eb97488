"""The daily report POSTed to webhooks (issue 29 item 5) against a real HTTP server on loopback:
the Slack-compatible and plain JSON bodies, exactly one delivery per day under retries and
re-runs, ``--resend``, a permanent 4xx not retried, a URL that is a secret (never stored, never
printed), and webhooks beside or instead of the email."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from prefixscope.alerts.job import FAILED, SENT, SKIPPED
from prefixscope.alerts.webhook import WebhookUnavailable
from prefixscope.core.config import AlertsConfig, Settings
from prefixscope.core.errors import ConfigError
from prefixscope.store import db as store_db
from tests.test_alerts_mail import DAY, _report_db_template, _run  # noqa: F401  (fixture)


class _Hook:
    """A webhook receiver on 127.0.0.1: answers the next statuses in ``script`` (then 200) and
    keeps every body it was sent, with the status it answered."""

    def __init__(self, script: list[int] | None = None) -> None:
        self.script = list(script or [])
        self.received: list[tuple[int, dict]] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                n = int(self.headers.get("Content-Length", "0"))
                doc = json.loads(self.rfile.read(n))
                with lock:
                    status = outer.script.pop(0) if outer.script else 200
                    outer.received.append((status, doc))
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"busy, try later")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/T000/B000/s3cr3tT0ken"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def delivered(self) -> list[dict]:
        return [doc for status, doc in self.received if status == 200]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook():
    h = _Hook()
    yield h
    h.stop()


@pytest.fixture
def report_db(_report_db_template, db_path):  # noqa: F811
    shutil.copyfile(_report_db_template, db_path)
    return db_path


def _settings(*hooks: dict, **alerts) -> Settings:
    base = dict(recipients=[], dashboard_url="https://dash.example.com/", smtp_attempts=3,
                smtp_backoff_s=0.5, smtp_timeout_s=5, webhooks=list(hooks))
    base.update(alerts)
    return Settings(alerts=AlertsConfig(**base))


def _sends(db):
    with store_db.reader(db) as con:
        return con.execute("SELECT recipients, status, attempts, smtp_host, error FROM "
                           "alert_sends ORDER BY created_unix_s").fetchall()


def test_slack_body_holds_the_report_and_a_link_and_is_sent_once_per_day(report_db, hook):
    settings = _settings({"name": "oncall-slack", "url_env": "SLACK_URL", "format": "slack"})
    env = {"SLACK_URL": hook.url}
    run = _run(report_db, settings, send=True, env=env)
    assert [o.status for o in run.webhook_outcomes] == [SENT] and run.outcomes == []
    assert len(hook.delivered) == 1
    text = hook.delivered[0]["text"]
    assert text.startswith("*[prefixscope] ALERT tiny-llama 12.0% hit rate 2026-11-28")
    assert "```\nprefixscope daily report for 2026-11-28 (UTC" in text
    assert "tiny-llama" in text and "qwen-small" in text
    assert text.endswith("<https://dash.example.com/alerts?day=2026-11-28&tz=UTC|Open the dashboard>")
    # a second run of the day posts nothing; --resend posts again
    again = _run(report_db, settings, send=True, env=env)
    assert [o.status for o in again.webhook_outcomes] == [SKIPPED]
    assert "already sent for 2026-11-28 (UTC)" in again.webhook_outcomes[0].error
    assert len(hook.delivered) == 1
    _run(report_db, settings, resend=True, env=env)
    assert len(hook.delivered) == 2
    # the log names the webhook and the host, never the URL or its token
    rows = _sends(report_db)
    assert [(r[0], r[1]) for r in rows] == [("webhook:oncall-slack", "sent")] * 2
    assert rows[0][3] == f"127.0.0.1:{hook.server.server_port}"
    with store_db.reader(report_db) as con:
        dump = str(con.execute("SELECT * FROM alert_sends").fetchall())
    assert "s3cr3tT0ken" not in dump and "/services/" not in dump


def test_json_body_carries_the_figures_of_report_daily_json(report_db, hook, cli, tmp_path):
    url_file = tmp_path / "url"
    url_file.write_text(hook.url + "\n")
    run = _run(report_db, _settings({"name": "pager", "url_file": str(url_file),
                                     "format": "json"}), send=True)
    assert [o.status for o in run.webhook_outcomes] == [SENT]
    doc = hook.delivered[0]
    assert (doc["source"], doc["day"], doc["tz"], doc["status"]) == (
        "prefixscope", "2026-11-28", "UTC", "ALERT")
    assert doc["dashboard_url"] == "https://dash.example.com/alerts?day=2026-11-28&tz=UTC"
    by_label = {ln["label"]: ln for ln in doc["lines"]}
    assert by_label["tiny-llama"]["status"] == "ALERT"
    assert by_label["tiny-llama"]["figures"]["cached_tokens"] == 12_000
    assert by_label["tiny-llama"]["figures"]["prompt_tokens"] == 100_000
    assert by_label["qwen-small"]["status"] == "OK"


def test_retries_5xx_and_429_then_delivers_exactly_once(report_db):
    hook = _Hook(script=[503, 429])
    try:
        waits: list[float] = []
        settings = _settings({"name": "h", "url": hook.url, "format": "json"})
        run = _run(report_db, settings, send=True, sleep=waits.append)
        assert [(o.status, o.attempts) for o in run.webhook_outcomes] == [(SENT, 3)]
        assert [s for s, _ in hook.received] == [503, 429, 200] and len(hook.delivered) == 1
        assert waits == [0.5, 1.0]  # the email's backoff: 0.5 s doubled
        for _ in range(3):  # re-runs of the day (cron retries): nothing more
            _run(report_db, settings, send=True)
        assert len(hook.delivered) == 1
    finally:
        hook.stop()


def test_a_failed_day_is_recorded_failed_and_posted_by_the_next_run(report_db):
    hook = _Hook(script=[500, 500, 500])
    try:
        settings = _settings({"name": "h", "url": hook.url, "format": "slack"})
        run = _run(report_db, settings, send=True)
        assert [(o.status, o.attempts) for o in run.webhook_outcomes] == [(FAILED, 3)]
        assert run.webhook_outcomes[0].error == "HTTP 500: busy, try later"
        with pytest.raises(WebhookUnavailable, match=r"webhook:h: HTTP 500: busy, try later "
                                                     r"after 3 attempt\(s\)") as exc:
            run.raise_for_failures()
        assert exc.value.exit_code == 3 and "s3cr3t" not in str(exc.value)
        assert hook.delivered == []
        nxt = _run(report_db, settings, send=True)
        assert [o.status for o in nxt.webhook_outcomes] == [SENT] and len(hook.delivered) == 1
        assert [r[1] for r in _sends(report_db)] == ["failed", "sent"]
    finally:
        hook.stop()


def test_a_permanent_4xx_is_not_retried(report_db):
    hook = _Hook(script=[404])
    try:
        run = _run(report_db, _settings({"name": "gone", "url": hook.url}), send=True)
        assert [(o.status, o.attempts) for o in run.webhook_outcomes] == [(FAILED, 1)]
        assert run.webhook_outcomes[0].error.startswith("HTTP 404")
    finally:
        hook.stop()


def test_an_unreachable_webhook_names_the_host_never_the_url(report_db):
    from tests.alerts_support import free_port

    url = f"http://127.0.0.1:{free_port()}/hooks/s3cr3tT0ken"
    run = _run(report_db, _settings({"name": "down", "url": url, "attempts": 2}), send=True)
    o = run.webhook_outcomes[0]
    assert (o.status, o.attempts) == (FAILED, 2) and o.error.startswith("ConnectError")
    assert "s3cr3t" not in o.error


def test_dry_run_posts_nothing_and_records_nothing(report_db, hook):
    run = _run(report_db, _settings({"name": "h", "url": hook.url}), dry_run=True)
    assert [o.status for o in run.webhook_outcomes] == ["dry-run"]
    assert hook.received == [] and _sends(report_db) == []


@pytest.mark.parametrize(("table", "env", "message"), [
    ({"name": "h"}, {}, "set exactly one of url, url_file, url_env (0 set)"),
    ({"name": "h", "url": "http://a", "url_env": "X"}, {"X": "http://b"}, "(2 set)"),
    ({"name": "h", "url_env": "NOPE"}, {}, "environment variable NOPE is not set"),
    ({"name": "h", "url": "javascript:alert(1)"}, {}, "url: not an http(s) URL with a host"),
    ({"name": "h", "url_file": "/nonexistent/url"}, {}, "url_file: cannot read /nonexistent/url"),
])
def test_a_webhook_without_a_usable_url_is_a_config_error(report_db, table, env, message):
    with pytest.raises(ConfigError, match=r"alerts\.webhooks\['h'\]") as exc:
        _run(report_db, _settings(table), send=True, env=env)
    assert message in str(exc.value)


def test_the_report_daily_command_prints_the_webhook_outcome(report_db, hook, cli, tmp_path):
    cfg = tmp_path / "prefixscope.toml"
    cfg.write_text('[alerts]\ndashboard_url = "https://dash.example.com/"\n\n'
                   '[[alerts.webhooks]]\nname = "oncall"\nurl_env = "HOOK_URL"\n')
    import os

    os.environ["HOOK_URL"] = hook.url
    try:
        code, out, err = cli(["report", "daily", "--db", report_db, "--day", DAY.isoformat(),
                              "--tz", "UTC", "--send", "--config", cfg])
    finally:
        del os.environ["HOOK_URL"]
    assert code == 0, err
    assert "sent to webhook:oncall: [prefixscope] ALERT tiny-llama" in out
    assert "s3cr3t" not in out + err and len(hook.delivered) == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("kind", "reason"), [("fifo", "FIFO"), ("big", "larger than 4,096 bytes"),
                                             ("binary", "not UTF-8 text"),
                                             ("folder", "folder")])
def test_a_url_file_that_is_no_small_text_file_is_a_config_error_not_a_hang(report_db, tmp_path,
                                                                           kind, reason):
    """Hostile ``url_file``s: a FIFO (read, it would block for ever), a large file, bytes
    that are not UTF-8, a folder: each a ConfigError naming the key, at once."""
    import os

    path = tmp_path / "url"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "big":
        path.write_text("http://127.0.0.1/" + "a" * 10_000)
    elif kind == "binary":
        path.write_bytes(b"http://127.0.0.1/\xff\xfe\n")
    else:
        path.mkdir()
    with pytest.raises(ConfigError, match=r"alerts\.webhooks\['h'\]\.url_file: cannot read ") as exc:
        _run(report_db, _settings({"name": "h", "url_file": str(path)}), send=True)
    assert reason.lower() in str(exc.value).lower(), str(exc.value)
