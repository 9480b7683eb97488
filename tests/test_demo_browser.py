"""First contact (issue 14): the demo database in a real headless Chromium at 1400 px.

Every page of the router opens on the demo (built now, so the default range shows it) and
shows no exception box; every chart has data in the default range (no "no data" figure); no
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

pytestmark = [pytest.mark.browser, pytest.mark.timeout(1800)]  # builds the whole demo first

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


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from prefixscope.cli.demo import build_demo

    path = tmp_path_factory.mktemp("demo-browser") / "demo.duckdb"
    report = build_demo(str(path))
    return str(path), report


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
    assert re.search(r"coder-7b · whole range.*?Latest 1h window: \S+%\s*ALERT", texts["overview"],
                     re.S), texts["overview"][:2000]
    # the regression on Overview without a click: the banner and the daily strip from day 5
    assert f"coder-7b below 50.0% since {release_day}" in texts["overview"]
    strip = texts["overview"].split("Daily status", 1)[1].split("coder-7b", 1)[1]
    assert strip.split("Prefix-cache hit rate", 1)[0].count("ALERT") == 3, strip[:600]
    assert f"Showing {release_day}, the day the latest alert began" in texts["alerts"]
    assert "ALERT" in texts["alerts"] and f"Daily report {release_day}" in texts["alerts"]
    assert f"coder-7b: cost since {release_day}" in texts["savings"]
    assert re.search(r"coder-7b\s+on gpu-a1", texts["alerts"])  # the email's instance line
    assert len(list(SHOTS.glob("*.png"))) == len(ds.page_entries())
