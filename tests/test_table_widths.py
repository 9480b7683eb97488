"""Issue 14 (session 5, c and f): every table's columns visible at a 1400 px window without
scrolling sideways (``show_table`` fits widths, ``downloads.fit_widths``), ``show_table``'s
``caption=`` / ``empty=``, and the Replay page's run table and cost chart.

The pure width rule is checked here; every table of every page (demo and real captures) is
checked in tests/test_dashboard_tables.py (``_width_problems``).
"""

from __future__ import annotations

import pandas as pd

from prefixscope.dashboard import figures
from prefixscope.dashboard.downloads import (CHAR_PX, CELL_PAD_PX, MIN_COLUMN_PX, TABLE_WIDTH_PX,
                                             _with_widths, fit_widths, natural_width)

#: The Alerts page's daily report at its widest: twelve columns and a long report line.
REPORT = pd.DataFrame({
    "Model": ["agent-32b"], "Scope": ["all"], "Instance": ["gpu-a1"], "Status": ["ALERT"],
    "Report line": ["1,973,584 of 4,980,582 prompt tokens from cache (39.6%): ALERT: check the "
                    "top of the prompt (top breaker: timestamp on line 1 of message 0)"],
    "Hit rate": ["39.6%"], "Previous day": ["42.1%"], "Change": ["-2.5 pp"],
    "Week before": ["—"], "Change vs week before": ["—"], "Threshold": ["50.0%"],
    "Source": ["vLLM counters"]})


def test_natural_width_is_the_longer_of_header_and_cells():
    assert natural_width("Hit rate", pd.Series(["94.4%"])) == round(8 * CHAR_PX + CELL_PAD_PX)
    assert natural_width("Run", pd.Series(["a" * 40, "b"])) == round(40 * CHAR_PX + CELL_PAD_PX)


def test_a_table_that_fits_keeps_its_natural_widths():
    small = pd.DataFrame({"Model": ["coder-7b"], "Hit rate": ["72.8%"]})
    assert fit_widths(small) == {}
    assert _with_widths(small, None) == {}


def test_a_wide_table_fits_and_the_long_text_gives_way():
    widths = fit_widths(REPORT)
    assert set(widths) == set(REPORT.columns)
    assert sum(widths.values()) <= TABLE_WIDTH_PX
    assert min(widths.values()) >= 50
    natural = {c: natural_width(c, REPORT[c]) for c in REPORT.columns}
    assert widths["Report line"] < natural["Report line"] / 4  # cut with an ellipsis
    assert widths["Change"] == natural["Change"]  # a short column keeps its width
    assert widths["Model"] >= natural["Model"] - 1
    # fewer columns: the proportional share, every short column whole, the text the rest
    three = REPORT[["Model", "Status", "Report line"]]
    w3 = fit_widths(three, budget_px=400)
    assert w3["Model"] == natural["Model"] and w3["Status"] == natural["Status"]
    assert 400 - 2 <= sum(w3.values()) <= 400


def test_widths_a_page_sets_are_kept_and_counted():
    config = _with_widths(REPORT, {"Report line": {"width": 300, "help": "the email's line"},
                                   "Source": None, "Scope": "Cache scope"})
    assert config["Report line"] == {"width": 300, "help": "the email's line"}
    assert config["Source"] is None  # hidden stays hidden
    assert config["Scope"]["label"] == "Cache scope" and isinstance(config["Scope"]["width"], int)
    shown = [c for c in REPORT.columns if c != "Source"]
    assert sum(config[c]["width"] for c in shown) <= TABLE_WIDTH_PX
    assert all(config[c]["width"] >= min(MIN_COLUMN_PX, natural_width(c, REPORT[c]))
               for c in shown)


def test_run_bars_wrap_long_labels_and_cost_ticks_do_not_crowd():
    runs = pd.DataFrame({
        "label": ["release day on gpu-a1, fix: timestamp at the end",
                  "release day on gpu-a1, as recorded (timestamp on top)"],
        "hit_rate": [0.728, 0.313], "cost_without_cache": [0.0484, 0.0483],
        "cost_with_cache": [0.0223, 0.0371]})
    assert figures.wrap_label(runs["label"][0]) == "release day on gpu-a1, fix:<br>timestamp at the end"
    assert all(len(line) <= 28 for lab in runs["label"]
               for line in figures.wrap_label(lab).split("<br>"))
    cost = figures.run_cost_bars(runs, "USD")
    assert cost.layout.xaxis.nticks == 4 and cost.layout.xaxis.tickprefix == "&#36;"  # drawn as $ (plotly_text: a $ is never TeX)
    assert cost.layout.xaxis.tickformat == ",.3f"
    assert cost.layout.legend.y == 1.0  # above the plot, not over the ticks
    assert list(cost.data[0].y) == [figures.wrap_label(v) for v in runs["label"]]
    assert figures.run_cost_bars(runs.assign(cost_without_cache=[12.0, 11.0]), "USD"
                                 ).layout.xaxis.tickformat == ",.2f"
