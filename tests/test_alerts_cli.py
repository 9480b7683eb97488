"""``prefixscope report daily`` through the CLI runner: text, JSON, sending once, errors."""

from __future__ import annotations

import json
from datetime import date, timedelta

import pytest

from prefixscope.store import db as store_db
from tests.alerts_support import CounterSource, free_port, local_ts, start_smtp

DAY = date(2026, 11, 28)


@pytest.fixture
def daily_db(db_path, tmp_path):
    folder = tmp_path / "scrapes"
    folder.mkdir()
    with store_db.writer(db_path) as con:
        src = CounterSource(folder, "vllm-a:8000", "tiny-llama", local_ts(DAY - timedelta(days=2), 0))
        src.day(con, DAY - timedelta(days=1), queries=600_000, hits=570_000, every_h=8)
        src.day(con, DAY, queries=644_000, hits=608_000, every_h=3)
    return db_path


def _config(tmp_path, port: int, **extra) -> str:
    lines = ["[alerts]", 'recipients = ["oncall@example.com"]', 'smtp_host = "127.0.0.1"',
             f"smtp_port = {port}", "smtp_attempts = 2", "smtp_backoff_s = 0.01",
             'dashboard_url = "http://dash.local:8501"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    path = tmp_path / "prefixscope.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_help_has_an_example(cli):
    code, out, _ = cli(["report", "daily", "--help"])
    assert code == 0 and "Example: prefixscope report daily --date" in out


def test_prints_the_report(cli, daily_db, tmp_path):
    cfg = _config(tmp_path, free_port())
    code, out, err = cli(["report", "daily", "--db", daily_db, "--date", "2026-11-28",
                          "--tz", "UTC", "--config", cfg])
    assert code == 0, err
    assert "prefixscope daily report for 2026-11-28 (UTC" in out
    assert "tiny-llama  608,000 of 644,000 prompt tokens from cache (94.4%): OK" in out
    assert "Dashboard: http://dash.local:8501/alerts?day=2026-11-28&tz=UTC" in out
    assert "sent to" not in out


def test_json(cli, daily_db, tmp_path):
    cfg = _config(tmp_path, free_port())
    code, out, _ = cli(["report", "daily", "--db", daily_db, "--date", "2026-11-28",
                        "--config", cfg, "--json"])
    assert code == 0
    doc = json.loads(out)
    assert doc["day"] == "2026-11-28" and doc["tz"] == "UTC" and doc["status"] == "OK"
    (line,) = doc["lines"]
    assert line["model"] == "tiny-llama" and line["scope"] is None
    assert line["figures"] == {"source": "metrics", "prompt_tokens": 644000,
                               "cached_tokens": 608000, "hit_rate": pytest.approx(608 / 644),
                               "restarts": 0, "requests": None, "coverage": None}
    assert line["change_prev_day"] == pytest.approx(608 / 644 - 0.95)
    assert doc["emails"] == []


def test_send_once_then_skip_then_resend(cli, daily_db, tmp_path):
    server = start_smtp()
    try:
        cfg = _config(tmp_path, server.port)
        args = ["report", "daily", "--db", daily_db, "--date", "2026-11-28", "--config", cfg]
        code, out, err = cli(args + ["--send"])
        assert code == 0, err
        assert "sent to oncall@example.com: [prefixscope] OK tiny-llama 94.4% hit rate 2026-11-28" in out
        code, out, _ = cli(args + ["--send"])
        assert code == 0
        assert "skipped oncall@example.com: already sent for 2026-11-28 (UTC): use --resend" in out
        code, out, _ = cli(args + ["--resend", "--json"])
        assert code == 0 and [e["status"] for e in json.loads(out)["emails"]] == ["sent"]
        assert len(server.received) == 2
    finally:
        server.stop()


def test_smtp_down_exits_3_with_a_clear_message(cli, daily_db, tmp_path):
    port = free_port()
    cfg = _config(tmp_path, port)
    code, out, err = cli(["report", "daily", "--db", daily_db, "--date", "2026-11-28",
                          "--config", cfg, "--send"])
    assert code == 3
    assert err.startswith(f"error: SMTP 127.0.0.1:{port}: 1 report email(s) not sent (to "
                          "oncall@example.com: connection refused after 2 attempt(s))")
    assert "Traceback" not in err
    assert "FAILED to oncall@example.com: connection refused after 2 attempt(s)" in out
    code, out, _ = cli(["db", "info", "--db", daily_db, "--json"])
    assert json.loads(out)["tables"]["alert_sends"] == 1


def test_dry_run_writes_eml(cli, daily_db, tmp_path):
    cfg = _config(tmp_path, free_port())
    eml = tmp_path / "out"
    code, out, _ = cli(["report", "daily", "--db", daily_db, "--date", "2026-11-28",
                        "--config", cfg, "--dry-run", "--eml-dir", eml])
    assert code == 0
    assert "dry run, would send to oncall@example.com" in out
    assert len(list(eml.glob("*.eml"))) == 1


def test_dry_run_without_recipients_renders_the_report(cli, daily_db, tmp_path):
    cfg = tmp_path / "empty.toml"
    cfg.write_text("[alerts]\n")
    eml = tmp_path / "out"
    code, out, err = cli(["report", "daily", "--db", daily_db, "--date", "2026-11-28",
                          "--config", cfg, "--dry-run", "--eml-dir", eml])
    assert code == 0, err
    assert "tiny-llama  608,000 of 644,000 prompt tokens from cache (94.4%): OK" in out
    assert ("dry run, no recipients configured ([alerts] recipients, recipients_by_model or "
            "recipients_by_scope): nothing would be sent; the email would be: "
            "[prefixscope] OK tiny-llama 94.4% hit rate 2026-11-28, written to ") in out
    (path,) = eml.glob("*.eml")
    assert b"X-Prefixscope-Status: OK" in path.read_bytes()
    code, out, _ = cli(["report", "daily", "--db", daily_db, "--date", "2026-11-28",
                        "--config", cfg, "--dry-run", "--json"])
    assert code == 0
    (email,) = json.loads(out)["emails"]
    assert email["recipients"] == [] and email["status"] == "dry-run"
    assert email["error"].startswith("no recipients configured")
    code, _, err = cli(["report", "daily", "--db", daily_db, "--date", "2026-11-28",
                        "--config", cfg, "--send"])
    assert code == 2 and "no recipients" in err


@pytest.mark.parametrize(("args", "message"), [
    (["--date", "28/11/2026"], "error: --date: cannot read '28/11/2026': use YYYY-MM-DD"),
    (["--tz", "Mars/Base"], "error: --tz: unknown time zone 'Mars/Base'"),
    (["--tz", "x" * 10_000], "error: --tz: unknown time zone '" + "x" * 64 + "...'"),  # was OSError
    (["--tz", "\x1b[31mRed"], "error: --tz: unknown time zone '\\x1b[31mRed'"),
])
def test_bad_arguments_exit_2(cli, daily_db, tmp_path, args, message):
    cfg = _config(tmp_path, free_port())
    code, _, err = cli(["report", "daily", "--db", daily_db, "--config", cfg, *args])
    assert code == 2 and err.startswith(message)


def test_bad_timezone_in_config_names_the_key(cli, daily_db, tmp_path):
    cfg = _config(tmp_path, free_port(), timezone="Nowhere/Town")
    code, _, err = cli(["report", "daily", "--db", daily_db, "--config", cfg])
    assert code == 2 and "alerts.timezone: unknown time zone 'Nowhere/Town'" in err


def test_missing_database(cli, tmp_path):
    cfg = _config(tmp_path, free_port())
    code, _, err = cli(["report", "daily", "--db", tmp_path / "none.duckdb", "--config", cfg])
    assert code == 3 and "no database at" in err


def test_a_run_killed_during_smtp_is_named_and_retried(daily_db, tmp_path):
    """Issue 11 item 8: a run killed while SMTP hangs leaves a ``sending`` row with 0 attempts;
    the next run says so and sends, instead of "already sent"."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    from tests.dashboard_support import PREFIXSCOPE

    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(8)  # accepts the TCP connection in the backlog and never greets: SMTP waits
    try:
        cfg = _config(tmp_path, hang.getsockname()[1])
        args = [PREFIXSCOPE, "report", "daily", "--db", daily_db, "--date", "2026-11-28",
                "--config", cfg, "--send"]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and status != "sending":
            assert proc.poll() is None, "the run ended before its claim was seen"
            with store_db.reader(daily_db) as con:
                row = con.execute("SELECT status, attempts FROM alert_sends").fetchone()
            status = row[0] if row else None
            time.sleep(0.2)
        assert status == "sending" and row[1] == 0
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        hang.close()
    server = start_smtp()
    try:
        cfg = _config(tmp_path, server.port)
        done = subprocess.run([sys.executable, "-c", "from prefixscope.cli.root import main; main()",
                               *args[1:-3], "--config", cfg, "--send"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert (f"the send to oncall@example.com claimed by pid {proc.pid} was never finished "
                "(0 SMTP attempts recorded): that run died; sending again") in done.stdout
        assert "sent to oncall@example.com: [prefixscope] OK tiny-llama 94.4% hit rate" in done.stdout
        assert len(server.received) == 1
        with store_db.reader(daily_db) as con:
            rows = con.execute("SELECT status, error FROM alert_sends ORDER BY created_unix_s").fetchall()
        assert rows[0][0] == "failed" and f"pid {proc.pid}" in rows[0][1] and rows[1][0] == "sent"
    finally:
        server.stop()
