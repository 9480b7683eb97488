"""The dashboard in a real headless Chromium: every page of the router's PAGES list opens, finishes
running, shows no exception box and no error alert, and is saved as a screenshot.

Screenshots go to ``$PREFIXSCOPE_SCREENSHOT_DIR`` when set, else to the test's tmp dir.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import dashboard_support as ds

pytestmark = pytest.mark.browser

ERROR_SELECTORS = ('[data-testid="stException"]', '[data-testid="stAlertContentError"]')


@pytest.fixture(scope="module")
def real_db(tmp_path_factory) -> str:
    return ds.build_real_db(tmp_path_factory.mktemp("browser") / "real.duckdb")


@pytest.fixture
def browser(tmp_path):
    with ds.chromium(tmp_path / "chromium-profile") as context:
        yield context


def test_every_page_renders_in_chromium(real_db, browser, tmp_path):
    shots = Path(os.environ.get("PREFIXSCOPE_SCREENSHOT_DIR") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    entries = ds.page_entries()
    assert entries, "the router lists no page"
    failures: list[str] = []
    with ds.dashboard_server(real_db, log_path=tmp_path / "server.log") as url:
        page = browser.new_page()
        console_errors: list[str] = []
        page.on("pageerror", lambda exc: console_errors.append(str(exc)))
        for i, (rel, title, _icon) in enumerate(entries):
            page.goto(f"{url}/{ds.page_url_path(rel, first=(i == 0))}", wait_until="domcontentloaded")
            ds.wait_for_streamlit(page)
            stem = Path(rel).stem
            ds.screenshot_whole_page(page, shots / f"{i:02d}-{stem}.png")
            if page.locator("h1").count() == 0:
                failures.append(f"{rel} ({title}): no heading rendered")
            for sel in ERROR_SELECTORS:
                boxes = page.locator(sel)
                for k in range(boxes.count()):
                    failures.append(f"{rel}: {sel}: {boxes.nth(k).inner_text()[:500]}")
        assert not console_errors, console_errors
    assert not failures, "\n".join(failures)
    assert len(list(shots.glob("*.png"))) == len(entries)
