"""The ALERT hint on gateway traffic names what the decision log says of the misses (finding 6
of the session-8 new-user walk): a day whose misses came from the gateway's cache-epoch bumps,
a revocation and a bypassed request read "check the top of the prompt" in ``report``, the
daily report, its email and the Alerts page. Real logs: the new user's gateway run in front of
the real vLLM CPU server (``tests/gateway_logs/newuser8``: 23 usage and 39 decision records,
digests only; its bypassed request, logged ``accept`` of 576 tokens by that build, as the
fixed gateway writes it: ``bypass`` true, ``accepted_cached_tokens`` 0), through the real
ingest path; the email through a real SMTP server (aiosmtpd);
the pages in AppTest. One rule for all of them: ``prefixscope.core.report.alert_hint`` through
``prefixscope.store.queries.alerts.alert_hints``."""

from __future__ import annotations

import json
import shutil
from datetime import date
from pathlib import Path

import pytest

from prefixscope.core.config import AlertsConfig, Settings
from prefixscope.store import db as store_db
from tests.alerts_support import parts_by_type, start_smtp

LOGS = Path(__file__).parent / "gateway_logs" / "newuser8"
DAY = date(2026, 12, 2)
NOW = 1796186000.0  # 2026-12-02 04:33 UTC, after the run
MODEL = "tiny-llama-random"
HEAD = "5,760 of 12,749 prompt tokens from cache (45.2%): ALERT: "
#: 4 rejected (3 after the two cache-epoch bumps, 1 after the revocation), the bypassed
#: request (an accept sent with bypass on), 8 ordinary misses (no candidate);
#: the 7 refused requests (400/404/413, the upstream's 500, the shutdown) are not misses.
HINT = ("4 of 13 misses were gateway rejections after a cache-epoch bump or a revocation "
        "(cache_epoch 3, authorization_epoch 1) and 1 sent with the cache bypass on, per "
        "the decision log; for the other 8: check the top of the prompt")


@pytest.fixture(scope="module")
def _gw_template(tmp_path_factory):
    from prefixscope.ingest.decisions import ingest_decisions_file
    from prefixscope.ingest.usage import ingest_usage_file

    path = str(tmp_path_factory.mktemp("gw-hint") / "gw.duckdb")
    with store_db.writer(path) as con:
        ingest_usage_file(con, LOGS / "usage.jsonl")
        ingest_decisions_file(con, LOGS / "decisions.jsonl")
        con.execute("CHECKPOINT")
    return path


@pytest.fixture
def gw_db(_gw_template, db_path):
    shutil.copyfile(_gw_template, db_path)
    return db_path


def test_report_text_and_json_name_the_decision_log(cli, db_path):
    for kind, name in (("requests", "usage.jsonl"), ("decisions", "decisions.jsonl")):
        assert cli(["ingest", kind, LOGS / name, "--db", db_path])[0] == 0
    code, out, _ = cli(["report", "--db", db_path])
    assert code == 0
    assert out.splitlines()[1:] == [f"{MODEL}  {HEAD}{HINT}", f"overall            {HEAD}{HINT}"]
    code, out, _ = cli(["report", "--db", db_path, "--json"])
    doc = json.loads(out)
    assert [ln["text"] for ln in doc["lines"]] == [HEAD + HINT] * 2
    # the default range's bounds are exact whole seconds (finding 11)
    assert '"end_unix_s": 1796183851.0,' in out and '"start_unix_s": 1796097451.0,' in out
    code, out, _ = cli(["report", "daily", "--db", db_path, "--date", DAY.isoformat(),
                        "--tz", "UTC", "--json"])
    lines = {ln["label"]: ln for ln in json.loads(out)["lines"]}
    assert lines[MODEL]["text"] == lines[f"{MODEL} TENANT"]["text"] == HEAD + HINT
    assert lines[MODEL]["top_breaker"] is None


def test_the_email_names_the_decision_log(gw_db):
    from prefixscope.alerts.job import SENT, run_daily

    server = start_smtp()
    try:
        settings = Settings(alerts=AlertsConfig(
            recipients=["oncall@example.com"], mail_from="prefixscope@example.com",
            smtp_host=server.host, smtp_port=server.port, smtp_attempts=1))
        run = run_daily(gw_db, settings=settings, day=DAY, tz="UTC", now_unix_s=NOW, send=True,
                        env={}, sleep=lambda s: None)
        assert [o.status for o in run.outcomes] == [SENT]
        (got,) = server.received
    finally:
        server.stop()
    text = parts_by_type(got.message)["text/plain"][0].get_content()
    assert f"{MODEL}           {HEAD}{HINT}" in text
    assert "ALERT: check the top of the prompt" not in text
    html = parts_by_type(got.message)["text/html"][0].get_content()
    assert "4 of 13 misses were gateway rejections after a cache-epoch bump" in html


def test_shadow_mode_accepts_are_named_apart_from_the_bypass():
    from prefixscope.core.report import MissCauses, alert_hint

    assert alert_hint(MissCauses(ordinary=4, unserved_accepts=1)) == (
        "1 of 5 misses was an accept not served (shadow mode), per the decision log; for the "
        "other 4: check the top of the prompt")
    assert alert_hint(MissCauses(rejects=(("tokenizer_digest", 2),))) == (
        "2 of 2 misses were gateway rejections after a tokenizer digest change "
        "(tokenizer_digest 2), per the decision log")
    assert alert_hint(MissCauses(ordinary=3)) == "check the top of the prompt"
    assert alert_hint(None) == "check the top of the prompt"


def test_a_stored_diagnosis_keeps_precedence(gw_db, tmp_path):
    """The model's diagnosis still wins on its line (today's hint); its scope line and the
    report's overall line, which a diagnosis of the model does not explain, keep the log's."""
    from prefixscope.alerts.daily import build_daily_report
    from tests.test_diagnose_alerts import _diagnosis

    with store_db.writer(gw_db) as con:
        _diagnosis(con, tmp_path, MODEL)
    with store_db.reader(gw_db) as con:
        rep = build_daily_report(con, day=DAY, tz="UTC", cfg=AlertsConfig(), now_unix_s=NOW)
    lines = {ln.label: ln.text for ln in rep.lines}
    assert lines[MODEL] == (HEAD + "check the top of the prompt (top breaker: timestamp on line "
                            "1 of message 0 (system), see prefixscope diagnose)")
    assert lines[f"{MODEL} TENANT"] == HEAD + HINT


def test_alerts_page_and_overview_why(gw_db, tmp_path, monkeypatch):
    from tests import dashboard_support as ds

    cfg = tmp_path / "prefixscope.toml"
    cfg.write_text("[alerts]\ntimezone = \"UTC\"\n")
    monkeypatch.setenv("PREFIXSCOPE_CONFIG", str(cfg))
    monkeypatch.setenv("PREFIXSCOPE_DB", gw_db)
    at = ds.run_app(gw_db, "views/alerts.py")
    at.date_input(key="alerts_day").set_value(DAY)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    report = at.dataframe[0].value
    assert report["Report line"].tolist().count(HEAD + HINT) == 2
    assert not any("check the top of the prompt" == t.split("ALERT: ")[-1]
                   for t in report["Report line"])

    at = ds.run_app(gw_db, setup=lambda a: a.radio(key="filter_range").set_value("all"))
    assert not at.exception, [e.value for e in at.exception]
    (banner,) = [w for w in ds.texts(at, "warning") if f"**{MODEL} below" in w]
    from prefixscope.core.formatting import md_text

    # the hint names the decision log's reasons (data): escaped as every text from the data
    assert f"Why, from the gateway's decision log: {md_text(HINT)} (the Rejections page)" in banner
    assert "No diagnosis of" not in banner
