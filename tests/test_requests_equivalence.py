"""The fast usage-ingest path gives exactly the rows of the per-line reference.

The file ingest builds its Arrow batches column by column (``prefixscope.ingest.usage_read``), possibly in
parser processes and merged into large transactions; the reference is ``normalise_usage`` on one
line plus the documented file defaults. Every line of every JSONL corpus in the repository
(``data/``), the benchmark generator's mix and a set of edge-case lines go through both and must
give identical rows, identical quarantine entries (line and field) and identical skip counts.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import duckdb
import pytest

import prefixscope.ingest.usage as usage
import prefixscope.ingest.usage_read as usage_read
from prefixscope.ingest.usage import ingest_usage_file, ingest_usage_file_detailed, normalise_usage
from prefixscope.core.errors import ParseError
from prefixscope.store.schema import REQUEST_KEY_SQL
from tests.requests_support import write_jsonl

ROOT = Path(__file__).resolve().parent.parent
CORPORA = sorted(p for p in (ROOT / "data").rglob("*.jsonl"))
MTIME = 1_700_000_000.5

#: Lines that exercise every branch of the normalisation and the file defaults.
EDGE_LINES = [
    {"id": "a", "usage": {"prompt_tokens": 10, "prompt_tokens_details": None}},
    {"id": "b", "usage": {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 0}}},
    {"id": 17, "object": "chat.completion", "created": 1795960000123,
     "usage": {"prompt_tokens": 20, "completion_tokens": 3,
               "prompt_tokens_details": {"cached_tokens": 30, "created_cache_tokens": 2}}},
    {"usage": {"prompt_tokens": 20, "prompt_cache_hit_tokens": 5}},  # no id, no time
    {"usage": {"prompt_tokens": 20, "cache_read_input_tokens": 15,
               "prompt_tokens_details": {"cached_tokens": None}}, "model": ""},
    {"request_id": "r1", "run_id": "", "instance": "", "model": "", "ts": "2026-01-02T03:04:05Z",
     "response": {"id": "x", "object": "text_completion", "model": "resp-model",
                  "usage": {"prompt_tokens": 5, "completion_tokens": 1}}},
    {"request_id": "r2", "ts": "1795960000", "scope": "tenant", "tenant_digest": "ABC",
     "usage": {"prompt_tokens": 5}},
    {"request_id": "r3", "time": 1795960000500.0, "scope": "nope",
     "tenant_digest": "0123456789abcdef", "usage": {"prompt_tokens": 5}},
    {"id": "msg_1", "type": "message", "model": "m", "usage": {
        "input_tokens": 26, "output_tokens": 8, "cache_read_input_tokens": 224,
        "cache_creation_input_tokens": 3,
        "cache_creation": {"ephemeral_5m_input_tokens": 1, "ephemeral_1h_input_tokens": 2}}},
    {"id": "resp_1", "object": "response", "created_at": 1795960000, "usage": {
        "input_tokens": 100, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 64}}},
    {"responseId": "g1", "modelVersion": "gemini-x", "usageMetadata": {
        "promptTokenCount": 50, "candidatesTokenCount": 4, "thoughtsTokenCount": 6,
        "cachedContentTokenCount": 32}},
    {"uri": "/model/x/converse", "output": {}, "usage": {
        "inputTokens": 10, "outputTokens": 2, "cacheReadInputTokens": 90,
        "cacheWriteInputTokens": 5}, "metrics": {"latencyMs": 321}},
    {"response_usage": {"input_tokens": 10, "output_tokens": 2},
     "request_body": {"model": "from-body", "messages": []}},
    {"id": "chunk", "object": "chat.completion.chunk", "choices": [{"delta": {}}]},  # skipped
    "",  # blank: skipped
    "   ",
    "{broken",  # quarantined: not JSON
    {"usage": {"prompt_tokens": None}},  # quarantined: null prompt
    {"usage": {"prompt_tokens": "12"}},  # quarantined: wrong type
    {"usage": {"prompt_tokens": 12.0}},  # quarantined: a float is not a token count
    {"usage": {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": -1}}},
    '{"id": "big", "usage": {"prompt_tokens": 100000000000000000000000}}',
    {"usage": {}},  # quarantined: no token counts
    {"id": "nousage", "object": "chat.completion"},  # quarantined: no usage
    '{"id": "dup", "id": "dup2", "usage": {"prompt_tokens": 7, "prompt_tokens": 8}}',
    '{"id": "trail", "usage": {"prompt_tokens": 7},}',  # trailing comma: not JSON
    '{"id": "nan", "ttft_ms": NaN, "usage": {"prompt_tokens": 7}}',  # NaN: not JSON
    {"id": "tsbad", "ts": "yesterday", "usage": {"prompt_tokens": 1}},
    {"id": "tenant", "tenant": "acme-raw-id", "user": "alice", "usage": {"prompt_tokens": 1}},
]


def _expected(line: bytes, line_no: int, ctx) -> tuple:
    """The reference: ``normalise_usage`` on one line, then the documented file defaults.

    Returns ``("row", row dict)``, ``("skip",)`` or ``("bad", field)``."""
    try:
        rec = normalise_usage(line)
    except ParseError as exc:
        return ("skip",) if not line.strip() else ("bad", exc.field)
    if rec is None:
        return ("skip",)
    ts = rec.ts_unix_s
    return ("row", {
        "run_id": rec.run_id if rec.run_id is not None else ctx.run_id,
        "request_id": rec.request_id if rec.request_id is not None
        else usage_read.record_digest_id(line),
        "source_id": ctx.source_id, "line": line_no,
        "ts_unix_s": ts if ts is not None else ctx.mtime,
        "ts_estimated": rec.ts_estimated if ts is not None else True,
        "model": rec.model or ctx.default_model, "instance": rec.instance or ctx.instance,
        "endpoint": rec.endpoint, "usage_shape": rec.usage_shape,
        "prompt_tokens": rec.prompt_tokens, "cached_tokens": rec.cached_tokens,
        "cache_write_tokens": rec.cache_write_tokens,
        "cache_write_1h_tokens": rec.cache_write_1h_tokens,
        "completion_tokens": rec.completion_tokens, "ttft_ms": rec.ttft_ms,
        "latency_ms": rec.latency_ms, "scope": rec.scope, "tenant_digest": rec.tenant_digest,
        "flags": ",".join(rec.flags) if rec.flags else None,
    })


def _same(a: dict, b: dict) -> bool:
    """Row equality; floats compared exactly (NaN equal to NaN)."""
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        if x != y or type(x) is not type(y):
            return False
    return True


def _check_file(path: Path, **defaults) -> int:
    """Both paths over every line of ``path``; returns the number of rows compared."""
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    ctx = usage_read._context(path, "requests:test", defaults.get("run_id", ""),
                              defaults.get("instance"), defaults.get("default_model"), MTIME)
    table, quarantined, skipped = usage_read._parse_lines_arrow(lines, 0, ctx)
    # each row's request_key (computed by the parser) is the store's REQUEST_KEY_SQL of its pair
    check = duckdb.connect()
    check.register("parsed", table)
    assert check.execute(f"SELECT count(*) FILTER (WHERE request_key IS DISTINCT FROM "
                         f"{REQUEST_KEY_SQL}) FROM parsed").fetchone()[0] == 0
    check.close()
    got_rows = {r["line"]: r for r in table.drop_columns(["request_key"]).to_pylist()}
    got_bad = {q.line: q.field for q in quarantined}
    want_skipped = 0
    for i, line in enumerate(lines, start=1):
        want = _expected(line, i, ctx)
        if want[0] == "row":
            assert i in got_rows, f"{path}:{i}: no row"
            assert _same(got_rows[i], want[1]), f"{path}:{i}: {got_rows[i]} != {want[1]}"
        elif want[0] == "bad":
            assert i in got_bad and got_bad[i] == want[1], f"{path}:{i}: quarantine differs"
        else:
            want_skipped += 1
            assert i not in got_rows and i not in got_bad
    assert skipped == want_skipped
    assert len(got_rows) + len(got_bad) + skipped == len(lines)
    assert all(q.location == str(path) and q.reason for q in quarantined)
    return len(got_rows)


@pytest.mark.parametrize("path", CORPORA, ids=[str(p.relative_to(ROOT)) for p in CORPORA])
def test_every_corpus_line_gives_the_reference_row(path):
    _check_file(path)
    _check_file(path, run_id="run-x", instance="inst-x", default_model="model-x")


def test_edge_lines_give_the_reference_rows(tmp_path):
    f = write_jsonl(tmp_path / "edge.jsonl", EDGE_LINES)
    assert _check_file(f) > 10
    assert _check_file(f, run_id="run-x", instance="inst-x", default_model="model-x") > 10


def _bench_generator():
    spec = importlib.util.spec_from_file_location(
        "bench_ingest_requests", ROOT / "benchmarks" / "ingest_requests.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.generate


def test_benchmark_mix_gives_the_reference_rows(tmp_path):
    f = tmp_path / "bench.jsonl"
    _bench_generator()(f, 2000)
    assert _check_file(f) == 2000


def test_parallel_merged_batches_equal_sequential_on_the_benchmark_mix(tmp_path, monkeypatch):
    from prefixscope.store import db as store_db

    f = tmp_path / "bench.jsonl"
    _bench_generator()(f, 3000)
    with open(f, "a", encoding="utf-8") as fh:  # a bad line and a complete tail without newline
        fh.write("{broken\n")
        fh.write(json.dumps({"id": "tail", "usage": {"prompt_tokens": 1}}))
    monkeypatch.setattr(usage_read, "REGION_BYTES", 50_000)  # about 90 lines per region
    monkeypatch.setattr(usage, "INSERT_ROWS", 700)  # several regions per transaction
    par = store_db.memory()
    s, problems = ingest_usage_file_detailed(par, f, workers=2)
    assert (s.rows_read, s.rows_added, s.rows_quarantined) == (3001, 3001, 1)
    assert [q.line for q in problems] == [3001]
    seq = store_db.memory()
    ingest_usage_file(seq, f, workers=0, batch_rows=333)
    q = "SELECT * EXCLUDE (source_id) FROM requests ORDER BY line"
    assert par.execute(q).df().equals(seq.execute(q).df())
    cp = "SELECT checkpoint_offset, checkpoint_line FROM ingest_sources"
    assert par.execute(cp).fetchone() == seq.execute(cp).fetchone() == (os.path.getsize(f), 3002)
    batches = par.execute("SELECT count(*) FROM ingest_runs").fetchone()[0]
    assert batches == 1  # one run record, written with the last batch
    again = ingest_usage_file(par, f, workers=2)
    assert (again.rows_read, again.rows_added) == (0, 0)


def test_parallel_regions_guard_depth_and_keys_as_one_process(tmp_path, monkeypatch):
    """The parser processes count a region's brackets in one pass (``_bracketed_lines``) and
    compute the keys; the same rows, keys, quarantine entries and checkpoint as the
    line-by-line reader, on a file with a byte-order mark, lines just below, at and above
    the depth bound (and one with many brackets but shallow), blank lines, a bad line and
    non-ASCII run ids; one run record."""
    from prefixscope.store import db as store_db

    def nested(depth: int) -> dict:
        inner: object = 1
        for _ in range(depth - 1):
            inner = [inner]
        return {"id": f"deep{depth}", "usage": {"prompt_tokens": 3}, "x": inner}

    lines = []
    for i in range(400):
        rec = {"id": f"r{i}", "run_id": "é\u0301日" if i % 3 else "", "usage": {"prompt_tokens": i}}
        if i == 50:
            rec = nested(65)  # 64 lists in the record: one over the bound
        elif i == 51:
            rec = nested(64)  # exactly at the bound: kept
        elif i == 52:
            rec = {"id": "wide", "usage": {"prompt_tokens": 1}, "x": [[] for _ in range(100)]}
        lines.append(json.dumps(rec, ensure_ascii=False))
        if i in (10, 200):
            lines.append("")
        if i == 300:
            lines.append("{bad")
    f = tmp_path / "mix.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + ("\n".join(lines) + "\n").encode())
    monkeypatch.setattr(usage_read, "REGION_BYTES", 2_000)  # about 40 lines per region
    monkeypatch.setattr(usage, "INSERT_ROWS", 90)
    par = store_db.memory()
    s, problems = ingest_usage_file_detailed(par, f, workers=2)
    seq = store_db.memory()
    s2, problems2 = ingest_usage_file_detailed(seq, f, workers=0, batch_rows=70)
    assert (s.rows_read, s.rows_quarantined) == (s2.rows_read, s2.rows_quarantined) == (399, 2)
    assert [(q.line, q.reason, q.field) for q in problems] == \
        [(q.line, q.reason, q.field) for q in problems2]
    assert [q.line for q in problems] == [52, 304]
    q = "SELECT * EXCLUDE (source_id) FROM requests ORDER BY line"
    assert par.execute(q).df().equals(seq.execute(q).df())
    assert par.execute(f"SELECT count(*) FROM requests WHERE request_key = {REQUEST_KEY_SQL}"
                       ).fetchone()[0] == 399
    cp = "SELECT checkpoint_offset, checkpoint_line FROM ingest_sources"
    assert par.execute(cp).fetchone() == seq.execute(cp).fetchone() == (os.path.getsize(f), 403)
    assert par.execute("SELECT count(*) FROM ingest_runs").fetchone()[0] == 1
    assert (s.rows_added, ingest_usage_file(par, f, workers=2).rows_added) == (399, 0)


def test_run_record_commits_with_the_last_batch(con, tmp_path, monkeypatch):
    """Rows, quarantine, checkpoint and the ingest_runs record of the last batch are one
    transaction: when storing the run record fails, that batch's rows and checkpoint are not
    kept (earlier batches are), and the next run reads that batch again."""
    import prefixscope.ingest.jsonl_driver as driver

    f = write_jsonl(tmp_path / "t.jsonl", [{"id": f"r{i}", "usage": {"prompt_tokens": i}}
                                           for i in range(5)])

    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    with monkeypatch.context() as m:
        m.setattr(driver, "record_run", fail)
        with pytest.raises(RuntimeError):
            ingest_usage_file(con, f, batch_rows=2)
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 4
    assert con.execute("SELECT checkpoint_line FROM ingest_sources").fetchone()[0] == 4
    assert con.execute("SELECT count(*) FROM ingest_runs").fetchone()[0] == 0
    s = ingest_usage_file(con, f, batch_rows=2)
    assert (s.rows_read, s.rows_added) == (1, 1)
    assert con.execute("SELECT count(*) FROM ingest_runs").fetchone()[0] == 1
