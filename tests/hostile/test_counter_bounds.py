"""A vLLM counter sample above 2^53 is quarantined at ingest: the hit-rate queries sum counter
increases as DOUBLE and cast them to BIGINT, which a 1e308 counter overflowed (a traceback in
``prefixscope hitrate``)."""

from __future__ import annotations

import json

from tests.hostile.support import fresh_db, run_cli


def _prom(path, hits: str, queries: str, ts_ms: int):
    path.write_text("# TYPE vllm:prefix_cache_queries counter\n"
                    f'vllm:prefix_cache_queries_total{{model_name="m",engine="0"}} {queries} {ts_ms}\n'
                    "# TYPE vllm:prefix_cache_hits counter\n"
                    f'vllm:prefix_cache_hits_total{{model_name="m",engine="0"}} {hits} {ts_ms}\n')
    return path


def test_a_counter_past_2_53_is_quarantined_and_hitrate_still_answers(tmp_path):
    ok = [_prom(tmp_path / "a.prom", "600", "1000", 1796000000000),
          _prom(tmp_path / "b.prom", "3000", "5000", 1796000060000)]
    big = _prom(tmp_path / "c.prom", "1e308", "1e308", 1796000120000)
    db, ref = fresh_db(tmp_path), str(tmp_path / "ref.duckdb")
    import shutil

    shutil.copyfile(db, ref)
    code, out, err = run_cli(["ingest", "metrics", *ok, big, "--db", db, "--json"])
    assert code == 0, err
    q = [p for f in json.loads(out) for p in f["quarantined"]]
    assert sorted((p["line"], p["field"], p["reason"]) for p in q) == [
        (2, "vllm:prefix_cache_queries_total", "counter value is over 9,007,199,254,740,992 (2^53)"),
        (4, "vllm:prefix_cache_hits_total", "counter value is over 9,007,199,254,740,992 (2^53)")]
    assert run_cli(["ingest", "metrics", *ok, "--db", ref])[0] == 0
    code, got, err = run_cli(["hitrate", "--db", db, "--json"])
    assert code == 0, err
    code, want, err = run_cli(["hitrate", "--db", ref, "--json"])
    assert code == 0, err
    rows = json.loads(got)
    assert rows == json.loads(want)
    assert sum(r["query_tokens"] for r in rows) == 4000
