"""``report daily`` for a model whose requests report no cached-token counts says so, not
"under 1,000 prompt tokens" (2,000 prompt tokens came in; null is not 0) (session 5, new-user
walk, bug 4)."""

from __future__ import annotations

import json

T = 1_795_960_920  # 2026-11-29 10:02 UTC


def _log(path, cached):
    with path.open("w") as f:
        for i, c in enumerate(cached):
            f.write(json.dumps({"request_id": f"r{i}", "ts_unix_s": T + i, "model": "m",
                                "usage": {"prompt_tokens": 1000, "prompt_tokens_details":
                                          None if c is None else {"cached_tokens": c}}}) + "\n")
    return path


def _daily_line(cli, tmp_path, cached):
    db = tmp_path / "d.duckdb"
    code, _, err = cli(["ingest", "requests", _log(tmp_path / "u.jsonl", cached), "--db", db])
    assert code == 0, err
    code, out, err = cli(["report", "daily", "--db", db, "--date", "2026-11-29", "--json"])
    assert code == 0, err
    (line,) = json.loads(out)["lines"]
    return line


def test_no_cached_counts_is_not_under_the_volume(cli, tmp_path):
    line = _daily_line(cli, tmp_path, [None, None])
    assert line["status"] == "NO DATA"
    assert line["text"] == (
        "0 of 0 prompt tokens from cache: NO DATA: no cached-token counts reported (none of "
        "the 2 requests of the day has prompt_tokens_details.cached_tokens; null is not 0: "
        "vLLM reports it with --enable-prompt-tokens-details)")
    assert "under 1,000" not in line["text"]


def test_a_small_reported_volume_still_names_the_guard(cli, tmp_path):
    db = tmp_path / "e.duckdb"
    path = tmp_path / "v.jsonl"
    with path.open("w") as f:
        f.write(json.dumps({"request_id": "a", "ts_unix_s": T, "model": "m",
                            "usage": {"prompt_tokens": 500,
                                      "prompt_tokens_details": {"cached_tokens": 0}}}) + "\n")
        f.write(json.dumps({"request_id": "b", "ts_unix_s": T + 1, "model": "m",
                            "usage": {"prompt_tokens": 1500, "prompt_tokens_details": None}})
                + "\n")
    assert cli(["ingest", "requests", path, "--db", db])[0] == 0
    code, out, err = cli(["report", "daily", "--db", db, "--date", "2026-11-29", "--json"])
    assert code == 0, err
    (line,) = json.loads(out)["lines"]
    assert line["text"] == ("0 of 500 prompt tokens from cache (0.0%): NO DATA: under 1,000 "
                            "prompt tokens in the day")
