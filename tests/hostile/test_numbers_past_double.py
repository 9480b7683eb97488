"""Numbers past the DOUBLE range (``10**400`` as an integer literal) in expositions and saved
Prometheus answers are quarantined by their bound, never an ``OverflowError`` traceback; the
samples of a saved answer are located by their ordinal (series, sample), one quarantine row each.
"""

from __future__ import annotations

import json

import duckdb

from tests.hostile.support import fresh_db, run_cli

HUGE = "1" + "0" * 400
OVER = "counter value is over 9,007,199,254,740,992 (2^53)"


def test_exposition_integers_past_double_are_quarantined_by_bound(tmp_path):
    f = tmp_path / "m.prom"
    f.write_text(f'vllm:prefix_cache_queries_total{{model_name="m"}} {HUGE}\n'
                 f'vllm:prefix_cache_hits_total{{model_name="m"}} -{HUGE}\n'
                 f'vllm:num_requests_running{{model_name="m"}} {HUGE}\n'
                 'vllm:prefix_cache_queries_total{model_name="n"} 10\n')
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "metrics", f, "--db", db, "--instance", "i", "--json"])
    assert code == 0, err
    [doc] = json.loads(out)
    assert [(q["line"], q["field"], q["reason"]) for q in doc["quarantined"]] == [
        (1, "vllm:prefix_cache_queries_total", OVER),
        (2, "vllm:prefix_cache_hits_total", "counter value is negative"),
        (3, "vllm:num_requests_running", "gauge value is beyond the DOUBLE range")]
    with duckdb.connect(db, read_only=True) as con:
        assert con.sql("SELECT model, value FROM metric_samples").fetchall() == [("n", 10.0)]


def _answer(values):
    return {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "vllm:prefix_cache_hits_total", "model_name": "m"},
         "values": [[1795960925, "1"]]},
        {"metric": {"__name__": "vllm:prefix_cache_queries_total", "model_name": "m"},
         "values": values}]}}


def test_query_range_huge_time_and_values_name_series_and_sample(tmp_path):
    f = tmp_path / "qr.json"
    # json.dumps writes the big ints as integer literals, as a hostile file would
    f.write_text(json.dumps(_answer([[1795960925, "100"], [int(HUGE), "5"], [1795960955, "NaN"],
                                     [1795960970, int(HUGE)], [1795960985, "-4"]])))
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "query-range", f, "--db", db, "--json"])
    assert code == 0, err
    [doc] = json.loads(out)
    got = [(q["line"], q["reason"]) for q in doc["quarantined"]]
    assert got == [
        (3, "sample time is outside 1970-01-01 to 2100-01-01 UTC (series 2, sample 2)"),
        (4, "counter value is not a finite number (series 2, sample 3)"),
        (5, OVER + " (series 2, sample 4)"),
        (6, "counter value is negative (series 2, sample 5)")]
    assert {q["field"] for q in doc["quarantined"]} == {"vllm:prefix_cache_queries_total"}
    with duckdb.connect(db, read_only=True) as con:
        stored = con.sql("SELECT line FROM quarantine ORDER BY line").fetchall()
        kept = con.execute("SELECT count(*) FROM metric_samples").fetchone()[0]
    assert stored == [(3,), (4,), (5,), (6,)]  # as many rows as the count printed
    assert kept == 2
    code, out, err = run_cli(["ingest", "query-range", f, "--db", db])
    assert code == 0, err
    assert "4 lines quarantined" in out
    with duckdb.connect(db, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM quarantine").fetchone()[0] == 4


def test_exposition_label_not_utf8_is_quarantined_with_its_byte(tmp_path):
    """Bytes that are not UTF-8 in a label: the line is quarantined (``not UTF-8 text (byte N)``,
    N 0-based in the line, as the JSONL ingesters say), from a file and from a served page;
    the other lines are kept and no U+FFFD model name is stored."""
    import http.server
    import threading

    body = (b'vllm:prefix_cache_queries_total{model_name="ti\xffny"} 10\n'
            b'vllm:prefix_cache_queries_total{model_name="ok"} 7\n')
    f = tmp_path / "m.prom"
    f.write_bytes(body)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    try:
        for source in (f, url):
            sub = tmp_path / ("u" if source == url else "f")
            sub.mkdir()
            db = fresh_db(sub)
            code, out, err = run_cli(["ingest", "metrics", source, "--db", db, "--json"])
            assert code == 0, err
            [doc] = json.loads(out)
            assert [(q["line"], q["field"], q["reason"]) for q in doc["quarantined"]] == [
                (1, "vllm:prefix_cache_queries_total", "not UTF-8 text (byte 46)")]
            with duckdb.connect(db, read_only=True) as con:
                assert con.execute("SELECT model, value FROM metric_samples").fetchall() == [
                    ("ok", 7.0)]
    finally:
        srv.shutdown()
        srv.server_close()
