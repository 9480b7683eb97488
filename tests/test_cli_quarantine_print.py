"""The quarantined lines an ingest command prints (one printer, cli.common.print_quarantined):
the first 20 as ``quarantined file:line: field: reason``, then how many more, for ``ingest
requests``, ``ingest metrics`` and ``ingest decisions`` on real files in a real store."""

from __future__ import annotations

import json

import pytest

from tests.dashboard_support import CAPTURES

BAD = 23
#: One good record of each JSONL source (docs/ingest.md): a usage-log line, a gateway decision.
GOOD = {
    "requests": {"request_id": "ok-1", "ts_unix_s": 1_795_960_000.0, "model": "m",
                 "usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 50}}},
    "decisions": {"ts_unix_s": 1_795_960_000.0, "request_id": "ok-1", "run_id": "r",
                  "scope": "TENANT", "namespace_digest": "a" * 16, "decision": "miss",
                  "reasons": [], "candidate_cached_tokens": 0, "accepted_cached_tokens": 0,
                  "expected": {"model_digest": "aaaa", "cache_epoch": 2,
                               "authorization_epoch": 1}, "candidate": None},
}


def _lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("quarantined ")]


@pytest.mark.parametrize("command", ["requests", "decisions"])
def test_jsonl_ingesters_print_twenty_then_a_count(cli, tmp_path, command):
    path = tmp_path / f"{command}.jsonl"
    path.write_text(json.dumps(GOOD[command]) + "\n" + "".join("{broken\n" for _ in range(BAD)),
                    encoding="utf-8")
    code, out, err = cli(["ingest", command, path, "--db", tmp_path / "s.duckdb"])
    assert code == 0, err
    assert "1 added" in out or "1 request added" in out
    got = _lines(err)
    assert len(got) == 20
    assert got[0].startswith(f"quarantined {path}:2: not valid JSON")
    assert got[-1].startswith(f"quarantined {path}:21: ")
    assert f"... and {BAD - 20} more quarantined lines: the quarantine table has every one" in err


def test_metrics_prints_the_same_way(cli, tmp_path):
    good = (CAPTURES / "metrics_bs32.txt").read_text(encoding="utf-8")
    path = tmp_path / "metrics.txt"
    path.write_text(good + "".join(f"not a sample line {i} {{\n" for i in range(BAD)),
                    encoding="utf-8")
    code, out, err = cli(["ingest", "metrics", path, "--at", "1795960920", "--db",
                          tmp_path / "s.duckdb", "--json"])
    assert code == 0 and json.loads(out)[0]["rows_quarantined"] == BAD
    got = _lines(err)
    assert len(got) == 20 and all(ln.startswith(f"quarantined {path}:") for ln in got)
    assert "malformed sample line" in got[0]
    assert f"... and {BAD - 20} more quarantined lines" in err


MANY = 124  # more than the 100 lines an ingester returns per file (ingest.usage.PROBLEMS_RETURNED)


@pytest.mark.parametrize("command", ["requests", "decisions"])
def test_the_count_of_more_lines_is_every_quarantined_line(cli, tmp_path, command):
    """The new-user check of session 11: 124 lines quarantined printed 20, then "and 80 more"
    (the 100 returned, not the 124 quarantined); ``--json`` of ``ingest requests`` lists the
    first 100 and says how many there were (``quarantined_total``)."""
    path = tmp_path / f"{command}.jsonl"
    path.write_text(json.dumps(GOOD[command]) + "\n" + "".join("{broken\n" for _ in range(MANY)),
                    encoding="utf-8")
    code, out, err = cli(["ingest", command, path, "--db", tmp_path / "s.duckdb"])
    assert code == 0, err
    assert len(_lines(err)) == 20
    assert f"... and {MANY - 20} more quarantined lines" in err
    if command == "requests":
        code, out, err = cli(["ingest", command, path, "--db", tmp_path / "t.duckdb", "--json"])
        doc = json.loads(out)
        assert len(doc["quarantined"]) == 100 and doc["quarantined_total"] == MANY
        assert doc["files"][0]["rows_quarantined"] == MANY
