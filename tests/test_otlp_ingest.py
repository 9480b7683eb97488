"""``prefixscope ingest otlp``: a real OpenTelemetry SDK exporter (opentelemetry-sdk +
opentelemetry-exporter-otlp-proto-http) sends GenAI spans to the listener, run as the real CLI
in a subprocess; the same spans go through the file path (collector file-exporter JSON lines);
every attribute alias; a locked store answers 503 and the exporter's retry lands the spans once.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from prefixscope.ingest import genai_spans
from prefixscope.ingest.otlp import SpanOptions, ingest_otlp_file
from prefixscope.store import db as store_db

ROW_COLUMNS = ("request_id, model, instance, endpoint, usage_shape, prompt_tokens, cached_tokens,"
               " cache_write_tokens, completion_tokens, provider, flags, scope, tenant_digest")

#: Spans as instrumentations emit them: (span name, attributes).
SPANS = [
    ("chat gpt-4o", {  # OpenAI through the semantic conventions: inclusive input
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o", "gen_ai.response.id": "chatcmpl-otel-1",
        "gen_ai.usage.input_tokens": 1200, "gen_ai.usage.output_tokens": 80,
        "gen_ai.usage.cache_read.input_tokens": 1024,
        "server.address": "api.openai.com", "server.port": 443}),
    ("chat claude-sonnet-4-5", {  # Anthropic, normalised by the instrumentation (inclusive)
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-sonnet-4-5", "gen_ai.response.id": "msg_otel_2",
        "gen_ai.usage.input_tokens": 2250, "gen_ai.usage.output_tokens": 40,
        "gen_ai.usage.cache_read.input_tokens": 2000,
        "gen_ai.usage.cache_write.input_tokens": 224}),
    ("chat claude raw", {  # Anthropic's exclusive count copied as is: 26 + 224 + 0 = 250
        "gen_ai.operation.name": "chat", "gen_ai.system": "anthropic",
        "gen_ai.request.model": "claude-sonnet-4-5", "gen_ai.response.id": "msg_otel_3",
        "gen_ai.usage.input_tokens": 26, "gen_ai.usage.output_tokens": 12,
        "gen_ai.usage.cache_read_input_tokens": 224,
        "gen_ai.usage.cache_creation_input_tokens": 0}),
    ("ChatCompletion", {  # OpenInference (Arize Phoenix), no response id
        "openinference.span.kind": "LLM", "llm.provider": "openai",
        "llm.model_name": "gpt-4.1-mini", "llm.token_count.prompt": 900,
        "llm.token_count.completion": 30, "llm.token_count.prompt_details.cache_read": 512}),
    ("chat vllm", {  # vLLM without --enable-prompt-tokens-details: no cache attribute (NULL)
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "tiny-llama-random", "gen_ai.response.id": "cmpl-otel-5",
        "gen_ai.usage.input_tokens": 300, "gen_ai.usage.output_tokens": 16,
        "server.address": "127.0.0.1", "server.port": 8000}),
    ("invoke_agent support", {  # sums its children's usage: never stored again
        "gen_ai.operation.name": "invoke_agent", "gen_ai.usage.input_tokens": 4650,
        "gen_ai.usage.output_tokens": 178}),
    ("GET /health", {"http.request.method": "GET"}),  # not a GenAI span
]

EXPECTED = {
    "chatcmpl-otel-1": ("gpt-4o", "api.openai.com:443", "chat", "otel-genai", 1200, 1024, None,
                        80, "openai", None),
    "msg_otel_2": ("claude-sonnet-4-5", "svc-test", "chat", "otel-genai", 2250, 2000, 224, 40,
                   "anthropic", None),
    "msg_otel_3": ("claude-sonnet-4-5", "svc-test", "chat", "otel-genai", 250, 224, 0, 12,
                   "anthropic", "exclusive-input-suspected"),
    "cmpl-otel-5": ("tiny-llama-random", "127.0.0.1:8000", "chat", "otel-genai", 300, None,
                    None, 16, "openai", None),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _emit(exporters, spans=SPANS, service="svc-test"):
    """Create the spans with a real SDK tracer; each exporter gets each span."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    for e in exporters:
        provider.add_span_processor(SimpleSpanProcessor(e))
    tracer = provider.get_tracer("prefixscope-test")
    for name, attrs in spans:
        with tracer.start_as_current_span(name, attributes=attrs):
            pass
    provider.shutdown()


def _collector_file_line(spans) -> str:
    """The line the collector's file exporter writes for one export: OTLP/JSON with hex ids."""
    d = json_format.MessageToDict(encode_spans(spans))

    def hexify(o):
        if isinstance(o, dict):
            return {k: (base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId")
                        else hexify(v)) for k, v in o.items()}
        if isinstance(o, list):
            return [hexify(x) for x in o]
        return o

    return json.dumps(hexify(d))


class Listener:
    """``prefixscope ingest otlp --listen`` as a real subprocess."""

    def __init__(self, db: str, tmp: Path, *extra: str, env: dict | None = None):
        self.port = _free_port()
        self.errlog = tmp / f"listener-{self.port}.err"
        self.outlog = tmp / f"listener-{self.port}.out"
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("prefixscope")), "ingest", "otlp", "--listen",
             f"127.0.0.1:{self.port}", "--db", db, "--json", *extra],
            stdout=open(self.outlog, "wb"), stderr=open(self.errlog, "wb"),
            env={**os.environ, **(env or {})})
        self.wait_for_text("receiving OTLP/HTTP traces")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def wait_for_text(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.errlog.read_text(errors="replace"):
                return
            assert self.proc.poll() is None, self.errlog.read_text()
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not seen: {self.errlog.read_text()}")

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        return json.loads(self.outlog.read_text())


def _rows(db: str) -> dict[str, tuple]:
    with store_db.reader(db) as con:
        rows = con.execute(f"SELECT {ROW_COLUMNS} FROM requests ORDER BY request_id").fetchall()
    return {r[0]: r[1:] for r in rows}


def _check(rows: dict[str, tuple]) -> None:
    assert len(rows) == 5  # 5 GenAI usage spans; the agent and the HTTP span are skipped
    for rid, want in EXPECTED.items():
        assert rows[rid][:10] == want, rid
    (oi_id,) = [k for k in rows if k not in EXPECTED]
    assert len(oi_id) == 32 + 1 + 16 and oi_id[32] == ":"  # <trace id>:<span id>, hex
    assert rows[oi_id][:10] == ("gpt-4.1-mini", "svc-test", None, "openinference", 900, 512,
                                None, 30, "openai", None)


def test_sdk_exporter_to_listener_and_file_exporter_line_give_the_same_rows(tmp_path):
    db_http, db_file = str(tmp_path / "http.duckdb"), str(tmp_path / "file.duckdb")
    listener = Listener(db_http, tmp_path)
    memory = InMemorySpanExporter()
    try:
        _emit([OTLPSpanExporter(endpoint=listener.endpoint, timeout=30), memory])
    finally:
        stats = listener.stop()
    assert stats["spans_added"] == 5 and stats["answered_503"] == 0
    http_rows = _rows(db_http)
    _check(http_rows)

    # The same spans as the collector's file exporter writes them, one export per line.
    finished = memory.get_finished_spans()
    f = tmp_path / "traces.jsonl"
    f.write_text(_collector_file_line(finished[:3]) + "\n" + _collector_file_line(finished[3:])
                 + "\n" + json.dumps({"resourceMetrics": []}) + "\n")
    with store_db.writer(db_file) as con:
        r = ingest_otlp_file(con, f)
        again = ingest_otlp_file(con, f)
    assert (r.summary.rows_read, r.summary.rows_added, r.summary.rows_quarantined) == (5, 5, 0)
    assert r.lines_skipped == 1  # the metrics line
    assert again.summary.rows_added == 0
    file_rows = _rows(db_file)
    assert file_rows == http_rows


def test_json_encoding_over_http_and_gzip(tmp_path):
    """OTLP/HTTP JSON body (hex ids), gzip-compressed, as the collector's otlphttp exporter
    with encoding: json sends it; the answer is an ExportTraceServiceResponse in JSON."""
    import gzip

    import httpx

    db = str(tmp_path / "json.duckdb")
    memory = InMemorySpanExporter()
    _emit([memory], SPANS[:1])
    body = _collector_file_line(memory.get_finished_spans()).encode()
    listener = Listener(db, tmp_path)
    try:
        resp = httpx.post(listener.endpoint, content=gzip.compress(body), timeout=30,
                          headers={"Content-Type": "application/json",
                                   "Content-Encoding": "gzip"})
        bad = httpx.post(listener.endpoint, content=b"not otlp", timeout=30,
                         headers={"Content-Type": "application/x-protobuf"})
    finally:
        stats = listener.stop()
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    assert resp.json() == {}  # no partial_success: every span stored
    assert bad.status_code == 400  # not retryable: the exporter drops it
    assert stats["spans_added"] == 1 and stats["answered_400"] == 1
    assert _rows(db)["chatcmpl-otel-1"][4] == 1200


def test_locked_store_answers_503_and_the_exporter_retry_lands_the_spans_once(tmp_path):
    db = str(tmp_path / "locked.duckdb")
    with store_db.writer(db):
        pass  # migrated file
    listener = Listener(db, tmp_path, "--lock-timeout", "0.5")
    holder = duckdb.connect(db)  # another process's writer holds the file's lock
    result: list[SpanExportResult] = []
    exporter = OTLPSpanExporter(endpoint=listener.endpoint, timeout=60)

    class Capture(InMemorySpanExporter):
        pass

    memory = Capture()
    _emit([memory], SPANS[:2])
    spans = memory.get_finished_spans()
    t = threading.Thread(target=lambda: result.append(exporter.export(spans)))
    try:
        t.start()
        listener.wait_for_text("503 127.0.0.1")  # answered while the lock is held
        holder.close()  # lock released: the exporter's next attempt is stored
        t.join(timeout=90)
        assert result == [SpanExportResult.SUCCESS]
        # The same batch sent again (a collector retry after a lost answer) adds nothing.
        assert exporter.export(spans) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
        stats = listener.stop()
    assert stats["answered_503"] >= 1
    assert stats["spans_added"] == 2 and stats["spans_duplicate"] == 2
    with store_db.reader(db) as con:
        assert con.execute("SELECT count(*), count(DISTINCT request_id) FROM requests"
                           ).fetchone() == (2, 2)
        assert con.execute("SELECT kind, rows_added FROM ingest_sources").fetchall() == [
            ("otlp-http", 2)]


# ------------------------------------------------------------------ every alias, file path

def _line(attrs: dict, *, resource: dict | None = None) -> str:
    def val(v):
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        if isinstance(v, float):
            return {"doubleValue": v}
        if isinstance(v, dict):
            return {"kvlistValue": {"values": [{"key": k, "value": val(x)} for k, x in v.items()]}}
        return {"stringValue": v}

    kv = lambda d: [{"key": k, "value": val(v)} for k, v in d.items()]  # noqa: E731
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": kv(resource or {"service.name": "alias-svc"})},
        "scopeSpans": [{"scope": {"name": "t"}, "spans": [{
            "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174",
            "name": "chat", "kind": 3, "startTimeUnixNano": "1764547200000000000",
            "endTimeUnixNano": "1764547201250000000", "attributes": kv(attrs)}]}]}]})


def _one(tmp_path, attrs, opts=SpanOptions(), name="a.jsonl", **kw):
    f = tmp_path / name
    f.write_text(_line(attrs, **kw) + "\n")
    db = str(tmp_path / (name + ".duckdb"))
    with store_db.writer(db) as con:
        r = ingest_otlp_file(con, f, opts)
        row = con.execute(
            "SELECT prompt_tokens, cached_tokens, cache_write_tokens, completion_tokens, "
            "ts_unix_s, latency_ms, request_id, scope, tenant_digest, flags, usage_shape "
            "FROM requests").fetchall()
    return r, row


@pytest.mark.parametrize("key", genai_spans.CACHE_READ_KEYS)
def test_every_cache_read_alias(tmp_path, key):
    r, rows = _one(tmp_path, {"gen_ai.usage.input_tokens": 1000, "gen_ai.usage.output_tokens": 5,
                              key: 768})
    assert rows[0][:4] == (1000, 768, None, 5)
    assert rows[0][4] == 1764547200.0 and rows[0][5] == 1250.0
    assert rows[0][6] == "5b8efff798038103d269b633813fc60c:eee19b7ec3c1b174"


@pytest.mark.parametrize("key", genai_spans.CACHE_WRITE_KEYS)
def test_every_cache_write_alias(tmp_path, key):
    r, rows = _one(tmp_path, {"gen_ai.usage.input_tokens": 1000, "gen_ai.usage.output_tokens": 5,
                              key: 300})
    assert rows[0][:4] == (1000, None, 300, 5)


@pytest.mark.parametrize("in_key,out_key", list(zip(genai_spans.INPUT_KEYS,
                                                    genai_spans.OUTPUT_KEYS)))
def test_every_input_and_output_alias(tmp_path, in_key, out_key):
    r, rows = _one(tmp_path, {in_key: 640, out_key: 7})
    assert rows[0][:4] == (640, None, None, 7)


def test_details_as_a_key_value_list_and_token_counts_as_text(tmp_path):
    """``gen_ai.usage.input_tokens_details`` sent as a kvlist value; counts as strings."""
    r, rows = _one(tmp_path, {"gen_ai.usage.input_tokens": "2048",
                              "gen_ai.usage.output_tokens": 9.0,
                              "gen_ai.usage.input_tokens_details": {"cached_tokens": 1024}})
    assert rows[0][:4] == (2048, 1024, None, 9)


def test_cache_zero_is_kept_and_missing_stays_null(tmp_path):
    _, rows = _one(tmp_path, {"gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 1,
                              "gen_ai.usage.cache_read.input_tokens": 0})
    assert rows[0][1] == 0


def test_bad_count_is_quarantined_with_the_attribute_name_and_not_its_value(tmp_path):
    r, rows = _one(tmp_path, {"gen_ai.usage.input_tokens": -3, "gen_ai.usage.output_tokens": 1})
    assert rows == []
    (q,) = r.problems
    assert q.line == 1 and q.field == ("resourceSpans[0].scopeSpans[0].spans[0].attributes."
                                       "gen_ai.usage.input_tokens")
    assert q.reason == "token count is negative" and "-3" not in q.reason


def test_provider_input_rule_reads_anthropic_input_as_exclusive(tmp_path):
    attrs = {"gen_ai.provider.name": "anthropic", "gen_ai.usage.input_tokens": 500,
             "gen_ai.usage.output_tokens": 3, "gen_ai.usage.cache_read.input_tokens": 200}
    _, default = _one(tmp_path, attrs, name="d.jsonl")
    _, provider = _one(tmp_path, attrs, SpanOptions(input_rule="provider"), name="p.jsonl")
    assert default[0][0] == 500 and default[0][9] is None  # inclusive per the conventions
    assert provider[0][0] == 700  # 500 uncached + 200 read


def test_tenant_ids_only_as_hmac_digests(tmp_path):
    from prefixscope.ingest.privacy import digest_tenant

    key = b"k" * 32
    attrs = {"gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 1,
             "enduser.id": "acme-corp"}
    _, with_key = _one(tmp_path, attrs, SpanOptions(tenant_digester=lambda t: digest_tenant(t, key)),
                       name="k.jsonl")
    _, no_key = _one(tmp_path, attrs, name="n.jsonl")
    assert with_key[0][7:9] == ("TENANT", digest_tenant("acme-corp", key))
    assert no_key[0][7:10] == (None, None, "tenant-dropped-no-key")
    for name in ("k.jsonl.duckdb", "n.jsonl.duckdb"):
        assert b"acme-corp" not in (tmp_path / name).read_bytes()


def test_server_address_follows_the_instance_rules(tmp_path):
    """server.address as the instance: over 256 characters the span is quarantined (as every
    instance); one that names the span's tenant (a per-tenant endpoint) is kept only as an
    HMAC digest with a key and dropped without one; any other address is kept as sent."""
    from prefixscope.ingest.privacy import digest_tenant

    key = b"k" * 32
    usage = {"gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 1}

    def instance(attrs, opts=SpanOptions(), name="i.jsonl"):
        r, _ = _one(tmp_path, {**usage, **attrs}, opts, name=name)
        with store_db.reader(str(tmp_path / (name + ".duckdb"))) as con:
            return r, con.execute("SELECT instance, flags FROM requests").fetchall()

    _, plain = instance({"server.address": "vllm-a.internal", "server.port": 8000,
                         "enduser.id": "acme-corp"}, name="plain.jsonl")
    assert plain == [("vllm-a.internal:8000", "tenant-dropped-no-key")]
    r, long = instance({"server.address": "h" * 300}, name="long.jsonl")
    assert long == [] and r.summary.rows_quarantined == 1
    assert [(p.field, p.reason) for p in r.problems] == [
        ("resourceSpans[0].scopeSpans[0].spans[0].instance", "longer than 256 characters")]
    tenant = {"server.address": "ACME-corp.openai.azure.com", "server.port": 443,
              "enduser.id": "acme-corp"}
    _, no_key = instance(tenant, name="nokey.jsonl")
    assert no_key == [(None, "tenant-dropped-no-key,instance-dropped-tenant")]
    _, keyed = instance(tenant, SpanOptions(tenant_digester=lambda t: digest_tenant(t, key)),
                        name="key.jsonl")
    assert keyed == [("hmac:" + digest_tenant("ACME-corp.openai.azure.com:443", key), None)]
    for name in ("nokey.jsonl.duckdb", "key.jsonl.duckdb"):
        assert b"acme-corp" not in (tmp_path / name).read_bytes().lower()


def test_an_export_line_above_the_jsonl_bound_is_read_whole(tmp_path):
    """A collector batch is one line of several MiB: above the 1 MiB JSONL bound, below the
    64 MiB export bound; read across read-buffer boundaries."""
    from prefixscope.core.bounds import MAX_LINE_BYTES

    one = json.loads(_line({"gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 1,
                            "gen_ai.request.model": "gpt-4o"}))
    span = one["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    spans = []
    for i in range(12_000):
        s = json.loads(json.dumps(span))
        s["spanId"] = f"{i + 1:016x}"
        spans.append(s)
    one["resourceSpans"][0]["scopeSpans"][0]["spans"] = spans
    text = json.dumps(one)
    assert len(text) > 2 * MAX_LINE_BYTES
    f = tmp_path / "big.jsonl"
    f.write_text(_line({"gen_ai.usage.input_tokens": 5, "gen_ai.usage.output_tokens": 1}).replace(
        "eee19b7ec3c1b174", "ffffffffffffffff") + "\n" + text + "\n")
    with store_db.writer(str(tmp_path / "big.duckdb")) as con:
        r = ingest_otlp_file(con, f)
    assert (r.summary.rows_added, r.summary.rows_quarantined) == (12_001, 0)


def test_an_over_long_model_name_quarantines_the_span(tmp_path):
    r, rows = _one(tmp_path, {"gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 1,
                              "gen_ai.request.model": "m" * 300})
    assert rows == [] and r.problems[0].reason == "longer than 256 characters"
    assert r.problems[0].field.endswith(".model")


def test_chunked_body_is_read_and_an_empty_one_refused(tmp_path):
    """A body sent with Transfer-Encoding: chunked is read whole (never taken as an empty,
    acknowledged export); no body at all is 411."""
    import httpx

    memory = InMemorySpanExporter()
    _emit([memory], SPANS[:1])
    body = encode_spans(memory.get_finished_spans()).SerializeToString()
    db = str(tmp_path / "chunked.duckdb")
    listener = Listener(db, tmp_path)
    try:
        resp = httpx.post(listener.endpoint, content=iter([body[:10], body[10:]]), timeout=30,
                          headers={"Content-Type": "application/x-protobuf"})
        empty = httpx.post(listener.endpoint, content=b"", timeout=30,
                           headers={"Content-Type": "application/x-protobuf"})
    finally:
        stats = listener.stop()
    assert resp.status_code == 200 and empty.status_code == 411
    assert stats["spans_added"] == 1
    assert _rows(db)["chatcmpl-otel-1"][4] == 1200


def test_requests_beyond_max_pending_get_429_and_the_waiting_ones_land(tmp_path):
    """With the store locked, requests wait for it (up to --lock-timeout); one more than
    --max-pending is answered 429 at once with Retry-After; once the lock is released the
    waiting ones are stored and answered 200."""
    import httpx

    db = str(tmp_path / "busy.duckdb")
    with store_db.writer(db):
        pass
    listener = Listener(db, tmp_path, "--lock-timeout", "60", "--max-pending", "2")
    bodies = []
    for i in range(3):
        memory = InMemorySpanExporter()
        _emit([memory], [(f"chat {i}", {"gen_ai.usage.input_tokens": 10 + i,
                                        "gen_ai.usage.output_tokens": 1,
                                        "gen_ai.response.id": f"busy-{i}"})])
        bodies.append(encode_spans(memory.get_finished_spans()).SerializeToString())
    holder = duckdb.connect(db)
    answers: dict[int, httpx.Response] = {}

    def post(i):
        answers[i] = httpx.post(listener.endpoint, content=bodies[i], timeout=120,
                                headers={"Content-Type": "application/x-protobuf"})

    threads = [threading.Thread(target=post, args=(i,)) for i in range(3)]
    try:
        for t in threads:
            t.start()
        listener.wait_for_text("429 127.0.0.1")  # the third in line, answered at once
        holder.close()
        for t in threads:
            t.join(timeout=120)
    finally:
        stats = listener.stop()
    codes = sorted(r.status_code for r in answers.values())
    assert codes == [200, 200, 429]
    (busy,) = [r for r in answers.values() if r.status_code == 429]
    assert busy.headers["Retry-After"] == "1"
    assert stats["answered_429"] == 1 and stats["spans_added"] == 2
    assert len(_rows(db)) == 2
