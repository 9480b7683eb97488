"""``prefixscope report``: the exact line users know, its rounding, the source choice and the
default range (prefixscope/core/report.py, store/queries/requests.py,
prefixscope/cli/commands/report.py)."""

from __future__ import annotations

import json

import pytest

from prefixscope.ingest.usage import ingest_usage_file
from prefixscope.core.errors import InvalidArgument
from prefixscope.core.formatting import fmt_pct, fmt_share
from prefixscope.core.report import format_report_line
from prefixscope.store.queries.requests import DEFAULT_REPORT_RANGE_S, report, report_lines
from tests.requests_support import write_jsonl

T = 1_795_960_000.0


def _usage(i, ts, prompt, cached, model):
    return {"request_id": f"{model}-{i}", "ts_unix_s": ts, "model": model,
            "usage": {"prompt_tokens": prompt,
                      "prompt_tokens_details": None if cached is None else {"cached_tokens": cached}}}


def test_the_two_lines_of_the_brief():
    assert format_report_line(608_000, 644_000, 0.5) == (
        "OK", "608,000 of 644,000 prompt tokens from cache (94.4%): OK")
    assert format_report_line(0, 644_000, 0.5) == (
        "ALERT", "0 of 644,000 prompt tokens from cache (0.0%): ALERT: check the top of the prompt")


def test_percent_is_the_pages_one_decimal_format():
    """The report line rounds as the pages do (finding 8 of session 7: 6,432 of 10,380 read
    61% in the report and 62.0% on Scopes)."""
    assert fmt_share(6_432, 10_380) == "62.0%" == fmt_pct(6_432 / 10_380)
    assert fmt_share(1_093, 10_000) == "10.9%" and fmt_share(13, 1_000) == "1.3%"
    assert fmt_share(608_000, 644_000) == "94.4%"
    assert fmt_share(1000, 1000) == "100.0%" and fmt_share(0, 5) == "0.0%"
    assert fmt_share(1, 0) == "—"
    assert format_report_line(6_432, 10_380, 0.5) == (
        "OK", "6,432 of 10,380 prompt tokens from cache (62.0%): OK")
    # the status is decided on the tokens: just under the threshold is ALERT, and its figure
    # gets the decimals that keep it under (never "50.0%: ALERT")
    assert format_report_line(4_999, 10_000, 0.5) == (
        "ALERT", "4,999 of 10,000 prompt tokens from cache (49.99%): ALERT: check the top of the prompt")
    assert format_report_line(5_000, 10_000, 0.5)[0] == "OK"
    assert format_report_line(5_000, 10_000, 0.7)[0] == "ALERT"


def test_requests_source_per_model_and_overall(con, tmp_path):
    lines = [_usage(i, T + i, 32_200, 0 if i == 0 else 32_000, "legal") for i in range(20)]
    lines += [_usage(i, T + i, 32_200, 0, "chat") for i in range(20)]
    ingest_usage_file(con, write_jsonl(tmp_path / "u.jsonl", lines))
    got = report_lines(con)
    assert [(ln.model, ln.text) for ln in got] == [
        ("chat", "0 of 644,000 prompt tokens from cache (0.0%): ALERT: check the top of the prompt"),
        ("legal", "608,000 of 644,000 prompt tokens from cache (94.4%): OK"),
        (None, "608,000 of 1,288,000 prompt tokens from cache (47.2%): ALERT: check the top of "
               "the prompt"),
    ]
    assert {ln.source for ln in got} == {"requests"}
    assert got[1].hit_rate == pytest.approx(608 / 644)


def test_requests_source_counts_only_reporting_requests(con, tmp_path):
    ingest_usage_file(con, write_jsonl(tmp_path / "u.jsonl", [
        _usage(1, T, 1000, 900, "m"), _usage(2, T + 1, 1000, None, "m")]))
    ln = report_lines(con)[0]
    assert ln.text == "900 of 1,000 prompt tokens from cache (90.0%): OK"
    assert (ln.requests, ln.reported_requests) == (2, 1)


def test_default_range_is_the_24h_ending_at_the_newest_point(con, tmp_path):
    ingest_usage_file(con, write_jsonl(tmp_path / "u.jsonl", [
        _usage(1, T - DEFAULT_REPORT_RANGE_S - 1, 1000, 0, "m"),  # older than 24 h: left out
        _usage(2, T - 100, 1000, 1000, "m"),
        _usage(3, T, 1000, 1000, "m"),  # the newest point is included
    ]))
    r = report(con)
    assert r.source == "requests" and r.end_s > T and r.end_s - r.start_s == DEFAULT_REPORT_RANGE_S
    assert r.lines[0].text == "2,000 of 2,000 prompt tokens from cache (100.0%): OK"
    r = report(con, start_s=0.0)
    assert r.lines[0].prompt_tokens == 3000
    assert report(con, start_s=T + 10).lines == []


def test_counters_source_from_a_real_scrape(con, data_dir, tmp_path):
    from prefixscope.ingest.exposition import ingest_exposition

    ingest_exposition(con, str(data_dir / "vllm-cpu-0.32" / "metrics_bs32.txt"),
                      instance="vllm-cpu-bs32", at_unix_s=1795960930.0)
    r = report(con)
    assert r.source == "counters"
    assert [ln.text for ln in r.lines] == [
        "7,136 of 11,652 prompt tokens from cache (61.2%): OK"] * 2
    assert [ln.model for ln in r.lines] == ["tiny-llama-random", None]
    # the probe's usage log gives the same line through the requests source
    ingest_usage_file(con, data_dir / "vllm-cpu-0.32" / "probe_bs32.requests.jsonl")
    assert [ln.text for ln in report_lines(con, source="requests")] == [
        "7,136 of 11,652 prompt tokens from cache (61.2%): OK"] * 2
    # auto falls back to requests when the range holds no counter increase
    r = report(con, start_s=1795960924.0, end_s=1795960927.0)
    assert r.source == "requests" and r.lines[0].prompt_tokens == 11652
    assert report(con, start_s=1795960924.0, end_s=1795960927.0, source="counters").lines == []


def test_bad_arguments(con):
    with pytest.raises(InvalidArgument):
        report(con, source="gauges")
    with pytest.raises(InvalidArgument):
        report(con, threshold=50)
    with pytest.raises(InvalidArgument):
        report(con, start_s=2.0, end_s=1.0)


def test_cli_report(cli, db_path, tmp_path):
    lines = [_usage(i, T + i, 32_200, 0 if i == 0 else 32_000, "legal") for i in range(20)]
    f = write_jsonl(tmp_path / "u.jsonl", lines)
    assert cli(["ingest", "requests", f, "--db", db_path])[0] == 0
    code, out, _ = cli(["report", "--db", db_path])
    assert code == 0
    assert out.splitlines()[0].startswith("source: request usage logs")
    assert out.splitlines()[1:] == [
        "legal    608,000 of 644,000 prompt tokens from cache (94.4%): OK",
        "overall  608,000 of 644,000 prompt tokens from cache (94.4%): OK"]
    code, out, _ = cli(["report", "--db", db_path, "--threshold", "0.95", "--json"])
    doc = json.loads(out)
    assert [ln["status"] for ln in doc["lines"]] == ["ALERT", "ALERT"]
    assert doc["lines"][0]["text"].endswith("(94.4%): ALERT: check the top of the prompt")
    code, out, _ = cli(["report", "--db", db_path, "--start", "2030-01-01"])
    assert code == 0 and "NO DATA" in out
    code, _, err = cli(["report", "--db", db_path, "--source", "x"])
    assert code == 2 and "unknown source" in err


def test_report_daily_still_dispatches_to_its_subcommand(cli):
    code, out, _ = cli(["report", "daily", "--help"])
    assert code == 0 and "Usage: prefixscope report daily" in out
    code, out, _ = cli(["report", "--help"])
    assert code == 0 and "prefixscope report --start" in out and "daily" in out


def test_cli_report_missing_database(cli, tmp_path):
    code, _, err = cli(["report", "--db", tmp_path / "none.duckdb"])
    assert code == 3 and "no database" in err


def test_auto_reports_a_model_without_counters_from_its_usage_log(cli, db_path, data_dir,
                                                                   tmp_path):
    """Session 7 finding 7: `report` with counters left out a model only the gateway's usage
    log knows (no vLLM counters for it in the range); it is reported from the usage log, its
    source named, and the overall line sums both (source ``mixed``)."""
    from prefixscope.ingest.exposition import ingest_exposition
    from prefixscope.store import db as store_db

    with store_db.writer(db_path) as con:
        ingest_exposition(con, str(data_dir / "vllm-cpu-0.32" / "metrics_bs32.txt"),
                          instance="vllm-cpu-bs32", at_unix_s=1795960930.0)
        ingest_usage_file(con, write_jsonl(tmp_path / "gw.jsonl", [
            _usage(i, 1795960900.0 + i, 1_000, 300, "gw-only") for i in range(4)]))
    with store_db.reader(db_path) as con:
        r = report(con)
        assert report(con, source="counters").lines[0].model == "tiny-llama-random"
        assert len(report(con, source="counters").lines) == 2  # counters only: no gw-only
    assert r.source == "counters"
    assert [(ln.model, ln.source, ln.cached_tokens, ln.prompt_tokens) for ln in r.lines] == [
        ("gw-only", "requests", 1_200, 4_000),
        ("tiny-llama-random", "counters", 7_136, 11_652),
        (None, "mixed", 8_336, 15_652)]
    assert r.lines[0].text == "1,200 of 4,000 prompt tokens from cache (30.0%): ALERT: check the " \
                              "top of the prompt"
    code, out, _ = cli(["report", "--db", db_path])
    assert code == 0, out
    rows = out.splitlines()
    assert rows[0].startswith("source: vLLM counters")
    at = rows.index("gw-only            1,200 of 4,000 prompt tokens from cache (30.0%): ALERT: "
                    "check the top of the prompt")
    assert rows[at + 1].strip() == ("(from the usage log: no vLLM counters for this model in the "
                                    "range)")
    assert "overall            8,336 of 15,652 prompt tokens from cache (53.3%): OK" in rows
    code, out, _ = cli(["report", "--db", db_path, "--json"])
    doc = json.loads(out)
    assert doc["source"] == "counters"
    assert [(ln["model"], ln["source"]) for ln in doc["lines"]] == [
        ("gw-only", "requests"), ("tiny-llama-random", "counters"), (None, "mixed")]


@pytest.mark.parametrize("newest", [T, T + 0.25])
def test_json_default_range_bounds_are_whole_seconds(cli, db_path, tmp_path, newest):
    """Finding 11 of session 8: ``report --json`` printed ``"start_unix_s":
    1796083185.0000002`` (the range ended at nextafter(newest)). The bounds are now the whole
    second after the newest point and 24 h before it, printed exactly; the newest point stays
    in the range and a point exactly 24 h older stays out."""
    f = write_jsonl(tmp_path / "u.jsonl", [
        _usage(1, newest - DEFAULT_REPORT_RANGE_S, 1000, 0, "m"),
        _usage(2, newest, 1000, 1000, "m")])
    assert cli(["ingest", "requests", f, "--db", db_path])[0] == 0
    code, out, _ = cli(["report", "--db", db_path, "--json"])
    assert code == 0
    end = int(T) + 1
    assert f'"end_unix_s": {end}.0,' in out and f'"start_unix_s": {end - 86400}.0,' in out
    doc = json.loads(out)
    assert (doc["start_unix_s"], doc["end_unix_s"]) == (end - 86400, end)
    assert doc["start"] == "2026-11-28T13:46:41Z" and doc["end"] == "2026-11-29T13:46:41Z"
    assert doc["lines"][0]["text"] == "1,000 of 1,000 prompt tokens from cache (100.0%): OK"
