"""The daily report's ALERT hint names the top breaker of the model's newest diagnosis (stored
through the real diagnose -> breakers.json -> ingest path); OK lines and models without a
diagnosis keep the users' line unchanged."""

from __future__ import annotations

import json
from datetime import date, timedelta

from prefixscope.alerts.daily import build_daily_report
from prefixscope.cli.commands.diagnose import diagnosis_doc
from prefixscope.core.config import AlertsConfig
from prefixscope.core.report import ALERT, OK
from prefixscope.ingest.breakers import ingest_breakers_file
from prefixscope.replay.diagnose import DiagnoseSpec
from prefixscope.replay.diagnose_fix import diagnose
from prefixscope.replay.diagnose_store import write_breakers_file
from tests.alerts_support import CounterSource, local_ts

DAY = date(2026, 11, 28)
STABLE = "\n".join(f"Rule {i}: answer with short and correct examples for module {i}." for i in
                   range(20))


def _diagnosis(con, tmp_path, model: str) -> None:
    path = tmp_path / f"{model}.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(6):
            fh.write(json.dumps({"t": i, "output_tokens": 0, "messages": [
                {"role": "system", "content": f"Current time: 2026-11-28T09:{i:02d}:00Z\n{STABLE}"},
                {"role": "user", "content": f"Question {i} about something else entirely?"}]})
                + "\n")
    d = diagnose(DiagnoseSpec(trace=str(path)))
    f = write_breakers_file(tmp_path / f"{model}-breakers.json", d, diagnosis_doc(d),
                            run_id=f"sim-{model}", model=model)
    assert ingest_breakers_file(con, f) == len(d.breakers) >= 1


def _day(con, tmp_path, model: str, hits: int) -> None:
    folder = tmp_path / model
    folder.mkdir()
    src = CounterSource(folder, f"{model}:8000", model,
                        created_unix_s=local_ts(DAY - timedelta(days=9), 0))
    src.day(con, DAY, queries=644_000, hits=hits, every_h=2)


def test_alert_line_names_the_top_breaker(con, tmp_path):
    _day(con, tmp_path, "bot", hits=0)
    _day(con, tmp_path, "ok-model", hits=600_000)
    _day(con, tmp_path, "other", hits=0)
    _diagnosis(con, tmp_path, "bot")
    _diagnosis(con, tmp_path, "ok-model")
    rep = build_daily_report(con, day=DAY, tz="UTC", cfg=AlertsConfig(),
                             now_unix_s=local_ts(DAY, 30))
    lines = {ln.model: ln for ln in rep.lines if ln.scope is None}
    assert lines["bot"].status == ALERT
    assert lines["bot"].text == (
        "0 of 644,000 prompt tokens from cache (0.0%): ALERT: check the top of the prompt "
        "(top breaker: timestamp on line 1 of message 0 (system), see prefixscope diagnose)")
    assert lines["bot"].top_breaker["kind"] == "timestamp"
    # OK lines keep the users' line; a model without a diagnosis keeps the plain hint.
    assert lines["ok-model"].status == OK
    assert lines["ok-model"].text == "600,000 of 644,000 prompt tokens from cache (93.2%): OK"
    assert lines["other"].text.endswith("ALERT: check the top of the prompt")
