"""First contact (issue 14): the demo database in a real headless Chromium at 1400 px.

Every page of the router opens on the demo (built once per run at 00:30 UTC today, so the default range shows it) and
shows no exception box; every chart has data in the default range (no "no data" figure) and
no chart title (or subplot title) is cut at the chart's edge; no
``None`` / ``nan`` text; Overview says ALERT for coder-7b and the Alerts page does for the
release day (the banner and the daily strip; the Alerts page opens on it by itself), and
Savings says what the regression cost. Screenshots go to ``out/screenshots/demo/``
(gitignored; CI keeps them).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import dashboard_support as ds

pytestmark = [pytest.mark.browser, pytest.mark.timeout(1800)]  # the first test may build the whole demo

ERROR_SELECTORS = ('[data-testid="stException"]', '[data-testid="stAlertContentError"]')
SHOTS = ds.ROOT / "out" / "screenshots" / "demo"
#: "None" / "nan" as words anywhere in the page text (a leaked missing value).
LEAK = re.compile(r"\b(None|nan|NaN)\b")
#: Points of each Plotly chart on the page, and whether it is a "no data" figure.
CHART_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(e => ({
    // points Plotly computed and drew (calcdata: the data arrays may be binary-encoded)
    points: (e.calcdata || []).reduce((n, c) => n + c.filter(p => p && (
        Number.isFinite(p.y) || Number.isFinite(p.x) || Number.isFinite(p.s) ||
        Number.isFinite(p.med))).length, 0),
    title: ((e.layout || {}).title || {}).text || '',
    empty: ((e.layout || {}).annotations || []).some(a => /^no /.test(a.text || '')),
}))"""
#: Titles (the figure's and its subplots') drawn past the left or right edge of their chart
#: (SVG clips them: "... · agent-32b (whiskers: 5th and" at 1400 px, session 8).
CUT_TITLES_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(e => {
    const svg = e.querySelector('.main-svg'); if (!svg) return [];
    const box = svg.getBoundingClientRect();
    return Array.from(e.querySelectorAll('.gtitle, .annotation-text')).filter(t => {
        const r = t.getBoundingClientRect();
        return r.width > 0 && (r.right > box.right + 1 || r.left < box.left - 1);
    }).map(t => `${t.textContent.slice(0, 90)} (${Math.round(t.getBoundingClientRect().right -
                                                   box.right)} px past the edge)`);
})"""


@pytest.fixture
def demo(demo_build):
    """The run's one demo build (tests/conftest.py ``demo_build``: 00:30 UTC today, so the
    default 7d range shows the week)."""
    return demo_build.path, demo_build.report


@pytest.fixture
def browser(tmp_path):
    with ds.chromium(tmp_path / "chromium-profile") as context:
        yield context


def _check_page(page, name: str, failures: list[str]) -> str:
    for sel in ERROR_SELECTORS:
        boxes = page.locator(sel)
        for k in range(boxes.count()):
            failures.append(f"{name}: {sel}: {boxes.nth(k).inner_text()[:300]}")
    for chart in page.evaluate(CHART_JS):
        if chart["empty"] or chart["points"] == 0:
            failures.append(f"{name}: chart '{chart['title']}' has no data in the default range")
    for cut in page.evaluate(CUT_TITLES_JS):
        failures.append(f"{name}: chart title cut at {page.viewport_size['width']} px: {cut}")
    text = page.locator('[data-testid="stMain"]').inner_text()
    for m in LEAK.finditer(text):
        failures.append(f"{name}: leaked '{m.group(0)}' in: ...{text[max(0, m.start() - 60):m.end() + 60]!r}")
    return text


def test_every_demo_page_tells_the_story(demo, browser, tmp_path):
    db, report = demo
    release_day = re.search(r"\(day 5, (\d{4}-\d\d-\d\d): the release", next(
        s for s in report.steps if "the week is in the database" in s)).group(1)
    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in SHOTS.glob("*.png"):
        old.unlink()
    failures: list[str] = []
    texts: dict[str, str] = {}
    with ds.dashboard_server(db, log_path=tmp_path / "server.log") as url:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        for i, (rel, title, _icon) in enumerate(ds.page_entries()):
            path = ds.page_url_path(rel, first=(i == 0))
            # the Alerts page opens without ?day= on the day the latest alert began: day 5
            page.goto(f"{url}/{path}", wait_until="domcontentloaded")
            ds.wait_for_streamlit(page, timeout_s=180)
            page.wait_for_timeout(1000)  # Plotly draws after Streamlit settles
            ds.screenshot_whole_page(page, SHOTS / f"{i:02d}-{Path(rel).stem}.png")
            texts[Path(rel).stem] = _check_page(page, title, failures)
        assert not errors, errors
    assert not failures, "\n".join(failures)
    assert re.search(r"coder-7b · whole range.*?Latest 1h window\b.*?: \S+%\s*ALERT", texts["overview"],
                     re.S), texts["overview"][:2000]
    # the regression on Overview without a click: the banner and the daily strip from day 5
    assert f"coder-7b below 50.0% since {release_day}" in texts["overview"]
    assert "): the days before still count in it." in texts["overview"]  # days 1-4 are before
    strip = texts["overview"].split("Daily status", 1)[1].split("coder-7b", 1)[1]
    assert strip.split("Prefix-cache hit rate", 1)[0].count("ALERT") == 3, strip[:600]
    assert f"Showing {release_day}, the day the latest alert began" in texts["alerts"]
    assert "ALERT" in texts["alerts"] and f"Daily report {release_day}" in texts["alerts"]
    assert f"coder-7b: cost since {release_day}" in texts["savings"]
    assert re.search(r"coder-7b\s+on gpu-a1", texts["alerts"])  # the email's instance line
    assert len(list(SHOTS.glob("*.png"))) == len(ds.page_entries())


#: Elements under ``root`` whose text is cut: wider content than box and the overflow hidden
#: or ellipsised (Streamlit cuts st.metric labels this way).
CUT_JS = """(root) => Array.from(root.querySelectorAll('*')).filter(e => {
    const s = getComputedStyle(e);
    return e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1 && (e.innerText || '').trim()
        && (s.overflowX !== 'visible' || s.textOverflow === 'ellipsis');
}).map(e => `${e.innerText.trim().slice(0, 80)} (${e.scrollWidth} > ${e.clientWidth} px)`)"""


def _open(page, url: str, path: str, shot: str) -> None:
    page.goto(f"{url}/{path}", wait_until="domcontentloaded")
    ds.wait_for_streamlit(page, timeout_s=180)
    page.wait_for_timeout(500)
    SHOTS.mkdir(parents=True, exist_ok=True)
    ds.screenshot_whole_page(page, SHOTS / shot, width=page.viewport_size["width"])


def test_alerts_report_lines_are_shown_whole_at_1400_px(demo, browser, tmp_path):
    """The daily report's sentence of every line is on the page whole and wrapped (the grid,
    which cut it, hides that column), nothing in the lines' block is cut."""
    from prefixscope.alerts.daily import build_daily_report
    from prefixscope.core.config import load_settings
    from prefixscope.store import db as store_db

    db, report = demo
    day = re.search(r"\(day 5, (\d{4}-\d\d-\d\d): the release", next(
        s for s in report.steps if "the week is in the database" in s)).group(1)
    with store_db.reader(db) as con:
        import time
        from datetime import date

        lines = build_daily_report(con, day=date.fromisoformat(day), tz="UTC",
                                   cfg=load_settings().alerts, now_unix_s=time.time()
                                   ).as_dict()["lines"]
    assert len(lines) == 4 and max(len(ln["text"]) for ln in lines) > 100
    with ds.dashboard_server(db, log_path=tmp_path / "server.log") as url:
        page = browser.new_page()
        _open(page, url, f"alerts?day={day}&tz=UTC", "polish-alerts-1400.png")
        block = page.locator(".st-key-alerts_report_lines")
        assert block.count() == 1
        text = " ".join(block.inner_text().split())
        for ln in lines:
            assert " ".join(ln["text"].split()) in text, (ln["text"], text)
        assert re.search(r"ALERT\s+coder-7b on gpu-a1: [\d,]+ of [\d,]+ prompt tokens", text), text
        assert block.evaluate(CUT_JS) == []
        box = block.bounding_box()
        main = page.locator('[data-testid="stMainBlockContainer"]').bounding_box()
        assert box["x"] >= main["x"] and box["x"] + box["width"] <= main["x"] + main["width"]
        # the grid no longer has the column that was cut (the download still has it)
        headers = page.locator('[data-testid="stDataFrame"]').first.locator(
            '[role="columnheader"]').all_text_contents()  # the grid's accessible table
        assert headers[:5] == ["Model", "Scope", "Instance", "Status", "Hit rate"], headers


@pytest.mark.parametrize("width", [1400, 1280])
def test_breakers_kpi_labels_are_not_cut(demo, browser, tmp_path, width):
    """No KPI label of the Breakers page is cut at 1400 or 1280 px; the suggested layout's
    KPI says its full wording in its help."""
    db, _ = demo
    with ds.dashboard_server(db, log_path=tmp_path / "server.log") as url:
        page = browser.new_page()
        page.set_viewport_size({"width": width, "height": 900})
        _open(page, url, "breakers", f"polish-breakers-{width}.png")
        labels = page.locator('[data-testid="stMetricLabel"]')
        assert [" ".join(t.split()) for t in labels.all_inner_texts()] == [
            "Hit rate as recorded", "With all fixes", "Missed prompt tokens", "Requests"]
        for k in range(labels.count()):
            assert labels.nth(k).evaluate(CUT_JS.replace("root.querySelectorAll('*')",
                                                         "[root, ...root.querySelectorAll('*')]")
                                          ) == [], labels.nth(k).inner_text()
        help_icon = page.locator('[data-testid="stMetric"]').nth(1).locator(
            '[data-testid="stTooltipHoverTarget"], [data-testid="stTooltipIcon"]').first
        help_icon.hover()
        tip = page.locator('[data-testid="stTooltipContent"]')
        tip.wait_for(timeout=10_000)
        assert tip.inner_text().startswith("If all fixable breakers were fixed: the suggested")
