"""``ingest prometheus`` (raw mode) against a REAL Prometheus: the range is asked to the
millisecond, so a range that ends between two whole seconds (``--end now`` always does) keeps
the samples of its last fraction of a second. prometheus-api-client's range call rounded both
ends to whole seconds: ``--end T+2.3`` asked up to ``T+2`` and the sample at ``T+2.25`` was left
to the next run (a user who ran it once lost it), and ``--start T+0.3`` took the sample at
``T+0.25`` from before the range.

The samples are written at known millisecond times with Debian's ``promtool tsdb
create-blocks-from openmetrics`` into the data folder of the Prometheus the test starts (no
scrape timing to wait on), an hour in the past (inside the default 15-day retention).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from prefixscope.store import db as store_db
from prefixscope.store.queries.metrics import hit_rate_totals
from tests.hostile.support import run_cli
from tests.metrics_support import PROMETHEUS, PrometheusServer

pytestmark = pytest.mark.prometheus

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
needs_prometheus = pytest.mark.skipif(
    not (os.access(PROMETHEUS, os.X_OK) and os.access(PROMTOOL, os.X_OK)),
    reason="Debian prometheus/promtool not installed (make system-deps)")

Q = "vllm:prefix_cache_queries_total"
H = "vllm:prefix_cache_hits_total"


def _backfill(data_dir: Path, t0: int) -> None:
    """Queries and hits of one server at t0 + 0.25 s, + 1.25 s and + 2.25 s."""
    labels = 'engine="0",model_name="m",instance="vllm-a:8000",job="vllm"'
    lines = []
    for name, family, values in ((Q, "vllm:prefix_cache_queries", (100, 200, 300)),
                                 (H, "vllm:prefix_cache_hits", (50, 120, 200))):
        lines.append(f"# TYPE {family} counter")
        lines += [f"{name}{{{labels}}} {v} {t0 + i}.250" for i, v in enumerate(values)]
    src = data_dir.parent / "backfill.om"
    src.write_text("\n".join(lines) + "\n# EOF\n")
    subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(src),
                    str(data_dir)], check=True, capture_output=True, timeout=120)


def _sample_times(db: str) -> list[tuple[str, float]]:
    with store_db.reader(db) as con:
        return con.execute("SELECT metric, ts_unix_s FROM metric_samples WHERE NOT created_zero "
                           "ORDER BY metric, ts_unix_s").fetchall()


@needs_prometheus
def test_raw_range_keeps_the_samples_of_its_last_fraction_of_a_second(tmp_path: Path):
    t0 = int(time.time()) - 3600
    prom = PrometheusServer([])
    _backfill(prom.dir / "data", t0)
    with prom:
        # the end 50 ms after the last sample (a whole-second end would be t0 + 2)
        db = str(tmp_path / "end.duckdb")
        code, out, err = run_cli(["ingest", "prometheus", prom.url, "--start", str(t0 - 10),
                                  "--end", f"{t0 + 2}.300", "--db", db, "--json"])
        assert code == 0, err
        assert json.loads(out)[0]["rows_read"] == 6
        assert _sample_times(db) == [(H, t0 + 0.25), (H, t0 + 1.25), (H, t0 + 2.25),
                                     (Q, t0 + 0.25), (Q, t0 + 1.25), (Q, t0 + 2.25)]
        with store_db.reader(db) as con:
            [total] = hit_rate_totals(con, by=("instance",)).to_dict("records")
        assert (total["instance"], total["hit_tokens"], total["query_tokens"]) == (
            "vllm-a:8000", 150, 200)

        # the start 50 ms after the first sample: that sample is outside the range
        db2 = str(tmp_path / "start.duckdb")
        code, out, err = run_cli(["ingest", "prometheus", prom.url, "--start", f"{t0}.300",
                                  "--end", f"{t0 + 2}.300", "--db", db2, "--json"])
        assert code == 0, err
        assert _sample_times(db2) == [(H, t0 + 1.25), (H, t0 + 2.25),
                                      (Q, t0 + 1.25), (Q, t0 + 2.25)]

        # chunks of 1 s end and start between samples: each sample once, none duplicated
        db3 = str(tmp_path / "chunks.duckdb")
        code, out, err = run_cli(["ingest", "prometheus", prom.url, "--start", f"{t0}.100",
                                  "--end", f"{t0 + 2}.300", "--chunk", "1s", "--db", db3,
                                  "--json"])
        assert code == 0, err
        doc = json.loads(out)[0]
        assert (doc["rows_read"], doc["rows_added"], doc["rows_duplicate"]) == (6, 6, 0)
        assert _sample_times(db3) == _sample_times(db)
