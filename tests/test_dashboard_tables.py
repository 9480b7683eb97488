"""Issue 14, "numbers that do not move under you": every table of every page reads the same way,
and every time chart places a window at the same x.

The table rules live in ``prefixscope.dashboard.downloads.table_frame`` (human column names,
counts with thousands separators, ``—`` for a missing value, one percent format); the walk below
opens every page of the router through Streamlit's AppTest on the demo database (built now, as
``make demo`` does, so the default range shows it) and on the real vLLM captures, and checks
every ``st.dataframe`` each page draws.
"""

from __future__ import annotations

import re

import pandas as pd
import pytest

from prefixscope.dashboard import figures
from prefixscope.dashboard.downloads import csv_bytes, human_column, table_frame
from tests import dashboard_support as ds

ALL_PAGES = [p[0] for p in ds.page_entries()]
#: A column name a person reads: no "_", first letter not lower case ("Hit rate", "TTFT (ms)").
HUMAN_NAME = re.compile(r"^[^a-z_][^_]*$")
#: Text of a leaked missing value.
LEAK = re.compile(r"^(none|nan|nat|null|<na>)$", re.I)
#: THE percent format: one decimal (fmt_pct); "pp" changes likewise.
PERCENT = re.compile(r"-?\d[\d,]*\.\d%")
ANY_PERCENT = re.compile(r"-?\d[\d,.]*%")
#: A bare count of 4+ digits without separators (ids and days excepted below).
BARE_COUNT = re.compile(r"^-?\d{4,}$")
T0 = 1795860000.0  # 2026-11-28T10:00:00Z


# --- the pure rules -------------------------------------------------------------------------


def test_store_columns_read_as_words():
    assert human_column("prompt_tokens") == "Prompt tokens"
    assert human_column("run_id") == "Run"
    assert human_column("request_id") == "Request id"
    assert human_column("ttft_ms") == "TTFT (ms)"
    assert human_column("hit rate") == "Hit rate"
    assert human_column("p90_ms") == "P90 ms"
    assert human_column("GPU blocks") == "GPU blocks"
    assert human_column("kv usage") == "KV usage"


def test_table_frame_formats_counts_and_missing_values():
    df = pd.DataFrame({
        "model": ["a", None], "requests": [1234567, 3], "tokens": [608000.0, float("nan")],
        "mean_s": [1.5, 2.25], "ok": [True, False], "note": ["None", "nan"],
        "when": [pd.Timestamp("2026-11-28 10:00:05"), pd.NaT],
        "Int": pd.array([5000, None], dtype="Int64"),
    })
    out = table_frame(df)
    assert list(out.columns) == ["Model", "Requests", "Tokens", "Mean s", "Ok", "Note", "When",
                                 "Int"]
    assert out.to_dict("records") == [
        {"Model": "a", "Requests": "1,234,567", "Tokens": "608,000", "Mean s": "1.50",
         "Ok": "yes", "Note": "—", "When": "2026-11-28 10:00:05 UTC", "Int": "5,000"},
        {"Model": "—", "Requests": "3", "Tokens": "—", "Mean s": "2.25", "Ok": "no",
         "Note": "—", "When": "—", "Int": "—"},
    ]
    # the download is the table as shown: the same headers, the same cells
    assert csv_bytes(out).decode().splitlines()[0] == "Model,Requests,Tokens,Mean s,Ok,Note,When,Int"


def test_two_columns_with_one_name_are_refused():
    with pytest.raises(ValueError, match="two columns named 'Run'"):
        table_frame(pd.DataFrame({"run_id": ["x"], "Run": ["y"]}))


# --- every table of every page ---------------------------------------------------------------


def _table_problems(at, page: str) -> list[str]:
    problems = []
    for k, table in enumerate(at.dataframe):
        df = table.value
        where = f"{page} table {k}"
        for col in df.columns:
            if not HUMAN_NAME.match(str(col)):
                problems.append(f"{where}: column {col!r} is not a human name")
        for col in df.columns:
            for v in df[col].tolist():
                if v is None or (isinstance(v, float) and v != v) or v is pd.NaT:
                    problems.append(f"{where}: {col}: a missing value drawn as {v!r}")
                    continue
                text = str(v)
                if LEAK.match(text.strip()) or re.search(r"\b(None|nan|NaN|NaT)\b", text):
                    problems.append(f"{where}: {col}: leaked {text!r}")
                # the report line quotes the email: whole percents cut toward zero
                # (docs/metrics.md#tables-and-numbers-on-the-dashboard)
                for m in ([] if col == "Report line" else ANY_PERCENT.finditer(text)):
                    if not PERCENT.fullmatch(m.group(0)):
                        problems.append(f"{where}: {col}: percent {m.group(0)!r} not in the one "
                                        "format (one decimal)")
                if (BARE_COUNT.match(text) and not str(col).lower().endswith("id")
                        and str(col) not in ("Day",)):
                    problems.append(f"{where}: {col}: count {text!r} without separators")
        problems += _width_problems(table, where)
    return problems


def _width_problems(table, where: str) -> list[str]:
    """Issue 14 (session 5, c): the visible columns of a table fit a 1400 px window without
    scrolling sideways: their widths (set by the page or by show_table's fit_widths; a column
    without one at its natural width) add up to at most TABLE_WIDTH_PX."""
    import json

    from prefixscope.dashboard.downloads import TABLE_WIDTH_PX, natural_width

    config = json.loads(table.proto.columns or "{}")
    named = {"small": 75, "medium": 200, "large": 400}
    total = 0
    for col in table.value.columns:
        cfg = config.get(str(col), {})
        if cfg.get("hidden"):
            continue
        width = cfg.get("width")
        total += named.get(width, width) if width else natural_width(col, table.value[col])
    if total > TABLE_WIDTH_PX:
        return [f"{where}: columns {total} px wide, more than {TABLE_WIDTH_PX} px: "
                f"{list(table.value.columns)}"]
    return []


@pytest.fixture
def demo(demo_build):
    """The run's one demo build (tests/conftest.py ``demo_build``) and its release day."""
    return demo_build.path, demo_build.release_day


@pytest.fixture(scope="module")
def real_db(tmp_path_factory) -> str:
    return ds.build_real_db(tmp_path_factory.mktemp("tables") / "real.duckdb")


def _open(db: str, page: str, release_day: str | None = None):
    at = ds.run_app(db, None, timeout_s=180)
    if page.endswith("alerts.py") and release_day:
        at.query_params["day"] = release_day
        at.query_params["tz"] = "UTC"
    ds.switch(at, page)
    at.run()
    return at


def test_every_table_of_every_demo_page_reads_for_people(demo, use_db):
    db, release_day = demo
    use_db(db)
    problems, without = [], []
    for page in ALL_PAGES:
        at = _open(db, page, release_day)
        ds.assert_clean(at)
        if not at.dataframe:
            without.append(page)
        problems += _table_problems(at, page)
    assert not problems, "\n".join(problems)
    # every page of the demo draws a table, but Invariants: its drill-down lists violations,
    # and the demo's gateway runs have none; and Residency: the production week has no KV
    # events or residency histograms (the vLLM CPU capture's are its own run's, not shown on
    # production), and the page says why for each dash
    assert without == ["views/invariants.py", "views/residency.py"]


def test_every_table_on_the_real_captures_reads_for_people(real_db, use_db):
    use_db(real_db)
    problems = []
    for page in ALL_PAGES:
        at = ds.run_app(real_db, page, setup=lambda a: a.radio(key="filter_range").set_value("all"),
                        timeout_s=120)
        ds.assert_clean(at)
        problems += _table_problems(at, page)
    assert not problems, "\n".join(problems)


def test_alerts_status_cells_are_coloured_text(demo, use_db):
    db, release_day = demo
    at = _open(use_db(db), "views/alerts.py", release_day)
    ds.assert_clean(at)
    report = at.dataframe[0]
    assert "ALERT" in set(report.value["Status"])
    # a Styler reached the browser: the status column carries its colour as CSS, no emoji
    css = str(report.proto)
    assert "#cf222e" in css and "font-weight: bold" in css


# --- window placement ------------------------------------------------------------------------


def _xs(fig) -> list[str]:
    return [str(pd.Timestamp(x)) for x in fig.data[0].x]


def test_every_time_chart_places_a_window_at_its_middle():
    w = 3600.0
    starts = [T0, T0 + w, T0 + 2 * w]
    base = pd.DataFrame({"window_start_s": starts, "model": "m", "instance": "a",
                         "hit_tokens": [1, 2, 3], "query_tokens": [2, 4, 6],
                         "hit_rate": [0.5, 0.5, 0.5], "restarts": 0, "per_s": [1.0, 2.0, 3.0]})
    scoped = base.assign(scope="TENANT", cached_tokens=base["hit_tokens"],
                         reported_prompt_tokens=base["query_tokens"],
                         saved_prefill_tokens=base["hit_tokens"])
    charts = {
        "hit rate": figures.hit_rate_over_time(base, by=("model",), window_s=w),
        "token rate": figures.window_lines(base, series={"per_s": ""}, window_s=w, by=("model",),
                                           title="t", y_title="y"),
        "tokens": figures.tokens_over_time(base, by=("model",), window_s=w),
        "per request": figures.request_hit_rate_over_time(
            base.assign(requests=1, p10=0.1, p25=0.2, p50=0.5, p75=0.7, p90=0.9), None,
            window_s=w),
        "savings": figures.savings_over_time(base.assign(saved=1.0, currency="USD"), window_s=w),
        "scope rate": figures.scope_rate_figure(scoped, series="scope", title="t", window_s=w),
        "scope saved": figures.scope_saved_figure(scoped, window_s=w),
        "rejections": figures.rejection_reasons_figure(
            base.assign(reason="model", rejects=1, lost_candidate_tokens=5), window_s=w),
        "misses": figures.miss_breakdown_figure(
            base.assign(ordinary_miss_requests=1, version_mismatch_requests=1,
                        other_reject_requests=0), window_s=w),
    }
    middles = [str(pd.Timestamp(s + w / 2, unit="s")) for s in starts]
    assert middles[0] == "2026-11-28 10:30:00"
    for name, fig in charts.items():
        assert _xs(fig) == middles, name
    # bars are centred on the middle: the pair of the tokens chart meets there, a lone bar's
    # default alignment is its centre
    tokens = charts["tokens"]
    assert tokens.data[0].offset == -tokens.data[0].width and tokens.data[1].offset == 0.0
    assert charts["savings"].data[0].offset is None


def test_overview_charts_of_one_window_share_their_x(demo, use_db):
    db, _ = demo
    at = ds.run_app(use_db(db), "views/overview.py", timeout_s=180)
    ds.assert_clean(at)
    specs = ds.charts(at)
    rate = specs["Prefix-cache hit rate per 1h window"]["data"]
    traffic = specs["Prompt tokens per second per 1h window"]["data"]
    kv = specs["KV-cache usage per 1h window"]["data"]

    def xs(traces, name):
        return ds.values(next(t for t in traces if t["name"].startswith(name))["x"])

    series = rate[0]["name"]  # model / instance
    assert xs(rate, series) == xs(traffic, series)
    instance = series.split(" / ")[1]
    kv_x = set(xs(kv, instance))
    assert kv_x and kv_x <= set(xs(rate, series)) | set(x for t in rate for x in ds.values(t["x"]))
    middles = [pd.Timestamp(x) for x in xs(rate, series)]
    assert middles and all((t.minute, t.second) == (30, 0) for t in middles), middles[:3]
