"""The daily email's dashboard link takes http:// and https:// URLs with a host only (from
``--dashboard-url``, env PREFIXSCOPE_DASHBOARD_URL or the config file), and it is
HTML-escaped in the email body."""

from __future__ import annotations

import json
import time
from datetime import date

import duckdb
import pytest

from tests.hostile.support import fresh_db, run_cli

BAD = ["javascript:alert(1)", "JavaScript:alert(1)", "data:text/html,<script>x</script>",
       "file:///etc/passwd", "http://", "https:///nohost", "//example.com/x", "example.com",
       "http://exa mple.com/", "http://example.com/\nX-Injected: 1", "http://example.com:xx/"]


@pytest.mark.parametrize("url", BAD)
def test_dashboard_url_flag_refuses_anything_but_http_with_a_host(url, tmp_path):
    code, out, err = run_cli(["report", "daily", "--db", fresh_db(tmp_path), "--dry-run",
                              "--dashboard-url", url])
    assert code == 2, (out, err)
    assert err.startswith("error: --dashboard-url: '")
    assert "is not an http:// or https:// URL with a host" in err
    assert "\nX-Injected" not in err  # a control character is shown escaped


def test_env_and_config_urls_are_checked_too(tmp_path, monkeypatch):
    db = fresh_db(tmp_path)
    monkeypatch.setenv("PREFIXSCOPE_DASHBOARD_URL", "javascript:alert(1)")
    code, out, err = run_cli(["report", "daily", "--db", db, "--dry-run"])
    assert code == 2
    assert "PREFIXSCOPE_DASHBOARD_URL: 'javascript:alert(1)' is not an http:// or https:// " \
           "URL with a host" in err
    monkeypatch.delenv("PREFIXSCOPE_DASHBOARD_URL")
    cfg = tmp_path / "prefixscope.toml"
    cfg.write_text('[alerts]\ndashboard_url = "javascript:alert(2)"\n')
    monkeypatch.setenv("PREFIXSCOPE_CONFIG", str(cfg))
    code, out, err = run_cli(["report", "daily", "--db", db, "--dry-run"])
    assert code == 2
    assert "alerts.dashboard_url: 'javascript:alert(2)' is not an http:// or https:// URL" in err
    cfg.write_text('[dashboard]\npublic_url = "https://dash.example.com/"\n')
    code, out, err = run_cli(["report", "daily", "--db", db, "--dry-run"])
    assert code == 0, err
    assert "https://dash.example.com/alerts" in out


def test_the_link_is_html_escaped_in_the_email(tmp_path):
    from prefixscope.alerts.daily import build_daily_report
    from prefixscope.alerts.render import render_html
    from prefixscope.core.config import AlertsConfig

    log = tmp_path / "u.jsonl"
    log.write_text(json.dumps({"id": "r1", "model": "m", "created": 1796000000, "usage": {
        "prompt_tokens": 100, "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 80}}}) + "\n")
    db = fresh_db(tmp_path)
    assert run_cli(["ingest", "requests", log, "--db", db])[0] == 0
    with duckdb.connect(db, read_only=True) as con:
        report = build_daily_report(con, day=date(2026, 11, 30), tz="UTC", cfg=AlertsConfig(),
                                    now_unix_s=time.time())
    html = render_html(report, dashboard_url='https://dash.example.com/x?a="><script>1</script>')
    assert "<script>" not in html
    assert 'href="https://dash.example.com/x?a=&quot;&gt;&lt;script&gt;1&lt;/script&gt;' in html
